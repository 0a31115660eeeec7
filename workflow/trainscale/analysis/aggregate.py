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
- confidence interval (of throughput, `throughput_ci95`, from steps and repeats): y = ln X of
  run r of cell c is y_cr = μ_c + a_cr + e_cr: a_cr the run's own level (a fresh process,
  placement, a busy neighbour) and e_cr the sampling error of its throughput, variance
  w_cr = var(b) / (k · mean(b)²) (the delta method) from k blocks b of its steady epochs: the
  record's batch means of rank 0's step times merged into blocks of at least 10 consecutive
  steps and scaled by the epoch's wall time over its step times. Every cell keeps its own
  run-to-run variance s_c² on d = n_c − 1 df, moderated by empirical Bayes as limma's
  squeezeVar does (Smyth 2004), with no pretest: the strata's (`stratum`: framework family ×
  world size × device kind) pooled variances drawn toward the study's, each cell's toward its
  stratum's (`prior_run_var`), the prior's d₀ fitted by limma's moments and capped at 3, its
  scale the pooled variance. The cell's per-run variance (`pooled_run_var`) is (d₀ s₀² +
  d s_c²) / (d₀ + d) on d₀ + d df (`interval_df`); Var(ȳ_c) = max(that, w̄_c) / n_c
  (`throughput_log_var`; w̄_c, `within_run_var`, a floor; `between_run_var` the rest); the
  interval is exp(ȳ_c ± h), h = t(0.975, ν_c) · √Var(ȳ_c), given as the half-width
  x̄ · (e^h − 1) about the mean. `prior_df` and `prior_scale` are the study's fitted d₀ (capped)
  and s₀, the same on every row. A cell of one ok run takes its prior on d₀ df, below 4 "one run:
  no interval" (`interval_method`), shown and never called slower. Cells whose records lack
  batch means (tf-ps) are moderated too, for the verdicts; their CI stays Student's t over their
  repeats ("repeats only (records without step times)"). Simulated (tests/test_moderate.py,
  tests/test_interval.py, the default shape, 2 repeats): equal cells at 2 % spread: 98.1 %
  covered (errs wide); the 4 DeepSpeed cells at N = 2 at 6 % among 1 % ones: 92.6 % (Bartlett's
  pretest, the model before: 75 %); one stratum half at 6 %: 96.3 % (the pretest: 85.5 %).
- comparison with the best (`could_be_fastest`, `mcb_low`, `mcb_high`, `slower`): per panel of
  the ranking (model, dataset and N; trainscale.analysis.best), with y_i the cell's ȳ in the
  panel's unit and s_ij = √(Var(ȳ_i) + Var(ȳ_j)), the simultaneous 95% intervals of θ_i = μ_i −
  max_{j≠i} μ_j are [min_{j≠i} (y_i − y_j − c s_ij), min_{j≠i} (y_i − y_j + c s_ij)]: MCB
  intervals deduced from simultaneous all-pairwise ones (Hsu 1996, Multiple Comparisons, ch. 4).
  c is the panel's own: the 95 % quantile of the maximum over its pairs of |z_i s_i − z_j s_j| /
  √(u_i² s_i² + u_j² s_j²), z_i normal and u_i² a χ² on the cell's df over its df (Welch's
  statistic with s_i² = Var(ȳ_i) taken as true), by Monte Carlo as multcomp does with mvtnorm
  (Hothorn, Bretz & Westfall 2008; 2,000 draws, fixed seed, cached by the panel's shape). Every
  pair at once because a strict "slower" is wrong only for a cell tied with the best, and where
  all are tied that is any pair; Hsu's constrained MCB (Hsu 1981, 1984) with Dunnett's one-sided
  value says only "not the best". Edwards & Hsu (1983, multiple comparisons with the best
  treatment) deduce MCB from comparisons with a control; the studentized range used before is
  not theirs. A cell whose interval reaches 0 could be the fastest ("at 95 %, the fastest is one
  of {a, b}"), one below 0 is slower; `distinguishable` equals `slower`. Simulated (2 repeats):
  some cell of 13 equal ones called slower in 0.7 % of panels; with a noisy 4-cell stratum,
  2.9 % (the pretest: 29.8 %); a true 10 % difference called in 11.8 % at 2 repeats, 68 % at 4,
  95 % at 6 (the pretest's 34 % at 2 came without valid error control).
- what a study can tell (`mdd_rel`, `repeats_for_5pct`, `repeats_for_2pct`,
  `repeats_for_equivalence`, `repeats_to_resolve`): per panel (trainscale.analysis.settle), the
  shortfall 1 − e^(−δ) from the best called slower in 80 % of studies, δ = (c + t(0.80, ν)) ·
  √(2 V), V and ν the median Var(ȳ) and df of the panel's cells and c the per-panel value for
  them, the df the comparison uses; at n repeats V scaled by n₀ / n and ν grown by one a repeat;
  the fewest repeats for 5 %, 2 %, for TOST to be able to succeed, and, per cell not told apart,
  for a shortfall the size observed (none beyond 100): "not told apart: this study resolves
  differences of ≥ 18 %; 6 repeats would resolve ≥ 5 %; a 31 % shortfall (as observed) needs
  5 repeats".
- equivalent (`equivalent`): a cell and its panel's best differ by less than config
  `report.equivalence` (default 2 %) by two one-sided tests with the panel's simultaneous value
  at 90 %: d ± c₉₀ · s within ±ln(1 + margin); where the panel's typical pair cannot pass at the
  study's repeats, no cell is marked (`repeats_for_equivalence` says what would do).
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
- fastest: per model, dataset and N, the ranking's first cell (the highest geometric mean
  throughput, exp of the mean log, in the data's unit: tokens/s on token data); the
  runner-up is the best cell of another strategy, `distinct` says whether it is slower (the
  comparison with the best), `could_be` names the cells that could be the fastest. Cells on
  logical CPU devices (`device.logical`) are never ranked: a code-path check. Predicted
  throughput (predictions.csv) is never ranked either.
- ranking: the report's first figure, strategies ranked by throughput. Per model, dataset
  and N, every cell with an ok run, sorted by the geometric mean of its steady throughput
  (`throughput_gmean`, exp of the mean log: the quantity the verdicts test; tokens/s on token
  data), fastest first, with its 95% CI, each marked by the comparison with the best ("could be
  the fastest", "slower", "equivalent", "one run: no interval"), under each panel what it
  resolves; "behind" is 1 − x / x_f on the geometric means, as are summary.txt's margins.
  scaling.csv carries the same verdicts per cell. A
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
