"""The measurements that come after training's own figures, each of which may fail without
losing the run: nothing measured is lost.

A run first measures its training: the timed epochs, their throughput and step times. Then
come parts that add to the record, any of which may raise on a model or a framework version
nobody tried: the evaluation of the test set, the gather of every rank's memory peaks,
utilisation and energy, the exposed-communication steps, the FLOP count, and the strategy's
own record block. Each runs under `Parts.run`. Where it raises, the part's figures stay null,
`{"part", "error"}` joins the record's `warnings`, the traceback goes to the run's log, and
the run ends `ok` for its training. A failure in training itself is not guarded: that run is
`failed`, as before.

A part that runs collectives runs on every rank, and the ranks agree on its outcome (every
rank's error is gathered), so all of them leave it alike and none waits in a collective that
the others have left. A failure in one rank's collective while the others wait in it cannot
be caught here; the run's timeout ends it.

A fault planted in a part (config `faults` with `part`) raises at the part's start on every
rank, as a failure of the measurement's own code does.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import TypeVar

from trainscale.measure.timeline import Timeline
from trainscale.plan.runspec import RunSpec

#: the parts, by the name a record's `warnings` and config `faults[].part` give them:
#: what each nulls where it fails
PARTS = {
    "evaluation": "test: accuracy, loss and the per-class figures (no later evaluation runs)",
    "memory": "memory peaks, utilisation and energy of every rank",
    "communication": "communication: the exposed-communication figures",
    "flops": "flops: FLOPs per sample, achieved FLOP/s and MFU",
    "framework": "the strategy's own block (deepspeed, horovod, tp, pipeline)",
}

T = TypeVar("T")


def said(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0] if text else type(e).__name__


class Parts:
    """Runs a run's post-training parts and keeps their failures in `warnings` (the list the
    record carries: metrics.Recorder.warnings).

    agree(error) -> every rank's error (None where its part went well), gathered on every
    rank; None where the run has one process (or the part runs on one rank only).
    `timeline`: where each part's seconds are summed (the Recorder's: the record's timeline)."""

    def __init__(
        self,
        spec: RunSpec,
        warnings: list[dict],
        agree: Callable[[str | None], list[str | None]] | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        self.spec = spec
        self.warnings = warnings
        self.agree = agree
        self.timeline = timeline

    def failed(self, part: str) -> bool:
        return any(w["part"] == part for w in self.warnings)

    def run(self, part: str, measure: Callable[[], T], *, collective: bool = True,
            epoch: int | None = None) -> T | None:  # fmt: skip
        """measure(), or None where it raised on any rank (the error recorded once). Every
        rank of a `collective` part calls this; others may be called on one rank alone."""
        if part not in PARTS:
            raise ValueError(f"Parts.run: unknown part {part!r}; one of {', '.join(PARTS)}")
        value, error, start = None, None, time.perf_counter()
        try:
            planted(self.spec, part, epoch)
            value = measure()
        except Exception as e:
            error = said(e)
            print(f"trainscale: {part} failed after training; its figures stay null:", flush=True)
            traceback.print_exc()
        errors = self.agree(error) if collective and self.agree is not None else [error]
        if self.timeline is not None:
            self.timeline.part(part, time.perf_counter() - start)
        ranks = [rank for rank, e in enumerate(errors) if e]
        if not ranks:
            return value
        where = ""
        if len(errors) > 1:
            where = f" (on rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))})"
        first = error or errors[ranks[0]]
        if not self.failed(part):
            self.warnings.append({"part": part, "error": f"{first}{where}"})
        return None


def planted(spec: RunSpec, part: str, epoch: int | None = None) -> None:
    """Raise the fault config `faults` planted in `part` (in epoch `epoch` for evaluation)."""
    f = spec.fault
    if f is None or f.part != part or (epoch is not None and f.epoch != epoch):
        return
    raise RuntimeError(f"injected fault: the {part} part raised")
