# `snakemake tune --configfile STUDY` (`trainscale tune STUDY`): the fastest or cheapest cells
# of the study's matrix by successive halving with a statistical stop (trainscale/tune,
# docs/tune.md). Round 0 plans (no jobs); each round's runs are ordinary training jobs under
# results/<study>/tune/round~R/runs/; a checkpoint per round reads their records and decides
# which cells go on, and the next round's runs are read from it: the DAG grows with the data,
# so `snakemake tune --profile slurm` tunes on the cluster's queue. Helpers: tune_common.smk.


include: "tune_common.smk"


rule tune_train:
    input:
        tune_inputs,
    output:
        metrics=f"{TUNE_DIR}/round~{{round}}/runs/{{run}}/metrics.json",
    log:
        f"logs/{STUDY}/tune/round~{{round}}/{{run}}.log",
    wildcard_constraints:
        round=r"[1-9][0-9]*",
    conda:
        tune_conda_env
    threads: tune_threads
    resources:
        **job_resources(tune_request, RUN_REQUESTS.values()),
    params:
        spec=tune_spec_json,
        index=lambda wildcards: tune_index(),
    shell:
        # a failed run writes its record and the tune goes on without it, whatever on_failure
        launch_command("record", env=f"{ts_memory.INDEX_ENV}={{params.index:q}} ")


rule tune_plan:
    output:
        TUNE_SPACE,
    log:
        f"logs/{STUDY}/tune/round~0.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        space=lambda wildcards: tune_space().to_json(),
    script:
        "../scripts/tune_plan.py"


checkpoint tune_round:
    input:
        unpack(tune_round_inputs),
    output:
        f"{TUNE_DIR}/round~{{round}}/round.json",
    log:
        f"logs/{STUDY}/tune/round~{{round}}.log",
    wildcard_constraints:
        round=r"[1-9][0-9]*",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/tune_round.py"


rule tune_results:
    input:
        space=TUNE_SPACE,
        rounds=tune_rounds,
    output:
        csv=report(
            f"{TUNE_DIR}/tune.csv",
            caption="../../reports/tune-table.rst",
            category="Tune",
            labels={"table": "tune"},
        ),
        best=f"{TUNE_DIR}/best.yaml",
        html=report(
            f"{TUNE_DIR}/report.html",
            caption="../../reports/tune.rst",
            category="Tune",
            labels={"report": f"tune of study {STUDY} (self-contained HTML)"},
        ),
    log:
        f"logs/{STUDY}/tune/results.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/tune_results.py"


rule tune:
    input:
        rules.tune_results.output,
