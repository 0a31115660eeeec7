"""Progress lines while a study runs (trainscale.launch.progress), from Snakemake's log events;
the lines of a real study are checked in tests/test_workflow.py."""

import io
import json
import logging
from pathlib import Path

from trainscale.launch import progress
from trainscale.launch import terminal as ts_terminal
from trainscale.plan.matrix import RunSpec


def event(name: str, **fields) -> logging.LogRecord:
    """A record as Snakemake's logger makes one: its `extra` fields are attributes."""
    r = logging.LogRecord("snakemake.logging", logging.INFO, __file__, 0, "msg", None, None)
    r.__dict__.update(event=name, **fields)
    return r


def write(tmp: Path, run: str, **rec) -> None:
    path = tmp / run / "metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_per_finished_run_with_what_is_left(tmp_path):
    lines, clock = [], Clock()
    p = progress.Progress(
        lambda w: str(tmp_path / w["run"] / "metrics.json"), ["workers"],
        lambda line, shown: lines.append(line), clock=clock,
    )  # fmt: skip
    log = logging.getLogger("test-progress")
    log.addHandler(p)
    log.setLevel(logging.INFO)
    log.info("stats", extra={"event": "run_info", "stats": {"train": 3, "all": 1, "total": 4}})
    for jobid, run in ((1, "a"), (2, "b")):
        log.info("job", extra={"event": "job_info", "jobid": jobid, "rule_name": "train",
                               "wildcards": {"run": run}})  # fmt: skip
    log.info("job", extra={"event": "job_info", "jobid": 9, "rule_name": "figures",
                           "wildcards": {}})  # fmt: skip
    spec = {"strategy": "torch-ddp", "workers": 2}
    write(tmp_path, "a", status="ok", spec=spec, throughput=1234.4, tokens_per_second=None)
    clock.now = 110.0
    log.info("done", extra={"event": "job_finished", "job_id": 1})
    log.info("done", extra={"event": "job_finished", "job_id": 9})  # not a run: no line
    assert lines == [
        "trainscale: [1/3] ok torch-ddp workers=2: 1,234 samples/s, job 10 s; "
        "2 to go, about 20 s left"
    ]
    # a run whose job failed (on_failure: stop) after writing its failure record
    write(tmp_path, "b", status="oom", spec={**spec, "workers": 1}, throughput=None)
    clock.now = 130.0
    log.info("error", extra={"event": "job_error", "jobid": 2, "rule_name": "train"})
    assert lines[1] == (
        "trainscale: [2/3] oom, job failed torch-ddp workers=1: -, job 30 s; "
        "1 to go, about 15 s left"
    )
    # tokens/s on token data; the last run says nothing is left; no record: the run's path
    log.info("job", extra={"event": "job_info", "jobid": 3, "rule_name": "train",
                           "wildcards": {"run": "strategy~torch/c"}})  # fmt: skip
    clock.now = 200.0
    log.info("done", extra={"event": "job_finished", "job_id": 3})
    assert lines[2] == "trainscale: [3/3] no record strategy~torch/c: -, job 1 min 10 s; 0 to go"
    write(tmp_path, "d", status="ok", spec=spec, throughput=2.0, tokens_per_second=512.0)
    log.info("job", extra={"event": "job_info", "jobid": 4, "rule_name": "train",
                           "wildcards": {"run": "d"}})  # fmt: skip
    log.info("done", extra={"event": "job_finished", "job_id": 4})
    assert "512 tokens/s" in lines[3]  # past the 3 planned: a repeat a race added, no "0 to go"
    assert lines[3] == ("trainscale: [3+1] ok torch-ddp workers=2: 512 tokens/s, job 0 s; "
                        "a repeat the race asked for (repeats: min/max)")  # fmt: skip
    log.removeHandler(p)


def test_the_terminal_lines_are_bounded_whatever_the_runs():
    """The first, one per 5 % of the runs planned, every failed one and the last planned: at
    most STEPS + 1 lines and the failures, however many runs; racing repeats past the planned
    total keep the pace; a small study shows every line."""
    for total in (75, 1_000, 100_000):
        lines = [d for d in range(1, total + 1) if progress.shown(d, total, failed=False)]
        assert lines[0] == 1 and lines[-1] == total
        assert progress.STEPS <= len(lines) <= progress.STEPS + 1, (total, len(lines))
    assert progress.shown(7, 75, failed=True) and not progress.shown(7, 75, failed=False)
    racing = [d for d in range(76, 101) if progress.shown(d, 75, failed=False)]
    assert racing == [76, 80, 84, 88, 92, 96, 100]
    assert all(progress.shown(d, 12, failed=False) for d in range(1, 13))
    assert all(progress.shown(d, None, failed=False) for d in range(1, 5))  # total not known
    assert all(progress.shown(d, 0, failed=False) for d in range(1, 5))  # a resumed race


