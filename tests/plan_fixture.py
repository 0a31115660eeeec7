"""The planned runs and drops of every `.test/` study (and config.yaml), as the workflow plans
them with accelerator cpu, condensed to a sha256 per study: `python tests/plan_fixture.py`
rewrites tests/data/study_plans.json (written before issue 72 moved the planning out of
common.smk); tests/test_study_plan.py compares `study_plan` with it."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "study_plans.json"


def study_files() -> list[Path]:
    """config.yaml and every study of .test/, as `snakemake --configfile` is given them."""
    return [ROOT / "config.yaml", *sorted((ROOT / ".test").glob("*.yaml"))]


def digest(runs: list, dropped: list) -> dict:
    """Every field of every run spec (by path) and every drop with its reason, hashed; the
    checkout's own path written as <root> so the digest holds in any worktree."""
    text = json.dumps(
        {
            "runs": [[r.path, r.to_dict()] for r in runs],
            "dropped": [[d.values, d.reason] for d in dropped],
        },
        sort_keys=True,
        default=str,
    ).replace(str(ROOT), "<root>")
    return {
        "runs": len(runs),
        "dropped": len(dropped),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }


def plan_before(path: Path) -> dict:
    """The study planned as common.smk planned it before `study_plan`: build_runs, then
    fit.within_limits on memory.resolve's check."""
    from trainscale.plan import check, fit, matrix
    from trainscale.plan.preflight import memory
    from trainscale.plan.studyconfig import StudyConfig

    config, problems = check.load_config(path)
    if problems:  # data a study needs made first (results/export/...): not plannable here
        return {"not_plannable": len(problems)}
    config.pop("_inherited")
    runs, dropped = matrix.build_runs(config, "cpu", None)
    study = StudyConfig.from_filled(config)
    limits = memory.resolve(study.memory, "cpu")
    runs, dropped, _ = fit.within_limits(limits, runs, dropped, "cpu", study)
    return digest(runs, dropped)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "workflow"))
    plans = {str(p.relative_to(ROOT)): plan_before(p) for p in study_files()}
    FIXTURE.write_text(json.dumps(plans, indent=1, sort_keys=True) + "\n")
    print(json.dumps(plans, indent=1))
