"""Study tables from metrics files: one row per run, one per cell, and the answers drawn from them.

Files are validated against the metrics schema when read (`trainscale.analysis.metrics_tables`); a
file that is not valid JSON or breaks the schema is listed as invalid, never silently dropped, and
never stops the rest. Per-run figures (epoch times, throughput, ...) are defined in
`trainscale.measure.metrics`; the per-cell figures of scaling.csv are defined here, each computed
once (in `trainscale.analysis.cells` and, for communication.csv, `trainscale.analysis.comm_model`):

- cell: every matrix value but the repeat (strategy, model, dataset, scale, batch_size,
  batch_mode, workers, nodes, precision). N = world size = workers × nodes.
- statistics over repeats: mean, sample standard deviation (n − 1) and the 95% confidence
  interval mean ± t(0.975, n − 1) · std / √n (Student's t) of each metric over the cell's ok
  runs that have it (failed, oom, timeout and diverged runs are counted, never averaged); with
  one such run the std and CI are empty. Throughput's CI is the next bullet's; its Student's t
  interval stays in `throughput_ci95_repeats` and its std in `throughput_std`.
- confidence interval (of throughput, `throughput_ci95`, from steps and repeats): a two-level
  random-effects model of y = ln X of run r of cell c, y_cr = μ_c + a_cr + e_cr: a_cr the
  run's own level (a fresh process, placement, a busy neighbour), variance σ_a², and e_cr the
  sampling error of the run's throughput, variance w_cr = var(b) / (k · mean(b)²) (the delta
  method) from k blocks b of its steady epochs: the record's batch means of rank 0's step
  times (`step_batch_means`, up to 8 an epoch), merged into blocks of at least 10 consecutive
  steps (two an epoch at least; consecutive steps are correlated, blocks this long nearly
  independent: the method of batch means with long batches, not an effective sample size),
  and scaled by the epoch's wall time over its step times, so that the gaps between steps
  (loader waits, copies), which the throughput's wall time holds and step times do not, are
  spread over its steps (their variation within an epoch is not seen, between epochs it is).
  The run-to-run variance is pooled only where alike: each cell's stratum is its framework
  family (torch, tensorflow, horovod, deepspeed) × world size × device kind (`stratum`), and
  the strata are pooled unless Bartlett's test of equal variances tells them apart at 1 %;
  where it does, they are cut in two where two variances fit best (sorted by variance) and
  each side tested again (`variance_pool`, `pool_strata`). Within a pool: s² = Σ_c Σ_r (y_cr −
  ȳ_c)² / ν, ν = Σ_c (n_c − 1), and σ_a² = max(0, s² − Σ_c (n_c − 1) w̄_c / ν), what the
  blocks do not account for; w̄_c is the mean of the cell's w_cr; the a and e are independent
  and normal on the log scale. Then Var(ȳ_c) = (σ_a² + w̄_c) / n_c with Satterthwaite's
  degrees of freedom ν_c = Var² / ((s²/n_c)² / ν + (w̄_c/n_c)² / Σ_r (k_r − 1)) (the s²
  term dropped where σ_a² came out 0), floored, 1 at least, and
  the interval is exp(ȳ_c ± h), h = t(0.975, ν_c) · √Var(ȳ_c); the table gives it as the
  half-width x̄ · (e^h − 1), the wider side, about the mean x̄ (`interval_df` = ν_c,
  `between_run_var` = σ_a², `within_run_var` = w̄_c, `pooled_run_var` = s², `pooled_df` = ν,
  `interval_pool` the cells pooled, `throughput_log_mean` = ȳ_c, `throughput_log_var` =
  Var(ȳ_c)). A cell of one ok run gets an interval only where its pool has 4 df or more;
  otherwise it is "one run: no interval" (`interval_method`), shown and never called slower.
  Every figure that is a fixed multiple of throughput or of its inverse within a cell
  (throughput per worker, tokens/s) takes the same relative half-width. Cells whose records
  lack batch means (made before them; tf-ps, whose runs see no step times) stay out of the
  pools and keep Student's t over their repeats, `interval_method` "repeats only (records
  without step times)"; the others say "steps and repeats". Simulated (tests/test_interval.py:
  3,000 studies of the default shape, 26 cells, 2 repeats, 2 steady epochs of 22 or 89 steps
  whose step times are AR(1) with lag-1 correlation 0.5): the intervals cover 95.8 %; with half
  the cells at 1 % run-to-run spread and half at 6 %, the halves in two strata, 96.5 % and
  94.3 % (one pool over both: 99.97 % and 87 %). Its limit: a stratum of 1-2 cells whose
  spread differs cannot show it (Bartlett's test has no power there) and is pooled with the
  others: the default study's 8 strata, the 6 % ones among 1 % ones, cover 87 %. Anchors:
  Horovod's synthetic benchmark and tf_cnn_benchmarks report mean ± 1.96σ over the
  iterations of one run (the within-run part alone); MLPerf repeats whole runs (the
  between-run part); the model uses both.
- comparison with the best (`could_be_fastest`, `mcb_low`, `mcb_high`, `slower`): per
  panel of the ranking (model, dataset and N; trainscale.analysis.best), every cell at once:
  with y_i the cell's ȳ in the panel's unit (+ ln seq_len on token data) and s_ij =
  √(Var(ȳ_i) + Var(ȳ_j)), the simultaneous 95% intervals of θ_i = μ_i − max_{j≠i} μ_j (the
  cell's log throughput minus the best of the others), [min_{j≠i} (y_i − y_j − c_ij s_ij),
  min_{j≠i} (y_i − y_j + c_ij s_ij)] (Edwards & Hsu's unconstrained MCB). c_ij is the
  studentized range's critical value q(0.95; k, ν_ij) / √2 for the panel's k cells with an
  interval, at the pair's degrees of freedom floored (Satterthwaite's with the one s² two
  cells of a pool share, Welch–Satterthwaite's across pools: Games–Howell's way with unequal
  variances and df; scipy.stats.studentized_range, cached by k and ν). The answer is a set:
  a cell whose interval reaches 0 or above could be the fastest ("at 95 %, the fastest is one
  of {a, b}"), one whose interval lies below 0 is slower than the fastest; `distinguishable`
  equals `slower`. Why not Dunnett's one-sided value (Hsu's constrained MCB): that says "not
  the best", which a cell tied with the best also is; read as "slower" it calls some cell of
  14 equal ones slower in 37 % of simulated panels, the old pairwise verdict (each cell
  against the observed fastest at 5 %) in 68 %. This one, in 2.5 % (tests/test_best.py:
  3,000 default studies of 28 equal cells, two panels of 14; ≤ 5 % asserted). Its price is
  power: with 2 repeats a true 10 % difference is called in 34 % of panels; in a panel like
  the default study's (14 cells, 12 % run-to-run spread) a cell 30 % slower is called slower
  in 28 % of studies, 46 % slower in 93 %, 60 % or more always. A cell without an interval
  could be the fastest and is never slower; logical-device cells are neither.
- what a study can tell (`mdd_rel`, `repeats_for_5pct`, `repeats_for_2pct`): per panel
  (trainscale.analysis.settle), its minimum detectable difference, the shortfall from the best
  1 − e^(−δ) called slower in 80 % of studies, δ = (c(k, ν) + t(0.80, ν)) · √(2 V) with V and
  ν the median Var(ȳ) and df of the panel's cells; and the fewest repeats per cell that would
  bring it to 5 % and to 2 % (V scaled by n₀ / n for the median cell's n₀ repeats, ν grown
  by one for each cell of its pool and repeat; none beyond 100). A cell that could be the
  fastest but is not it reads "not told apart: this study resolves differences of ≥ 18 %;
  6 repeats would resolve ≥ 5 %": what the study can tell, not post-hoc power (which treats
  the observed difference as the true one).
- equivalent (`equivalent`): a cell and its panel's best differ by less than config
  `report.equivalence` (default 2 %) by two one-sided tests at 5 %: the 90 % interval of
  their log difference, d ± t(0.95, ν) · s, within ±ln(1 + margin) (ν the pair's df); never
  from a point estimate.
- first-epoch overhead: first_epoch_seconds − steady_epoch_seconds of each run (what epoch 1's
  warm-up costs), then averaged like any other metric.
- baseline X(1), t1: the cell with the same strategy, model, dataset, scale, batch_size,
  batch_mode and precision and N = 1 (workers = nodes = 1). Strategies are never mixed: torch
  (one plain process) and torch-ddp are different strategies, so torch-ddp at N workers is
  compared with torch-ddp at N = 1. Without an ok baseline the values below are empty and
  `baseline_note` says why.
- speedup: S(N) = X(N) / X(1), X = mean steady throughput (samples/s over all workers).
- tokens/s: on token data (a GPT's windows of seq_len ids) a sample is one window, so
  tokens_per_second = throughput × seq_len; the report and summary give a token cell's
  throughput in tokens/s (speedup and efficiency are the same ratios in either unit).
- strong-scaling efficiency: E = t1 / (N · tN), t = mean steady epoch seconds; for batch_mode
  global, where the global batch is split over the workers and the work per epoch stays the same.
- weak-scaling efficiency: E = X(N) / (N · X(1)); for batch_mode per_worker, where every worker
  keeps its batch and the global batch grows with N.
- speedup_vs_single: X(N) / X1*, X1* the highest mean throughput of any strategy at N = 1 with
  the same model, dataset, scale, batch_size, batch_mode and precision (`single_best_strategy`).
- time to accuracy: mean over the cell's ok runs that reached target_accuracy
  (`time_to_accuracy_seconds_n` of `ok` did).
- peak memory: mean over the cell's ok runs of the per-process peak (max over ranks), i.e. per
  worker: host resident set size, and allocated device memory on GPU.
- predicted peak memory (predicted_peak_bytes): the peak per rank predicted before any job by
  tracing one fake training step through the runner's own wrapping (docs/memory.md; config
  memory:), labelled a prediction, never a measurement; memory error (memory_error) =
  measured peak device bytes ÷ predicted − 1, per run where a device peak was measured, and
  its mean over the cell's runs. The reserved side (predicted_reserved_bytes: the allocated
  peak, the CUDA runtime and NCCL's buffers, what memory.check holds against the limit) and
  memory_error_reserved = NVML's peak for the process (peak_nvml_process_bytes) ÷ it − 1;
  the host (predicted_host_bytes, per rank) and host_memory_error = the ranks' peak RSS ÷ it −
  1. Each cell's: the mean over its runs. Measured so far on an H200 (bf16, seq_len 1024,
  batch 16, AdamW; the allocated peak) against the predictions of memory.VERSION 1: gpt2-124m
  under torch −8.1 %, gpt2-774m under torch-fsdp at one rank −3.3 %; the method since
  (docs/memory.md) predicts them +0.5 % and −3.1 % (not measured again on a GPU). TensorFlow
  and Keras cells predict model states only (no activations).
- data-wait share and input-bound: the mean over the cell's ok runs of metrics
  `data_wait_share` (steady epochs' data wait of the slowest rank over their seconds);
  `input_bound` when it is above `datawait.INPUT_BOUND_SHARE` (10 %): the input pipeline, not
  the workers, limits the cell.
- MFU (model FLOPs utilisation): the mean over the cell's ok runs of metrics `flops.mfu`, the
  run's achieved model FLOP/s (FLOPs of one training sample, counted, × throughput) over the
  peak FLOP/s of its devices at its precision: the vendor's datasheet figure, or on CPU a
  matrix multiply timed on the host ("measured peak"); for a GPT the count is also given by
  PaLM's analytic 6·N + 12·L·H·Q·T per token (trainscale.measure.flops defines each).
- fastest: per model, dataset and N, the ranking's first cell (the highest mean throughput in
  the data's unit: tokens/s on token data); the runner-up is the best cell of another
  strategy, `distinct` says whether it is slower (the comparison with the best), `could_be`
  names the cells that could be the fastest. Cells on logical CPU devices
  (`device.logical`) are never ranked: a code-path check. Predicted throughput
  (predictions.csv) is never ranked either.
- ranking: the report's first figure, strategies ranked by throughput. Per model, dataset
  and N, every cell with an ok run, sorted by mean steady throughput (tokens/s on token data),
  fastest first, with its 95% CI, each marked by the comparison with the best ("could be the
  fastest", "slower", "equivalent", "one run: no interval"), under each panel what it
  resolves; "behind" is 1 − x / x_f. scaling.csv carries the same verdicts per cell. A
  scaling table made before the model's columns gets Var(ȳ) from its Student's t CI ((ci /
  (t · x̄))², n − 1 df). Logical CPU devices are shown, not ranked (as in `fastest`); tf-ps
  carries its mark, asynchronous (trainscale.analysis.ranking).
  With config `report.rank_by: cost` the same figure ranks cost per million instead, the
  cheapest first, by the same comparison with the best (a run's cost is its cell's price
  times N / (x · u), so −log cost is log throughput + ln u shifted by the log price), and
  "dearer" is x / x_c − 1.
- device-hours per million (device_hours_per_million): N × 10⁶ / (X · u) / 3600 per run,
  X the steady throughput (samples/s, all workers) and u the units in a sample (seq_len tokens
  on token data, else 1 sample): the device-hours a million tokens or samples take. A device
  is a GPU, or on CPU a worker (its threads_per_worker threads). Averaged over the cell's ok
  runs with a 95% CI, as every metric; the Cost table's hours per million is it ÷ N.
- cost per million (cost_per_million): device-hours per million × the price of a device-hour
  (config `cost.device_hour`, in `cost.currency`): on CPU the cpu-core price × threads_per_worker;
  on a GPU the price of the one key that is a case-insensitive part of the record's
  device.name. A device that no key or several keys match has no cost (`price_note` says
  why; the report lists it among its warnings). Mean and 95% CI over ok runs.
- energy per million (kwh_per_million): the run's measured energy (device.energy_joules: NVML
  on GPUs over training; on CPU the RAPL package counters over the epochs, where the kernel
  exposes them under /sys/class/powercap and they are readable) ÷ (samples trained in all
  epochs × u) × 10⁶ / 3.6·10⁶ J per kWh. Absent where no run measured energy (no sensor, or
  RAPL not readable, as in most containers and VMs): never estimated. Mean and 95% CI.
- cheapest: per model and dataset over every N, the cell with the lowest mean cost per
  million (device-hours per million where no price applies); the summary names it beside the
  fastest cell where the two differ.
- communication model (communication.csv): for every DDP-family cell (torch-ddp, torch-fsdp,
  deepspeed-zero0..3) with N > 1, the predicted communication seconds per optimizer step
  t_comm = v · 2(N − 1)/N · S / B. S = gradient bytes (parameters × 4; × 2 for DeepSpeed in
  bf16/fp16, whose gradients are half precision). B = the bus bandwidth (busbw at t_p50) that
  the all-reduce benchmark measured for the cell's backend, workers and nodes, interpolated
  linearly in log2(size) at S. v = 1 for torch-ddp and ZeRO-0/1/2 (ZeRO-1/2's reduce-scatter
  plus all-gather move the bytes of one all-reduce); v = 1.5 for torch-fsdp and ZeRO-3, which
  all-gather the parameters for the forward and again for the backward and reduce-scatter the
  gradients. Assumptions: a ring algorithm, the gradient sent as one message of S bytes
  (smaller buckets reach lower busbw), one reduction per optimizer step, and no overlap of
  communication with computation (DDP overlaps its buckets with the backward, so it can beat
  the model).
- tensor parallelism in the communication model (torch-tp, torch-fsdp-tp, GPT models):
  t_comm = 2(tp − 1)/tp · V_tp / B + [dp > 1] 1.5 · 2(dp − 1)/dp · S_dp / B, with V_tp the
  activation traffic of one step over the tp group in all-reduce-equivalent bytes
  ((4L + 2.5)·A with sequence parallelism, (6L + 2)·A without, plus 3·b·T fp32 values for
  the loss on logits split by vocabulary; A = b·T·C activation bytes,
  trainscale.analysis.comm_model) and S_dp the FSDP
  gradient of params / tp × 4 bytes. B is read from the cell's benchmark at A bytes (and at
  S_dp); the tp group is smaller than the benchmark's world in torch-fsdp-tp (said in the
  row's note). TP's collectives cannot be switched off, so no exposed time is measured.
- measured step seconds: mean steady epoch seconds / optimizer steps per epoch, steps =
  (train samples // R) // per-worker batch, or the study's `steps_per_epoch` when smaller;
  R the data-parallel replicas: N, 1 for torch-pipeline, N / tp for tensor parallelism.
- communication share: t_comm / measured step seconds, the fraction of a step the model
  attributes to moving gradients (above 100 %: the benchmark's busbw is lower than training
  achieved, e.g. thanks to overlap).
- measured exposed communication: the mean over the cell's ok runs of metrics
  `communication.exposed_seconds_per_step` (step − the step with gradient synchronisation off)
  and of the no-sync step itself; exposed share = exposed / measured step seconds.
- network-bound efficiency: E_net = (t1/N) / (t1/N + steps · t_comm), t1 the steady epoch
  seconds of the same strategy at N = 1: the best scaling efficiency this network allows when
  computation scales perfectly and communication does not overlap it; compare with the
  measured efficiency beside it.
"""

