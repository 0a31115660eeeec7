# Predicted scaling (trainscale/analysis/predict.py): the step-time model fitted to the measured runs and
# the all-reduce benchmark, extrapolated to predict.world_sizes with bootstrap bands, and its
# leave-one-out check. On (predict.enabled, the default) when the study has a multi-worker cell
# (PREDICT and prediction_files() in common.smk).
rule predictions:
    input:
        runs=rules.runs_table.output.runs,
        collectives=rules.collectives_table.output.collectives,
        card=[config["predict"]["card"]] if config["predict"].get("card") else [],
    output:
        **svg_outputs(["predicted_scaling"]),
        predictions=report(
            f"{RESULTS}/predictions.csv",
            caption="../../reports/predictions.rst",
            category="Tables",
            labels={"table": "predicted scaling"},
        ),
        check=report(
            f"{RESULTS}/prediction_check.csv",
            caption="../../reports/prediction_check.rst",
            category="Tables",
            labels={"table": "prediction check (leave-one-out)"},
        ),
        png=report(
            f"{RESULTS}/figures/predicted_scaling.png",
            caption="../../reports/figures/predicted_scaling.rst",
            category="Scaling",
            labels={"figure": "Predicted scaling", **STUDY_LABELS},
        ),
    log:
        f"logs/{STUDY}/predictions.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        predict=config["predict"],
        report=config["report"],
    script:
        "../scripts/predictions.py"
