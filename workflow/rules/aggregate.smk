rule runs_table:
    input:
        metrics=study_metrics if RACING else all_metrics(),
    output:
        runs=report(
            f"{RESULTS}/runs.csv",
            caption="../../reports/runs.rst",
            category="Tables",
            labels={"table": "runs"},
        ),
        epochs=f"{RESULTS}/epochs.csv",
        invalid=f"{RESULTS}/invalid.csv",
    log:
        f"logs/{STUDY}/runs_table.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    threads: 4  # processes validating metrics files (capped at --cores)
    script:
        "../scripts/tables.py"


rule scaling_table:
    input:
        runs=rules.runs_table.output.runs,
        invalid=rules.runs_table.output.invalid,
    output:
        scaling=report(
            f"{RESULTS}/scaling.csv",
            caption="../../reports/scaling.rst",
            category="Tables",
            labels={"table": "scaling"},
        ),
        summary=f"{RESULTS}/summary.txt",
    log:
        f"logs/{STUDY}/scaling_table.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        repeats=(REPEATS_MIN, REPEATS_MAX) if RACING else None,  # repeats_taken and why
    script:
        "../scripts/scaling_table.py"


# The card reads every run's metrics.json (params.metrics) once runs.csv, written from those
# same files, is up to date: a second input list of every run would cost a large study's
# dry-run a lookup of each file again (a tenth of it at 8,000 runs).
rule scaling_card:
    input:
        runs=rules.runs_table.output.runs,
        collectives=collective_files(),
    output:
        card=report(
            f"{RESULTS}/scaling-card.json",
            caption="../../reports/scaling-card.rst",
            category="Tables",
            labels={"table": "scaling card"},
        ),
    log:
        f"logs/{STUDY}/scaling_card.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        metrics=all_metrics(),
        raced=RACED_METRICS,  # those made are in runs.csv (a study with repeats {min, max})
    script:
        "../scripts/scaling_card.py"
