"""Read back what tests/tap_plugin/sitecustomize.py recorded inside a run's processes: the
initial weights every rank built, and every training batch every rank really fed. The counts are
the test's own, made outside the runner's bookkeeping, so a runner that miscounts its samples
or trains from other weights than it claims fails against them.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

PLUGIN = ROOT / "tests" / "tap_plugin"

#: Training must move the weights by at least this much: ‖w_final − w_init‖ / ‖w_init‖ over all
#: parameters together. Measured on digits / seed-small, 2 epochs at scale 1, batch 64, seed 0:
#: 0.24 with SGD lr 0.05 (PyTorch; Keras 0.23), 0.58 with Adam lr 0.001. 0.02 is a tenth of
#: the smallest and far above what no training leaves (0: the same weights; planted once).
MIN_RELATIVE_MOVE = 0.02


def env(tap: Path) -> dict[str, str]:
    """Environment for a run whose every process loads the plug-in and writes into `tap`."""
    tap.mkdir(parents=True, exist_ok=True)
    path = [str(PLUGIN), str(ROOT / "workflow"), os.environ.get("PYTHONPATH", "")]
    return {"TRAINSCALE_TEST_TAP": str(tap), "PYTHONPATH": os.pathsep.join(filter(None, path))}


def initial_weights(tap: Path) -> dict[str, np.ndarray]:
    """The initial weights (as numpy arrays by name, or by position for Keras), checked to be the
    same in every process that built a model."""
    files = sorted(tap.glob("init-*.pt")) + sorted(tap.glob("init-*.npz"))
    assert files, f"no initial weights recorded in {tap}: was the plug-in loaded?"
    inits = [load(f) for f in files]
    for other in inits[1:]:
        assert other.keys() == inits[0].keys()
        for k in other:
            np.testing.assert_array_equal(other[k], inits[0][k], err_msg=f"initial {k}")
    return inits[0]


def final_weights(tap: Path, strategy: str, rank: int = 0) -> dict[str, np.ndarray]:
    """The trained weights rank `rank` of a PyTorch-family run of `strategy` held after its
    last epoch (full tensors, float32), as numpy arrays by name."""
    path = tap / f"final-{strategy}-{rank}.pt"
    assert path.exists(), f"no final weights of {strategy} rank {rank} in {tap}"
    return load(path)


def ended_weights(tap: Path, strategy: str, rank: int = 0) -> dict[str, np.ndarray]:
    """The weights rank `rank` of a PyTorch-family run held once its record was written (after
    the no-sync steps of exposed communication), as final_weights gives them."""
    path = tap / f"ended-{strategy}-{rank}.pt"
    assert path.exists(), f"no weights of {strategy} rank {rank} after its report in {tap}"
    return load(path)


def losses(tap: Path) -> list[float]:
    """Every training loss a PyTorch runner computed (a pipeline: its last stage's, one per
    micro-batch), in time order."""
    rows = []
    for f in tap.glob("losses-*.txt"):
        for line in f.read_text().splitlines():
            _, t, v = line.split()
            rows.append((float(t), float(v)))
    return [v for _, v in sorted(rows, key=lambda x: x[0])]


def labels(tap: Path) -> list[tuple[int, float, list[int]]]:
    """The labels of every training batch a PyTorch runner fed: (rank, unix seconds, labels),
    in time order."""
    rows = []
    for f in tap.glob("labels-*.txt"):
        for line in f.read_text().splitlines():
            r, t, v = line.split()
            rows.append((int(r), float(t), [int(x) for x in v.split(",")]))
    return sorted(rows, key=lambda x: x[1])


def of_run(tap: Path, rec: dict, into: Path) -> Path:
    """`into`, holding what the run of `rec` wrote into `tap`, a tap the runs of a study shared
    one after another: each file's lines stamped between the run's launch and exit, and the
    weights files written then (one run's own tap, for the readers above)."""
    start, end = rec["timeline"]["launched_unix"], rec["timeline"]["exited_unix"]
    into.mkdir(parents=True)
    for f in tap.iterdir():
        if f.suffix == ".txt":
            lines = [ln for ln in f.read_text().splitlines(True)
                     if start <= float(ln.split()[1]) <= end]  # fmt: skip
            if lines:
                (into / f.name).write_text("".join(lines))
        elif start <= f.stat().st_mtime <= end:
            (into / f.name).write_bytes(f.read_bytes())
    return into


def load(path: Path) -> dict[str, np.ndarray]:
    """Weights from a torch state dict (.pt) or a Keras get_weights() .npz, as numpy arrays."""
    if path.suffix == ".npz":
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    import torch

    state = torch.load(path, weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}


def relative_move(init: dict[str, np.ndarray], final: dict[str, np.ndarray]) -> float:
    """‖final − init‖ / ‖init‖ over all tensors (float64)."""
    assert init.keys() == final.keys()
    diff = sum(float(((final[k] - init[k]).astype(np.float64) ** 2).sum()) for k in init)
    norm = sum(float((init[k].astype(np.float64) ** 2).sum()) for k in init)
    return (diff / norm) ** 0.5


def assert_moved(init: dict, final: dict, what: str) -> float:
    move = relative_move(init, final)
    assert move >= MIN_RELATIVE_MOVE, (
        f"{what}: training moved the weights by {move:.3g} (relative), "
        f"less than {MIN_RELATIVE_MOVE}: did it train from these initial weights?"
    )
    return move


def batches(tap: Path, kind: str = "samples") -> list[tuple[int, float, int]]:
    """Every training batch recorded (`kind` "exposed": the no-sync steps a multi-worker run
    takes after its epochs): (rank, unix seconds, rows), in time order."""
    rows = []
    for f in tap.glob(f"{kind}-*.txt"):
        for line in f.read_text().splitlines():
            r, t, n = line.split()
            rows.append((int(r), float(t), int(n)))
    return sorted(rows, key=lambda x: x[1])


def fed_per_epoch(tap: Path, strategy: str, workers: int) -> dict[int, list[int]]:
    """The rows of every training batch the processes of the Keras run (`strategy`, `workers`)
    fed, by the epoch they were fed in: each process's batches (`samples-<pid>.txt`) put in the
    last epoch that process began before it (its `epochs-<strategy>-<workers>-<pid>.txt`). A
    ParameterServerStrategy run's batches are noted by its chief, which schedules the steps."""
    marks = sorted(tap.glob(f"epochs-{strategy}-{workers}-*.txt"))
    assert marks, f"no epoch of {strategy} at {workers} recorded in {tap}: plug-in loaded?"
    fed: dict[int, list[int]] = {}
    for path in marks:
        begins = sorted(
            (float(t), int(e)) for _, t, e in map(str.split, path.read_text().splitlines())
        )
        pid = path.stem.rsplit("-", 1)[1]
        for _, t, n in map(str.split, (tap / f"samples-{pid}.txt").read_text().splitlines()):
            epochs = [e for b, e in begins if b <= float(t)]
            assert epochs, f"{strategy}: a batch fed before the first epoch began ({path.name})"
            fed.setdefault(epochs[-1], []).append(int(n))
    return fed


def assert_recorded_samples_were_fed(rec: dict, tap: Path) -> None:
    """A Keras run's `epochs[].samples` against the batches its workers fed the model (every
    call of the model's train_step, once per replica or worker step, with the rows it got):
    per epoch, the recorded samples are the rows fed in that epoch, in batches of
    per_worker_batch_size (one worker's share of the global batch; under ParameterServerStrategy
    one worker step's)."""
    spec = rec["spec"]
    fed = fed_per_epoch(tap, spec["strategy"], spec["workers"])
    epochs = rec["epochs"]
    assert sorted(fed) == list(range(1, len(epochs) + 1)), (sorted(fed), len(epochs))
    for i, e in enumerate(epochs, start=1):
        rows = fed[i]
        run = f"{spec['strategy']} at {spec['workers']} workers, epoch {i}"
        assert {*rows} == {spec["per_worker_batch_size"]}, (
            f"{run}: its workers fed batches of {sorted({*rows})} rows; the per-worker batch "
            f"is {spec['per_worker_batch_size']}"
        )
        assert e["samples"] == sum(rows), (
            f"{run}: recorded {e['samples']} samples; its workers fed {sum(rows)} in "
            f"{len(rows)} batches"
        )


def assert_throughput_matches_the_work(rec: dict, tap: Path, feeds_per_step: int) -> None:
    """The record's samples and throughput against the batches the ranks really fed.

    `feeds_per_step`: recorded batches per optimizer step over the whole job (ranks × replicas
    × micro-batches; a pipeline feeds the loss on its last stage only). Checks, per epoch:
    samples == steps × global batch == rows the ranks fed; the epoch's seconds cover the span
    from its start (the first batch of its last rank to start) to its last fed batch, and fit
    between the previous epoch's last fed batch and the next epoch's start (for the last epoch:
    the time the record was written); then
    throughput == steady samples / steady seconds (metrics' definition) of those epochs."""
    fed = batches(tap)
    epochs = rec["epochs"]
    assert len(epochs) >= 2, "throughput needs a steady epoch (epochs 2..E)"
    g = rec["spec"]["global_batch_size"]
    per_epoch = [e["steps"] * feeds_per_step for e in epochs]
    assert len(fed) == sum(per_epoch), (
        f"the ranks fed {len(fed)} batches; the record's steps say {sum(per_epoch)}"
    )
    start = 0
    spans = []
    for e, count in zip(epochs, per_epoch, strict=True):
        mine = fed[start : start + count]
        start += count
        rows = sum(n for _, _, n in mine)
        assert e["samples"] == e["steps"] * g == rows, (
            f"epoch {e.get('epoch')}: recorded {e['samples']} samples, {e['steps']} steps × "
            f"global batch {g} = {e['steps'] * g}; the ranks really fed {rows}"
        )
        # an epoch starts when its last rank to start feeds: the ranks leave the barrier
        # before the clock together, but a rank may feed its first batch before rank 0, whose
        # clock the record keeps, has read it: on 2 busy cores rank 0 can be scheduled out
        # between the two (seen in CI, Horovod: a 0.85 s span against 0.44 s recorded)
        started = max(min(t for r, t, _ in mine if r == rank) for rank in {r for r, _, _ in mine})
        spans.append((started, mine[-1][1]))
    written = datetime.fromisoformat(rec["env"]["end_utc"]).timestamp()  # after the last epoch
    slack = 0.05  # time stamps are taken inside a step, the epoch's clock just outside it
    for i, (e, (first, last)) in enumerate(zip(epochs, spans, strict=True)):
        assert e["seconds"] >= last - first - slack, (i, e["seconds"], last - first)
        after = spans[i - 1][1] if i else None
        before = spans[i + 1][0] if i + 1 < len(spans) else written
        if after is not None and before is not None:
            assert e["seconds"] <= before - after + slack, (i, e["seconds"], before - after)
    # the extra steps with gradient synchronisation off (exposed communication) came after
    # the last epoch, and none of them is among the epochs' batches counted above
    extra = batches(tap, "exposed")
    comm = rec.get("communication") or {}
    if comm.get("method"):
        assert len(extra) == comm["steps"] * feeds_per_step, (len(extra), comm)
        assert extra[0][1] > spans[-1][1], "no-sync steps before the last epoch ended"
    else:
        assert extra == [], comm
    steady = epochs[1:]
    assert rec["throughput"] == pytest.approx(
        sum(e["samples"] for e in steady) / sum(e["seconds"] for e in steady), rel=1e-9
    )
