"""Tensor parallelism (torch-tp, torch-fsdp-tp): the matrix's rules for the `tp` axis, and real
2- and 4-rank runs over gloo that must end with one process's weights from the same initial
weights and data (the plan in trainscale/runners/torch/tp_plans.py)."""

import numpy as np
import pytest

from trainscale.analysis import comm_model
from trainscale.measure import metrics
from trainscale.plan import catalog
from trainscale.plan.matrix import build_runs
from trainscale.plan.runspec import OwnModel

import tap
from conftest import ROOT, launch, validated


def runs_of(strategy, workers=2, tp=(1,), model="gpt-nano", dataset="shakespeare", **kw):
    m = {
        "strategy": list(strategy) if isinstance(strategy, tuple) else [strategy],
        "model": [model],
        "dataset": [dataset],
        "seq_len": [kw.pop("seq_len", 32)],
        "workers": [workers] if isinstance(workers, int) else list(workers),
        "batch_size": [kw.pop("batch_size", 8)],
        "batch_mode": [kw.pop("batch_mode", "global")],
        "precision": [kw.pop("precision", "fp32")],
        "tp": list(tp),
        "nodes": [kw.pop("nodes", 1)],
    }
    return build_runs(validated({"study": "t", "eval_tokens": 4096, "matrix": m, **kw}))


def only(strategy, tp, **kw):
    """(runs, dropped) of `strategy` at the degrees `tp`, in a matrix that keeps one torch-ddp
    cell (at tp 1) so that it is never empty."""
    runs, dropped = runs_of(("torch-ddp", strategy), tp=(1, *tp), **kw)
    keep = [r for r in runs if r.strategy == strategy and r.tp in tp]
    return keep, [d for d in dropped if d.values["strategy"] == strategy and d.values["tp"] in tp]


def reasons(dropped) -> list[str]:
    return [d.reason for d in dropped]


def test_the_bar_matrix_keeps_tp_only_where_it_applies():
    """The issue's study: DDP, FSDP, TP and ZeRO-3 at 2 workers with tp [1, 2]."""
    runs, dropped = runs_of(
        ("torch-ddp", "torch-fsdp", "torch-tp", "deepspeed-zero3"), tp=(1, 2),
        dataset="synthetic-tokens", seq_len=128, batch_size=16,
    )  # fmt: skip
    assert sorted((r.strategy, r.tp) for r in runs) == [
        ("deepspeed-zero3", 1), ("torch-ddp", 1), ("torch-fsdp", 1), ("torch-tp", 2),
    ]  # fmt: skip
    assert len(dropped) == 4
    assert any("torch-tp is tensor parallelism over all ranks" in r for r in reasons(dropped))
    assert any("torch-ddp has no tensor parallelism: tp 2" in r for r in reasons(dropped))
    tp = next(r for r in runs if r.strategy == "torch-tp")
    assert "/nodes~1/tp~2/precision~fp32/" in tp.path  # in the path only above 1
    assert all("tp~" not in r.path for r in runs if r.tp == 1)
    assert tp.data_replicas == 1 and (tp.global_batch_size, tp.per_worker_batch_size) == (16, 16)


def test_fsdp_tp_needs_a_two_dimensional_mesh():
    runs, dropped = runs_of("torch-fsdp-tp", workers=(2, 4), tp=(1, 2, 4))
    assert [(r.world_size, r.tp) for r in runs] == [(4, 2)]
    why = reasons(dropped)
    assert any("with tp 1 is torch-fsdp" in r for r in why)
    assert any("at dp 1 it is torch-tp" in r for r in why)
    (r,) = runs
    assert r.data_replicas == 2 and (r.global_batch_size, r.per_worker_batch_size) == (8, 4)
    across, dropped = only("torch-fsdp-tp", (2,), workers=1, nodes=4)
    assert not across and "inside a node: tp (2) must divide workers (1)" in dropped[0].reason


def test_tp_must_divide_heads_widths_vocabulary_and_sequence():
    # gpt-micro has 6 heads: tp 4 does not divide them
    runs, dropped = only("torch-tp", (4,), workers=4, model="gpt-micro")
    assert not runs and "tp 4 does not divide gpt-micro's heads 6" in dropped[0].reason
    runs, dropped = only("torch-tp", (2,), seq_len=33)
    assert not runs and "seq_len 33" in dropped[0].reason


