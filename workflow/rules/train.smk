rule train:
    input:
        dataset_files,
    output:
        metrics=f"{RESULTS}/runs/{{run}}/metrics.json",
    log:
        f"logs/{STUDY}/runs/{{run}}.log",
    conda:
        run_conda_env
    threads: run_threads
    params:
        spec=run_spec_json,
    shell:
        "python -m trainscale.launch --spec {params.spec:q} --out {output.metrics:q}"
        " > {log:q} 2>&1"
