"""Peak memory of training and of evaluation, apart (`memory.peak_*` and `memory.eval_peak_*`
in metrics.json; the definitions are in trainscale.measure.metrics' docstring)."""

from __future__ import annotations

from pathlib import Path

from trainscale.measure.metrics import peak_rss_bytes


def rss_high_water_bytes() -> int:
    """This process's peak resident set size since start or the last `reset_rss_high_water`
    (VmHWM in /proc/self/status; ru_maxrss where there is no /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return peak_rss_bytes()


def reset_rss_high_water() -> bool:
    """Set the peak resident set size back to the current one (Linux >= 4.0: "5" written to
    /proc/self/clear_refs); False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PhasePeaks:
    """Peak memory of training and of evaluation, kept apart.

    An evaluation of the whole test set can need more memory than a training step (larger
    batches, another graph), and a peak taken over the whole run would then be evaluation's.
    So the high-water marks (host RSS, and device memory through `device_peak`/`device_reset`)
    are read and reset when an evaluation starts and when it ends: what accrues outside
    evaluations is training's (start-up included), what accrues inside is evaluation's. A
    reset sets a mark to what is held at that moment, so each phase's peak includes what the
    process holds throughout (model, data) and memory one phase keeps past its end counts in
    the next. Where the kernel cannot reset the host mark, training's host peak is the one
    before the first evaluation (exact when only the last epoch evaluates).
    """

    def __init__(self, device_peak=None, device_reset=None) -> None:
        self._device_peak, self._device_reset = device_peak, device_reset
        self.train = [0, 0]  # host RSS bytes, device bytes
        self.eval: list[int] | None = None
        self._resettable = True

    def _take(self) -> list[int]:
        peak = [rss_high_water_bytes(), int(self._device_peak()) if self._device_peak else 0]
        self._resettable = reset_rss_high_water() and self._resettable
        if self._device_reset:
            self._device_reset()
        return peak

    def _add_training(self, peak: list[int]) -> None:
        if self._resettable or self.eval is None:  # else the host mark holds evaluation's
            self.train[0] = max(self.train[0], peak[0])
        self.train[1] = max(self.train[1], peak[1])

    def evaluation_starts(self) -> None:
        self._add_training(self._take())

    def evaluation_ends(self) -> None:
        peak = self._take()
        self.eval = [max(a, b) for a, b in zip(self.eval or [0, 0], peak, strict=True)]

    def finish(self) -> list[float]:
        """[training host, training device, evaluation host, evaluation device] bytes, the
        evaluation ones 0 when nothing was evaluated (a form every collective can max over)."""
        self._add_training(self._take())
        return [float(v) for v in (*self.train, *(self.eval or [0, 0]))]


def memory_block(peaks: list[float], device: bool) -> dict:
    """The `memory` entries of `PhasePeaks.finish` values (maxed over ranks): training's peaks
    as `peak_*`, evaluation's as `eval_peak_*` (None where nothing was evaluated or, for the
    device, on CPU)."""
    evaluated = peaks[2] > 0
    return {
        "peak_host_rss_bytes": int(peaks[0]),
        "peak_device_bytes": int(peaks[1]) if device else None,
        "eval_peak_host_rss_bytes": int(peaks[2]) if evaluated else None,
        "eval_peak_device_bytes": int(peaks[3]) if evaluated and device else None,
    }
