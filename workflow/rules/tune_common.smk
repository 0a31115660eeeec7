# The helpers of the tune's rules (tune.smk): round 0's plan, each tune run's spec, threads,
# environment, inputs and SLURM request (its cell's), and the rounds' inputs read from the
# checkpoints before them.
import functools
import json
import sys

TUNE_DIR = f"{RESULTS}/tune"
TUNE_SPACE = f"{TUNE_DIR}/round~0/space.json"


@functools.cache
def tune_space():
    """Round 0 (trainscale.tune.space.plan) from the study's planned runs, made when a tune
    job is first planned (it imports pandas: a study that does not tune never pays for it).
    """
    from trainscale.tune import space

    try:
        planned = space.plan(config, RUNS, DROPPED, PREDICTED)
    except space.ConfigError as e:
        raise ValueError(f"config: {e}") from None
    print(
        f"trainscale: tune {STUDY!r}, round 1 predicted: {planned.first_round().words()}",
        file=sys.stderr,
    )
    return planned


@functools.cache
def tune_index():
    """The memory index of every run a tune may start (each cell's prediction, held by its
    spec), for their launcher to record, as the study's runs record theirs; "" where nothing
    was predicted."""
    space = tune_space()
    runs = space.every_run()
    predicted = {s.path: PREDICTED[space.study_spec(s.path).path]
                 for s in runs} if PREDICTED else {}  # fmt: skip
    return str(ts_memory.write_index(f"{STUDY}-tune", predicted, runs) or "")


def tune_run_of(wildcards):
    try:
        return tune_space().spec(int(wildcards.round), wildcards.run)
    except ValueError as e:
        raise ValueError(
            f"{e}: config.yaml and the study file define no such run"
        ) from None


def tune_cell_run(wildcards):
    """The study's own first run of the tune run's cell: its input files and SLURM request
    are the tune run's."""
    tune_run_of(wildcards)  # an unknown run is named as such
    return tune_space().study_spec(wildcards.run).path


@per_job
def tune_spec_json(wildcards):
    return tune_run_of(wildcards).to_json()


@per_job
def tune_threads(wildcards):
    return threads_of(tune_run_of(wildcards))


@per_job
def tune_conda_env(wildcards):
    return conda_env_of(tune_run_of(wildcards))


@per_job
def tune_inputs(wildcards):
    return list(RUN_INPUTS[tune_cell_run(wildcards)])


def tune_request(wildcards):
    return RUN_REQUESTS[tune_cell_run(wildcards)]


def tune_round_json(round):
    """Round `round`'s result, once its checkpoint has run (Snakemake waits for it)."""
    path = checkpoints.tune_round.get(round=round).output[0]
    return path, json.loads(Path(path).read_text())


def tune_round_inputs(wildcards):
    """Round R's inputs: round 0's plan, round R-1's result, and the records of every run of
    rounds 1..R (the race replays every cell's runs): round 1's asked by the plan, round r's
    by round r-1's result.
    """
    round = int(wildcards.round)
    asked, previous = {1: tune_space().first_runs()}, []
    for r in range(1, round):
        path, result = tune_round_json(r)
        if result["done"] and r == round - 1:
            raise ValueError(f"tune: round {r} ended it ({result['done']})")
        asked[r + 1], previous = result["next"], [path]
    runs = [f"{TUNE_DIR}/round~{r}/runs/{c}/repeat~{i}/metrics.json"
            for r, cells in asked.items() for c, repeats in cells.items() for i in repeats]  # fmt: skip
    return {"space": TUNE_SPACE, "previous": previous, "runs": runs}


def tune_rounds(wildcards):
    """Every round's result up to the one that ended the tune."""
    paths, round = [], 1
    while True:
        path, result = tune_round_json(round)
        paths.append(path)
        if result["done"]:
            return paths
        round += 1
