# Figures and the study's HTML report. The figure kinds are listed once, in
# reports/figures.yaml (read here without pandas or matplotlib, so parsing stays fast).
from pathlib import Path

import yaml

FIGURES = yaml.safe_load(
    (Path(workflow.basedir) / "reports" / "figures.yaml").read_text()
)
FIGURE_CAPTIONS = Path(workflow.basedir) / "reports" / "figures"


#: Labels of every figure in `snakemake --report`, next to its title: for which runs it is.
STUDY_LABELS = {
    key: ", ".join(sorted({getattr(r, key) for r in RUNS}))
    for key in ("strategy", "model", "dataset")
}


rule figure:
    input:
        runs=rules.runs_table.output.csv,
        epochs=rules.runs_table.output.epochs,
        scaling=rules.scaling_table.output.csv,
        collectives=rules.collectives_table.output.collectives,
    output:
        svg=report(
            f"{RESULTS}/figures/{{figure}}.svg",
            caption="../../reports/figure.rst",
            category=lambda w: FIGURES[w.figure]["category"],
            labels=lambda w: {"figure": FIGURES[w.figure]["title"], **STUDY_LABELS},
        ),
        png=f"{RESULTS}/figures/{{figure}}.png",
    log:
        f"logs/{STUDY}/figures/{{figure}}.log",
    wildcard_constraints:
        figure="|".join(FIGURES),
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        caption=lambda w: " ".join(
            (FIGURE_CAPTIONS / f"{w.figure}.rst").read_text().split()
        ),
    script:
        "../scripts/figure.py"


rule report_html:
    input:
        runs=rules.runs_table.output.csv,
        epochs=rules.runs_table.output.epochs,
        invalid=rules.runs_table.output.invalid,
        scaling=rules.scaling_table.output.csv,
        collectives=rules.collectives_table.output.collectives,
        communication=rules.collectives_table.output.communication,
        figures=expand(f"{RESULTS}/figures/{{figure}}.png", figure=FIGURES),
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
    script:
        "../scripts/report_html.py"