def test_models_without_a_plan_and_fp16_are_dropped_with_the_reason():
    runs, dropped = only("torch-tp", (2,), model="seed-small", dataset="digits")
    assert not runs and "seed-small has none" in dropped[0].reason
    runs, dropped = only("torch-tp", (2,), precision="fp16")
    assert not runs and "use bf16" in dropped[0].reason
    assert catalog.STRATEGIES["torch-tp"].exposed_unmeasured


def test_a_global_batch_that_does_not_split_over_the_replicas_is_refused():
    with pytest.raises(ValueError, match="2 data-parallel replicas of torch-fsdp-tp"):
        runs_of("torch-fsdp-tp", workers=4, tp=(2,), batch_size=7)


#: The tolerance of the other equivalence tests (tests/test_fsdp_pipeline.py): rtol 1e-4 /
#: atol 1e-5. Measured largest differences after 8 steps against one process: SGD 1.2e-7
#: (torch-tp and torch-ddp alike); AdamW 2.6e-6 (torch-tp), 2.3e-6 (dp 2 × tp 2), 1.1e-6
#: (torch-ddp). AdamW runs with eps 1e-6: at its default 1e-8 a gradient element near zero,
#: whose last bits differ with the order of a sum (a row-parallel layer adds its halves, DDP
#: its ranks), takes a normalised step of another size, 1.2e-5 for torch-tp and 6.8e-6 for
#: torch-ddp, at the tolerance; eps bounds that amplification. SGD at lr 0.1 moves the weights
#: by 0.038 (relative), AdamW by 0.095; a plan that splits a layer the wrong way fails both.
RTOL, ATOL = 1e-4, 1e-5
OPTIMIZERS = {
    "sgd": {"name": "sgd", "lr": 0.1},
    "adamw": {"name": "adamw", "lr": 0.001, "weight_decay": 0.1, "eps": 1e-6},
}


