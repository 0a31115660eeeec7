"""A pytest plugin that makes a GPU path's test impossible to lose silently.

Tests of GPU paths are marked `gpu` (`pytest.mark.gpu(path=NAME)`, NAME one of
`trainscale.gpu.check.names()`) and skip themselves where there is no CUDA device. That skip is
right on a CPU machine and wrong on a GPU node, where it would hide a broken CUDA install (a CPU
build of torch, a driver torch cannot use) or a test someone deselected or deleted. So on a node
that has CUDA (torch sees a device, or an NVIDIA driver is present), or when `--require-gpu` is
given, the session fails when

- a `gpu` test was skipped (except an optional path, `gpu_check.OPTIONAL`, skipped as "not
  installed") or deselected (`-m`, `-k`), or
- the whole suite ran (or any `gpu` test was collected) and a GPU path had no `gpu` test that ran.

Every session ends with one line, `gpu tests: N ran, M skipped[, D deselected]`.
tests/conftest.py takes these hooks as the suite's; `-p gpu_guard` loads them elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

#: How a skip of an optional path must begin to be allowed on a GPU node.
NOT_INSTALLED = "not installed"


@dataclass
class Tally:
    """What became of every `gpu` test of the session."""

    paths: dict[str, str | None] = field(default_factory=dict)  # nodeid -> GPU path
    outcome: dict[str, str] = field(default_factory=dict)  # nodeid -> ran/skipped/deselected
    reason: dict[str, str] = field(default_factory=dict)  # nodeid -> skip reason

    def counts(self) -> tuple[int, int, int]:
        values = list(self.outcome.values())
        return values.count("ran"), values.count("skipped"), values.count("deselected")

    def line(self) -> str:
        ran, skipped, deselected = self.counts()
        return f"gpu tests: {ran} ran, {skipped} skipped" + (
            f", {deselected} deselected" if deselected else ""
        )


def problems(
    tally: Tally, expected: list[str], optional: frozenset[str], whole_suite: bool
) -> list[str]:
    """Why this session's GPU coverage is not acceptable on a node with CUDA; [] if it is."""
    out = []
    accounted = set()  # paths whose tests ran, or were reported above
    for nodeid, outcome in tally.outcome.items():
        path, reason = tally.paths.get(nodeid), tally.reason.get(nodeid, "")
        accounted.add(path)
        allowed = outcome == "skipped" and path in optional and reason.startswith(NOT_INSTALLED)
        if outcome == "skipped" and not allowed:
            out.append(f"{nodeid} was skipped where GPU tests must run: {reason}")
        elif outcome == "deselected":
            out.append(f"{nodeid} was deselected where GPU tests must run")
    if whole_suite or tally.outcome:
        missing = [p for p in expected if p not in accounted]
        out += [f"no gpu test for the GPU path {p!r}" for p in missing]
    return out


def cuda_expected() -> bool:
    """Torch sees a CUDA device, or the node has an NVIDIA driver that torch should use."""
    from trainscale.gpu import check as gpu_check

    return gpu_check.cuda_state()[0] != "none"


_TALLY = pytest.StashKey[Tally]()
_PROBLEMS = pytest.StashKey[list]()
_PATH_PROPERTY = "gpu_path"
_CONFIG: list[pytest.Config] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-gpu",
        action="store_true",
        help="fail unless every GPU path's test ran, even where no CUDA device is seen",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu(path): exercises a GPU path; skipped without CUDA")
    config.stash[_TALLY] = Tally()
    _CONFIG[:] = [config]  # pytest_runtest_logreport is given the report alone


def pytest_itemcollected(item: pytest.Item) -> None:
    mark = item.get_closest_marker("gpu")
    if mark is not None:
        item.config.stash[_TALLY].paths[item.nodeid] = mark.kwargs.get("path")


def pytest_deselected(items: list[pytest.Item]) -> None:
    for item in items:
        tally = item.config.stash[_TALLY]
        if item.nodeid in tally.paths:
            tally.outcome[item.nodeid] = "deselected"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    mark = item.get_closest_marker("gpu")
    if mark is not None:  # carried with the report to pytest-xdist's controller
        report.user_properties.append((_PATH_PROPERTY, mark.kwargs.get("path")))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Tallied from the reports, not the items: under pytest-xdist (`make test` runs 2 workers)
    the workers run the tests and only their reports reach the session that judges."""
    props = dict(report.user_properties)
    if _PATH_PROPERTY not in props:
        return
    tally = _CONFIG[0].stash[_TALLY]
    tally.paths[report.nodeid] = props[_PATH_PROPERTY]
    if report.skipped:
        tally.outcome[report.nodeid] = "skipped"
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        tally.reason[report.nodeid] = reason.removeprefix("Skipped: ")
    elif report.when == "call" or report.failed:
        tally.outcome[report.nodeid] = "ran"


def pytest_sessionfinish(session: pytest.Session) -> None:
    from trainscale.gpu import check as gpu_check

    config = session.config
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller judges
        return
    tally = config.stash[_TALLY]
    found = []
    if config.getoption("require_gpu") or cuda_expected():
        whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
        found = problems(tally, gpu_check.names(), gpu_check.OPTIONAL, whole)
    config.stash[_PROBLEMS] = found
    if found and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    terminalreporter.write_line(config.stash[_TALLY].line())
    for p in config.stash.get(_PROBLEMS, []):
        terminalreporter.write_line(f"gpu tests: FAIL {p}", red=True)
