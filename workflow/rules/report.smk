# Figures and the study's HTML report. The figure kinds are listed once, in
# reports/figures.yaml (read in common.smk without pandas or matplotlib: parsing stays fast).
# All figures in one job: drawing them needs matplotlib, seaborn and pandas (3 s to import),
# so one process draws them all, forking `threads` processes that share the tables.
rule figures:
    input:
        runs=rules.runs_table.output.runs,
        epochs=rules.runs_table.output.epochs,
        scaling=rules.scaling_table.output.scaling,
        collectives=rules.collectives_table.output.collectives,
    output:
        **figure_outputs(),
    log:
        f"logs/{STUDY}/figures.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    threads: 2
    script:
        "../scripts/figures.py"


rule report_html:
    input:
        runs=rules.runs_table.output.runs,
        epochs=rules.runs_table.output.epochs,
        invalid=rules.runs_table.output.invalid,
        scaling=rules.scaling_table.output.scaling,
        collectives=rules.collectives_table.output.collectives,
        communication=rules.collectives_table.output.communication,
        figures=[f"{RESULTS}/figures/{name}.png" for name in FIGURES],
        card=rules.scaling_card.output.card,
        predictions=prediction_files(),
    output:
        html=report(
            f"{RESULTS}/report.html",
            caption="../../reports/report.rst",
            category="Report",
            labels={"report": f"study {STUDY} (self-contained HTML)"},
        ),
    log:
        f"logs/{STUDY}/report_html.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        compare_with=config.get("compare_with"),  # a "Compared with …" section when set
    script:
        "../scripts/report_html.py"