def train(tmp_path, strategy, workers, tp, optimizer, **config):
    """One real run of 2 epochs of 4 steps through the supervisor, with the tap plug-in: its
    record, initial and final weights."""
    out = tmp_path / strategy / "metrics.json"
    taps = tmp_path / f"{strategy}-tap"
    runs, dropped = runs_of(
        strategy, workers=workers, tp=(tp,), epochs=2, steps_per_epoch=4, optimizer=optimizer,
        threads_per_worker=1, **config,
    )  # fmt: skip
    assert runs, reasons(dropped)
    p = launch(runs[0], out, **tap.env(taps))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = metrics.read(out)
    assert rec["status"] == "ok", rec["error"]
    return rec, tap.initial_weights(taps), tap.final_weights(taps, strategy)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One process's run per model and optimizer (the reference of both strategies), made
    once."""
    made = {}

    def get(model, name):
        if (model, name) not in made:
            made[model, name] = train(tmp_path_factory.mktemp(name), "torch", 1, 1,
                                      OPTIMIZERS[name], model=model)  # fmt: skip
        return made[model, name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, workers, tp, optimizer, model",
    [("torch-tp", 2, 2, "sgd", "gpt-nano"), ("torch-fsdp-tp", 4, 2, "adamw", "gpt-nano")],
    # one optimizer each: the split's gradients under SGD, the sharded AdamW state under FSDP x
    # TP (4 ranks on 2 cores: 60 s); an hf: model's torch-tp is its study's (test_hf_models),
    # where the config's plan splits it as it splits it here under FSDP x TP
    ids=["tp2-sgd", "dp2xtp2-adamw"],
)  # fmt: skip
def test_tensor_parallel_ends_with_one_process_weights(
    tmp_path, one_process, strategy, workers, tp, optimizer, model
):
    """From the same initial weights and the same windows, the split model takes one process's
    steps: a layer split the wrong way (row-parallel declared column-parallel), a vocabulary
    shard looked up at the wrong offset, a loss on the wrong share of the logits or gradients
    summed over the tp group would not."""
    ref_rec, ref_init, ref = one_process(model, optimizer)
    rec, init, final = train(tmp_path, strategy, workers, tp, OPTIMIZERS[optimizer], model=model)
    assert init.keys() == ref_init.keys()
    for k in init:
        np.testing.assert_array_equal(init[k], ref_init[k], err_msg=k)
    tap.assert_moved(ref_init, ref, "torch")
    tap.assert_moved(init, final, strategy)
    assert final.keys() == ref.keys()
    for k in ref:
        assert final[k].shape == ref[k].shape  # full tensors
        np.testing.assert_allclose(final[k], ref[k], rtol=RTOL, atol=ATOL, err_msg=k)
    dp = workers // tp
    assert rec["env"]["mesh"] == {"dp": dp, "tp": tp}
    assert rec["tp"] == {"degree": tp, "data_parallel": dp, "sequence_parallel": True,
                         "plan": "gpt"}  # fmt: skip
    assert 0 < rec["flops"]["mfu"] <= 1
    assert len(rec["memory"]["per_rank_host_rss_bytes"]) == workers
    assert (
        rec["communication"]["method"] is None
        and "tensor parallelism" in (rec["communication"]["note"])
    )
    assert rec["test"]["perplexity"] == pytest.approx(ref_rec["test"]["perplexity"], rel=1e-3)
    # scored on logits split by vocabulary: each rank's best id, the group's argmax
    assert rec["test"]["accuracy"] == pytest.approx(ref_rec["test"]["accuracy"], abs=2e-3)
    assert rec["test"]["accuracy"] > 0.05
    assert [e["samples"] for e in rec["epochs"]] == [e["samples"] for e in ref_rec["epochs"]]


#: the example package's language model with its one-block plan, embedding and head named
OWN_LM = OwnModel(
    name="my-lm", torch="tinymodels.lm:build", keras=None, kwargs='{"depth": 2, "width": 64}',
    input="tokens", blocks="blocks", tp_plan="tinymodels.transformer:tp_plan",
    code=(str(ROOT / "examples" / "own-model" / "src"),), embedding="blocks.0.tokens",
    head="blocks.-1.linear",
)  # fmt: skip


@pytest.mark.slow
def test_an_own_model_with_a_tp_plan_ends_with_one_process_weights(tmp_path):
    """The example package's language model (examples/own-model: tinymodels.lm, biases and an
    untied head) with its one-block plan, tinymodels.transformer:tp_plan, laid on its two
    blocks, and its embedding and head named (split by vocabulary, the head's bias too): the
    same AdamW steps as one process (lr 0.005: PyTorch's default initialisation is larger
    than GPT-2's, and 8 steps at 0.001 move it by 0.014)."""
    entry = {k: getattr(OWN_LM, k) for k in ("torch", "input", "blocks", "tp_plan", "embedding",
                                              "head")}  # fmt: skip
    own = {"code": list(OWN_LM.code),
           "models": {"my-lm": {**entry, "kwargs": OWN_LM.builder_kwargs}}}  # fmt: skip
    adamw = {**OPTIMIZERS["adamw"], "lr": 0.005}
    _, ref_init, ref = train(tmp_path, "torch", 1, 1, adamw, model="my-lm", **own)
    rec, init, final = train(tmp_path, "torch-tp", 2, 2, adamw, model="my-lm", **own)
    tap.assert_moved(ref_init, ref, "torch")
    for k in ref:
        np.testing.assert_array_equal(init[k], ref_init[k], err_msg=k)
        np.testing.assert_allclose(final[k], ref[k], rtol=RTOL, atol=ATOL, err_msg=k)
    assert rec["tp"] == {"degree": 2, "data_parallel": 1, "sequence_parallel": False,
                         "plan": "tinymodels.transformer:tp_plan"}  # fmt: skip


def step_collectives(sequence_parallel: bool, checkpointing: str = "none") -> dict[str, int]:
    """The collectives one training step of gpt-nano (4 layers) at tp 2 runs, by
    CommDebugMode's names: the runner's plan and loss (torch_parts.loss_of), its blocks
    checkpointed as `checkpointing` says, on a fake process group of 2 ranks in this process
    (CommDebugMode counts what is issued, whatever the backend)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    from trainscale.models import gpt
    from trainscale.runners.torch import checkpointing as ckpt
    from trainscale.runners.torch import tp_plans
    from trainscale.runners.torch.memory.trace import fake_world
    from trainscale.runners.torch.torch_parts import loss_of

    with fake_world(2):
        mesh = init_device_mesh("cpu", (2,))
        net = gpt.build("gpt-nano", 32, 256)
        ckpt.apply(net, None, checkpointing)
        tp_plans.parallelize(net, mesh, list(net), None, sequence_parallel)
        ids = torch.randint(0, 256, (2, 33))
        with CommDebugMode() as comm:
            loss_of(net(ids[:, :-1]), ids[:, 1:]).backward()
    return {str(k).split(".")[-1]: n for k, n in comm.get_comm_counts().items()}


def test_the_traffic_model_counts_the_collectives_the_plan_runs():
    """comm_model's TP traffic (analysis/comm_model.py) is counted from the plan: DTensor's
    CommDebugMode sees exactly those collectives in one training step of gpt-nano (4 layers),
    the logits never gathered."""
    for sp in (False, True):
        assert step_collectives(sp) == comm_model.collectives_per_step(4, sp), sp


def test_a_ranks_traced_logits_are_its_share_of_the_vocabulary():
    """gpt-nano on synthetic-tokens (50,304 ids, seq_len 128, batch 8) under torch-tp at tp 2,
    traced as the memory pre-flight traces it: the activations the head leaves (its logits)
    are half what they were with the logits gathered on every rank, and the step's peak
    falls with them."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState
    from torch.distributed.device_mesh import init_device_mesh

    from trainscale.runners.torch import tp_plans
    from trainscale.runners.torch.memory import trace
    from trainscale.runners.torch.memory.steps import forward_backward
    from trainscale.runners.torch.torch_parts import make_optimizer

    (spec,), _ = runs_of("torch-tp", tp=(2,), dataset="synthetic-tokens", seq_len=128,
                         batch_size=8)  # fmt: skip
    assert spec.per_worker_batch_size == 8  # the tp group's one batch
    cpu = torch.device("cpu")

    def traced() -> tuple[int, dict]:
        """(the activations the head's forward adds, the step's parts), as memory_trace's
        tensor_parallel traces them."""
        with trace.fake_world(2):
            mesh = init_device_mesh("cpu", (2,))  # before fake tensors, as the trace makes it
            with trace.tensors():
                net = trace.fake_model(spec, cpu)
                tp_plans.parallelize(net, mesh, list(net), None, sequence_parallel=True)
                opt = make_optimizer(spec, net.parameters())
                batch = trace.fake_batch(spec, 8, cpu)
                tracker = MemTracker()
                tracker.track_external(net, opt, *batch)
                with tracker:  # one forward and backward: the head's own figures
                    forward_backward(net, opt, [batch], cpu, None)
                head = tracker.memory_tracking[net[-1]].snapshots
                tracker = MemTracker()
                tracker.track_external(net, opt, *batch)
                parts = trace.peak(trace.tracked(tracker, net, opt, [batch], cpu, None))
        before, after = (head[s][0][cpu]["Activation"] for s in (_ModState.PRE_FW,
                                                                    _ModState.POST_FW))  # fmt: skip
        return after - before, parts

    logits = 8 * 128 * 50304 * 4  # fp32 bytes of the whole vocabulary's logits
    split, parts = traced()
    whole_head = tp_plans.ColwiseParallel(input_layouts=tp_plans.Shard(1),
                                          output_layouts=tp_plans.Replicate())  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:  # the head as it was: logits gathered
        mp.setattr(tp_plans, "head_style", lambda sp=False: whole_head)
        gathered, before = traced()
    assert logits <= gathered < 1.01 * logits
    assert logits / 2 <= split < 0.51 * gathered
    # the step's peak (the phases' largest: the trace's own order, logits held by autograd
    # alone) falls by most of a rank's saved share: 0.43 of the whole logits' bytes here
    assert parts["total"] < before["total"] - 0.4 * logits


def test_the_hardware_flops_count_what_the_plan_leaves_whole_once_per_rank():
    """Under tp 2 the GPT splits every matrix multiply (the head's by vocabulary): its
    hardware FLOPs are its model FLOPs. The example language model with its embedding and head
    unnamed runs its head whole on both ranks: one head more (6·T·C·V for T tokens of width C
    and vocabulary V); named, none."""
    import dataclasses

    from trainscale.runners.torch import flop_count

    gpt = flop_count.per_sample("gpt-nano", (32,), 256)
    assert flop_count.per_sample("gpt-nano", (32,), 256, tp=2) == gpt
    own = dataclasses.replace(OWN_LM, embedding=None, head=None)
    lm = flop_count.per_sample("my-lm", (32,), 256, own)
    assert flop_count.per_sample("my-lm", (32,), 256, own, tp=2) == lm + 6 * 32 * 64 * 256
    assert flop_count.per_sample("my-lm", (32,), 256, OWN_LM, tp=2) == lm


def test_the_reports_communication_table_gives_tp_traffic_in_the_note():
    from types import SimpleNamespace

    from trainscale.report import rows

    tp = SimpleNamespace(note="tensor parallelism: activations", tp_bytes=3 * 2**20)
    assert rows._comm_note(tp) == "tensor-parallel traffic 3.00 MiB per step; " + tp.note
    ddp = SimpleNamespace(note="", tp_bytes=float("nan"))
    assert rows._comm_note(ddp) == ""


def activations_and_temporaries(strategy: str, workers: int, tp: int, model: str) -> int:
    """The predicted activations plus temporaries per rank (everything beyond the model
    states) of `model` on synthetic-tokens (50,304 ids), seq_len 128, global batch 8, fp32, on
    CUDA (traced here on CPU)."""
    from trainscale.runners.torch.memory import trace

    (spec,), _ = runs_of(strategy, workers=workers, tp=(tp,), model=model,
                         dataset="synthetic-tokens", seq_len=128, batch_size=8)  # fmt: skip
    parts = trace.predict(spec, "cuda")["parts"]
    return parts["activations"] + parts["temporaries"]


def test_a_tp_rank_holds_its_share_of_a_logit_dominated_step():
    """gpt-nano's step at seq 128, batch 8 is almost all logits (1,024 × 50,304 × 4 B = 196
    MiB a copy): one process holds 3.2 copies (622.6 MiB). At tp 2, on the same batch, a rank
    holds its half of the vocabulary's logits and one copy of the same size (tp_loss), 215.4
    MiB: at most 0.6× (0.82× with loss_parallel and the trace counting DTensor's
    global-shape propagation tensors)."""
    one = activations_and_temporaries("torch", 1, 1, "gpt-nano")
    split = activations_and_temporaries("torch-tp", 2, 2, "gpt-nano")
    assert split <= 0.6 * one, (split / 2**20, one / 2**20)


def test_a_real_two_rank_step_peaks_at_its_prediction(tmp_path):
    """A real torch-tp run of 2 ranks over gloo (gpt-nano on synthetic-tokens, seq 64, batch
    4, AdamW, two steps as the runner builds and steps it): each rank's CPU allocator peak
    (torch.profiler's memory events, not the trackers) within 10 % of the trace's prediction
    (measured: equal to the byte)."""
    import helpers
    import torch.multiprocessing as mp

    from trainscale.launch.supervise import free_port
    from trainscale.runners.torch.memory import trace

    (spec,), _ = runs_of("torch-tp", tp=(2,), dataset="synthetic-tokens", seq_len=64,
                         batch_size=4, optimizer={"name": "adamw", "lr": 0.001})  # fmt: skip
    predicted = trace.predict(spec, "cpu")["total_bytes"]
    mp.spawn(helpers.tensor_parallel_steps, args=(spec.to_json(), free_port(), str(tmp_path)),
             nprocs=2)  # fmt: skip
    peaks = [int((tmp_path / f"peak-{rank}.txt").read_text()) for rank in range(2)]
    for peak in peaks:
        assert abs(peak / predicted - 1) <= 0.10, (peaks, predicted)


def test_check_says_what_a_tp_cells_batch_is_on_each_rank():
    """batch 2 per worker on 4 ranks at tp 2: a global batch of 8 over 2 replicas, each of
    whose ranks holds the replica's 4 samples (docs/strategies.md); nothing at tp 1."""
    from trainscale.plan import check

    (spec,), _ = runs_of("torch-fsdp-tp", workers=4, tp=(2,), batch_size=2,
                         batch_mode="per_worker")  # fmt: skip
    assert check.tp_batch(spec) == " (a dp replica's 4 samples = 128 tokens on each of its 2 ranks)"
    (ddp,), _ = runs_of("torch-ddp", batch_size=2, batch_mode="per_worker")
    assert check.tp_batch(ddp) == ""
