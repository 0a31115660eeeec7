# trainscale: which distributed-training strategy trains this model fastest, at what cost?
# Thin entry point (snakemake-workflows layout): config, includes (common.smk validates the
# config), `rule all`.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


report: "reports/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/repeats.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/collectives.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/tune.smk"


rule all:
    default_target: True
    input:
        f"{RESULTS}/runs.csv",
        f"{RESULTS}/summary.txt",
        f"{RESULTS}/scaling.csv",
        f"{RESULTS}/report.html",
        f"{RESULTS}/scaling-card.json",
        prediction_files(),


onstart:
    check_local_capacity()


onsuccess:
    print_results_location()
