# Config `repeats: {min, max}` (docs/tune.md, "Repeats a study buys"): every cell runs `min`
# repeats; a checkpoint per look reads every record so far and names the cells of a panel's
# could-be-fastest set that are not resolved (trainscale.analysis.repeats); each gets one more
# repeat, an ordinary train job with the next repeat number; until `max` or resolved. The
# tables (runs_table) read every repeat made. With an integer `repeats` nothing here runs.


def look_result(look):
    """Look `look` of the racing step (repeats.smk), once its checkpoint has run."""
    path = checkpoints.repeats_look.get(look=look).output[0]
    return json.loads(Path(path).read_text())


def asked_runs(looks):
    """(the run paths asked by looks 1..`looks` and every cell's first repeats, whether a
    look among them asked nothing: the race ended there)."""
    paths = list(FIRST_RUNS)
    for look in range(1, looks + 1):
        more = look_result(look)["next"]
        if not more:
            return paths, True
        paths += more
    return paths, False


def look_inputs(wildcards):
    """Look L's inputs: the records of every run asked before it, and look L-1's result."""
    look = int(wildcards.look)
    if look > REPEATS_MAX - REPEATS_MIN:
        raise ValueError(
            f"repeats: look {look} is past max − min = {REPEATS_MAX - REPEATS_MIN}"
        )
    paths, ended = asked_runs(look - 1)
    if ended:
        raise ValueError(f"repeats: the race ended before look {look}")
    previous = (
        [checkpoints.repeats_look.get(look=look - 1).output[0]] if look > 1 else []
    )
    return {"metrics": metrics_of(paths), "previous": previous}


def study_metrics(wildcards):
    """Every repeat the study made: with repeats {min, max}, those the looks asked (until
    one asks nothing, or the last, max − min, has run) beside the first `min`."""
    if not RACING:
        return all_metrics()
    return metrics_of(asked_runs(REPEATS_MAX - REPEATS_MIN)[0])


checkpoint repeats_look:
    input:
        unpack(look_inputs),
    output:
        f"{RESULTS}/repeats/look~{{look}}.json",
    log:
        f"logs/{STUDY}/repeats/look~{{look}}.log",
    wildcard_constraints:
        look=r"[1-9][0-9]*",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        low=REPEATS_MIN,
        high=REPEATS_MAX,
    script:
        "../scripts/repeats_look.py"
