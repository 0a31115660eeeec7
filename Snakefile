# trainscale: which distributed-training strategy trains this model fastest, at what cost?
# Thin entry point (snakemake-workflows layout): config, validation, includes, `rule all`.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    default_target: True
    input:
        f"{RESULTS}/runs.csv",
        f"{RESULTS}/summary.txt",


onsuccess:
    print_results_location()
