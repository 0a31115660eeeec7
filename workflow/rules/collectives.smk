# The all-reduce microbenchmark (trainscale/runners/collectives.py), once per (backend, workers, nodes)
# of the study, and the tables built from it: collectives.csv (bus bandwidth by message size)
# and communication.csv (the communication model of every DDP-family cell).


rule collectives:
    output:
        json=f"{RESULTS}/collectives/backend~{{backend}}/workers~{{workers}}/nodes~{{nodes}}.json",
    log:
        f"logs/{STUDY}/collectives/backend~{{backend}}/workers~{{workers}}/nodes~{{nodes}}.log",
    wildcard_constraints:
        backend="gloo|nccl",
        workers=r"\d+",
        nodes=r"\d+",
    conda:
        "../../envs/torch.yaml"
    threads: lambda w: int(w.workers) * config["threads_per_worker"]
    resources:
        **job_resources(collectives_request),
    params:
        models=" ".join(f"--model {p}" for p in COLLECTIVE_PAIRS),
        threads=config["threads_per_worker"],
        warmup=config["collectives"]["warmup"],
        iters=config["collectives"]["iters"],
        timeout=config["collectives"]["timeout_minutes"],
        max_bytes=config["collectives"]["max_bytes"] or 0,
        study=STUDY,
    shell:
        "python -m trainscale.runners.collectives --backend {wildcards.backend}"
        " --workers {wildcards.workers} --nodes {wildcards.nodes} --threads {params.threads}"
        " --warmup {params.warmup} --iters {params.iters} --timeout-minutes {params.timeout}"
        " --max-bytes {params.max_bytes}"
        " --study {params.study} {params.models}"
        " --out {output.json:q} > {log:q} 2>&1"


rule collectives_table:
    input:
        benchmarks=collective_files(),
        runs=rules.runs_table.output.runs,
        scaling=rules.scaling_table.output.scaling,
    output:
        collectives=report(
            f"{RESULTS}/collectives.csv",
            caption="../../reports/collectives.rst",
            category="Tables",
            labels={"table": "all-reduce bandwidth"},
        ),
        communication=report(
            f"{RESULTS}/communication.csv",
            caption="../../reports/communication.rst",
            category="Tables",
            labels={"table": "communication model"},
        ),
    log:
        f"logs/{STUDY}/collectives_table.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/collectives_table.py"