def test_a_failed_run_and_the_steps_reach_the_terminal(tmp_path):
    said, clock = [], Clock()
    p = progress.Progress(
        lambda w: str(tmp_path / w["run"] / "metrics.json"),
        ["workers"],
        lambda line, shown: said.append((line.split("]")[0][13:], shown)),
        clock=clock,
    )
    p.handle_event(event("run_info", stats={"train": 40}))
    for i in range(1, 6):
        write(tmp_path, f"r{i}", status="oom" if i == 3 else "ok", spec={"workers": 1})
        p.handle_event(event("job_info", jobid=i, rule_name="train", wildcards={"run": f"r{i}"}))
        p.handle_event(event("job_finished", job_id=i))
    shown = [("1/40", True), ("2/40", True), ("3/40", True), ("4/40", True), ("5/40", False)]
    assert said == shown


def test_watch_marks_the_lines_only_the_log_file_keeps(tmp_path):
    """watch's lines go through Snakemake's logger, those the terminal holds back marked."""
    records: list[logging.LogRecord] = []
    log = logging.getLogger("test-watch")
    log.propagate = False
    log.setLevel(logging.INFO)
    keep = logging.Handler()
    keep.emit = records.append
    log.addHandler(keep)
    handler = progress.watch(log, lambda w: str(tmp_path / w["run"] / "metrics.json"), [])
    log.info("stats", extra={"event": "run_info", "stats": {"train": 40}})
    for i in (1, 2, 3):
        write(tmp_path, f"r{i}", status="ok", spec={"strategy": "torch"})
        job = {"event": "job_info", "jobid": i, "rule_name": "train", "wildcards": {"run": f"r{i}"}}
        log.info("job", extra=job)
        log.info("done", extra={"event": "job_finished", "job_id": i})
    log.removeHandler(handler)
    log.removeHandler(keep)
    lines = [r for r in records if r.getMessage().startswith("trainscale: [")]
    said = [(r.getMessage()[:18], getattr(r, progress.DETAIL)) for r in lines]
    held = [("trainscale: [1/40]", False), ("trainscale: [2/40]", False)]
    assert said == [*held, ("trainscale: [3/40]", True)]


def test_durations_and_the_keys_that_tell_cells_apart():
    assert [progress.duration(s) for s in (4.4, 59.6, 410, 7500)] == [
        "4 s", "1 min 0 s", "6 min 50 s", "2 h 05 min",
    ]  # fmt: skip
    base = dict(
        study="s", strategy="torch", model="seed-small", dataset="digits", scale=1,
        batch_size=64, batch_mode="global", workers=1, nodes=1, precision="fp32", repeat=0,
        seed=0, epochs=2, optimizer="adam", lr=1e-3, base_lr=1e-3, lr_scaling="none",
        betas=(0.9, 0.999), eps=1e-7, weight_decay=0.0, momentum=0.0, global_batch_size=64,
        per_worker_batch_size=64, world_size=1, threads_per_worker=1, timeout_minutes=5,
        target_accuracy=None, data_dir="data",
    )  # fmt: skip
    runs = [RunSpec(**base), RunSpec(**{**base, "strategy": "torch-ddp", "repeat": 1})]
    keys = ["strategy", "model", "workers", "exclude", "repeat"]
    assert progress.varying(runs, keys) == ["strategy", "repeat"]
    assert progress.varying([], keys) == []


def test_the_terminal_shows_progress_and_errors_and_the_log_file_keeps_every_block(tmp_path):
    """Under the profile's `quiet: [rules, host]` (trainscale.launch.terminal.show_people):
    Snakemake's own filters, its terminal given errors back and what progress lines replace
    held back, its log file given everything back."""
    from snakemake.logging import DefaultFilter
    from snakemake.settings.enums import Quietness

    log = logging.getLogger("test-terminal")
    log.propagate, terminal_out = False, io.StringIO()
    log.setLevel(logging.INFO)
    terminal = logging.StreamHandler(terminal_out)
    file = logging.FileHandler(tmp_path / "snakemake.log")
    for handler in (terminal, file):  # as Snakemake sets them up, from the profile's setting
        handler.addFilter(
            DefaultFilter({Quietness.RULES, Quietness.HOST}, False, False, False, False)
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    ts_terminal.show_people(log)
    said = [("job_info", "rule train:"), ("job_finished", "Finished jobid: 1"),
            ("progress", "1 of 2 steps"), ("job_error", "Error in rule train:"),
            (None, "Execute 2 jobs..."), (None, "trainscale: [1/2] ok torch")]  # fmt: skip
    for name, message in said:
        log.info(message, extra={"event": name} if name else {})
    # a run's line the terminal holds back (trainscale.launch.progress.watch, DETAIL)
    log.info("trainscale: [2/40] ok torch", extra={progress.DETAIL: True})
    for handler in (terminal, file):
        log.removeHandler(handler)
        handler.close()
    shown = terminal_out.getvalue().splitlines()
    assert shown == ["Error in rule train:", "trainscale: [1/2] ok torch"]
    kept = (tmp_path / "snakemake.log").read_text()
    assert "rule train:" in kept and "Finished jobid: 1" in kept and "Error in rule" in kept
    assert "trainscale: [2/40] ok torch" in kept
