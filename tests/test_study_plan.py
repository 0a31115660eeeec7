"""`study_plan` plans every shipped study as the workflow planned it before the planning left
rules/common.smk: the same runs, every field of every run spec, and the same drops with their
reasons (tests/data/study_plans.json, written by tests/plan_fixture.py before the change)."""

import copy
import json
from dataclasses import FrozenInstanceError

import pytest
import yaml
from plan_fixture import FIXTURE, ROOT, digest

from trainscale.plan import Plan, StudyConfig, overlay, study_plan
from trainscale.plan.runspec import ConfigError

PLANS = json.loads(FIXTURE.read_text())


def study_config(name: str) -> dict:
    """The config `snakemake --configfile NAME` meets: the study file over config.yaml."""
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    if name == "config.yaml":
        return base
    return overlay.overlay(base, yaml.safe_load((ROOT / name).read_text()))


@pytest.mark.parametrize("name", [n for n, p in PLANS.items() if "sha256" in p])
def test_same_runs_and_drops_as_before(name):
    plan = study_plan(study_config(name), "cpu")
    assert digest(plan.runs, plan.dropped) == PLANS[name]
    assert list(plan.run_by_path) == [r.path for r in plan.runs]
    assert set(plan.predicted) == set(plan.run_by_path)


def test_the_plan_of_the_default_study():
    config = study_config("config.yaml")
    given = copy.deepcopy(config)
    plan = study_plan(config, "cpu")
    assert isinstance(plan, Plan) and isinstance(plan.config, StudyConfig)
    assert config == given and "eval_tokens" not in config  # the config given is not filled
    assert plan.config.raw["eval_tokens"] == 1048576  # the schema's default, filled once
    assert (plan.repeats_min, plan.repeats_max, plan.racing) == (2, 4, True)
    assert plan.first_runs == [r.path for r in plan.runs if r.repeat < 2]
    assert plan.summary.startswith(f"{len(plan.first_runs)} runs, ")
    with pytest.raises(FrozenInstanceError):
        plan.runs = []  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.config.raw["study"] = "other"  # type: ignore[index]


def test_problems_are_listed_with_their_keys():
    config = {**study_config("config.yaml"), "epoch": 3, "seed": "zero"}
    with pytest.raises(
        ConfigError,
        match=r"fix these keys \(documented in workflow/schemas/"
        r"config.schema.yaml\):\n  - epoch: unknown key; did you mean 'epochs'",
    ):
        study_plan(config)


def test_prices_that_cannot_apply_stop_the_plan():
    config = {**study_config(".test/config.yaml"), "cost": {"device_hour": {"H100": 2.0}}}
    with pytest.raises(ConfigError, match="has no 'cpu-core' price"):
        study_plan(config, "cpu")


def test_study_config_types_the_keys_and_takes_the_schemas_defaults():
    given = {"study": "s", "matrix": {"strategy": ["torch"]}, "optimizer": {"lr": 0.5}}
    study = StudyConfig.from_filled(given)
    assert study.optimizer.lr == 0.5 and study.optimizer.name == "adam"  # the schema's
    assert study.optimizer.betas == (0.9, 0.999) and study.microbatches == 4
    assert (study.repeats.min, study.repeats.max, study.memory.check) == (1, 1, None)
    assert study.raw["matrix"]["strategy"] == ("torch",) and "epochs" not in study.raw
    assert study.as_dict() == given  # the config as given, a copy
    with pytest.raises(ConfigError, match="repeats: max 1 is below min 2"):
        StudyConfig.from_filled({**given, "repeats": {"min": 2, "max": 1}})
