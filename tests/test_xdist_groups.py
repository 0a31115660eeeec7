"""`--dist loadgroup` groups this suite's tests (tests/xdist_groups.py): a study's tests run on
one worker, which builds its session fixture once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

CONFTEST = '''
import os
from pathlib import Path

import pytest

from xdist_groups import pytest_collection_modifyitems, pytest_runtest_call  # noqa: F401


@pytest.fixture(scope="session")
def study():
    """Built once per worker that runs a test of the study: one line per build."""
    with open(Path(__file__).parent / "built", "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
'''
#: the toy suites import tests/xdist_groups.py and trainscale as this suite does
SUITE_ENV = dict(
    os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT / "workflow")])
)
STUDY_TESTS = """
import os
from pathlib import Path


def ran(name):
    (Path(__file__).parent / "ran").mkdir(exist_ok=True)
    (Path(__file__).parent / "ran" / name).write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_a_study_runs_on_one_worker_and_is_built_once(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    suite = tmp_path / "tests"  # a conftest below the root, as this suite's (its fixtures' baseid)
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for module in ("a", "b"):  # a study's tests in two files, and tests of no study beside them
        tests = "".join(
            f"\n\ndef test_{module}{i}(study):\n    ran('{module}{i}')\n" for i in range(3)
        )
        tests += "".join(f"\n\ndef test_{module}_alone{i}():\n    pass\n" for i in range(3))
        (suite / f"test_{module}.py").write_text(STUDY_TESTS + tests)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
    done = subprocess.run(
        [*command, "--dist", "loadgroup", "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
        cwd=tmp_path, env=SUITE_ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "12 passed" in done.stdout
    workers = {path.read_text() for path in (suite / "ran").iterdir()}
    assert len(list((suite / "ran").iterdir())) == 6 and len(workers) == 1, workers
    assert (suite / "built").read_text().split() == list(workers)


def test_a_study_fetched_by_name_fails_the_test_that_fetches_it(tmp_path: Path) -> None:
    """Fetched with request.getfixturevalue, a study is outside the test's group: the test
    fails with the fix, even where the study was built already (one worker, in file order)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    suite = tmp_path / "tests"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_a.py").write_text(
        STUDY_TESTS + "\n\ndef test_named(study):\n    ran('named')\n"
        "\n\ndef test_fetched(request):\n    request.getfixturevalue('study')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-n", "1", "-c", str(tmp_path / "pytest.ini"), str(suite / "test_a.py")],
        cwd=tmp_path, env=SUITE_ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "reads the session fixture(s) study without naming them in its signature" in done.stdout


def test_every_test_marked_alone_is_in_a_file_the_alone_phase_runs() -> None:
    """`make test` runs `-m alone` over the Makefile's ALONE files only (collecting the whole
    suite again would cost ~10 s): a marked test elsewhere would run in neither phase."""
    import re

    listed = re.search(r"^ALONE := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    marked = {
        f"tests/{path.name}"
        for path in (ROOT / "tests").glob("test_*.py")
        if re.search(r"^(pytestmark = |@)pytest\.mark\.alone\b", path.read_text(), re.M)
    }
    assert marked == set(listed.split())
