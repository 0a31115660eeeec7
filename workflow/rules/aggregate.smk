rule runs_table:
    input:
        metrics=all_metrics(),
    output:
        csv=report(
            f"{RESULTS}/runs.csv",
            caption="../../reports/runs.rst",
            category="Tables",
            labels={"table": "runs"},
        ),
        summary=f"{RESULTS}/summary.txt",
    log:
        f"logs/{STUDY}/runs_table.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/runs_table.py"
