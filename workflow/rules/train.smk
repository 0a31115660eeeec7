rule train:
    input:
        run_inputs,
    output:
        metrics=f"{RESULTS}/runs/{{run}}/metrics.json",
    log:
        f"logs/{STUDY}/runs/{{run}}.log",
    conda:
        run_conda_env
    threads: run_threads
    params:
        spec=run_spec_json,
        on_failure=config["on_failure"],
    shell:
        "python -m trainscale.launch --spec {params.spec:q} --out {output.metrics:q}"
        " --on-failure {params.on_failure} > {log:q} 2>&1"


rule deepspeed_ops:
    output:
        touch(DEEPSPEED_OPS),
    log:
        "logs/deepspeed_ops.log",
    conda:
        "../../envs/deepspeed.yaml"
    shell:
        "TORCH_EXTENSIONS_DIR=.cache/torch_extensions"
        " python -m trainscale.runners.deepspeed_zero --build-ops > {log:q} 2>&1"