from trainscale.analysis.cells import (
    BASELINE,
    CELL,
    METRICS,
    SINGLE,
    ci95,
    convergence_frame,
    scaling_frame,
    t975,
    with_axes,
)
from trainscale.analysis.comm_model import (
    COLLECTIVE_COLUMNS,
    COMM_COLUMNS,
    COMM_VOLUME,
    busbw_at,
    collectives_frame,
    communication_frame,
    failed_collectives,
    gradient_bytes,
    measured_collectives,
)
from trainscale.analysis.metrics_tables import (
    EPOCH_FIELDS,
    LEAD,
    default_jobs,
    epochs_frame,
    find_metrics,
    load,
    mp_context,
    read_tables,
    run_id,
    runs_frame,
)
from trainscale.analysis.ranking import fastest, rate
from trainscale.analysis.study import Study, study_name
from trainscale.analysis.summary import human, summary_text

__all__ = [
    "BASELINE",
    "CELL",
    "COLLECTIVE_COLUMNS",
    "COMM_COLUMNS",
    "COMM_VOLUME",
    "EPOCH_FIELDS",
    "LEAD",
    "METRICS",
    "SINGLE",
    "Study",
    "busbw_at",
    "ci95",
    "collectives_frame",
    "communication_frame",
    "convergence_frame",
    "default_jobs",
    "epochs_frame",
    "failed_collectives",
    "fastest",
    "find_metrics",
    "gradient_bytes",
    "human",
    "load",
    "measured_collectives",
    "mp_context",
    "read_tables",
    "run_id",
    "runs_frame",
    "scaling_frame",
    "study_name",
    "summary_text",
    "t975",
    "with_axes",
    "rate",
]
