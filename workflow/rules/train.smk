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
    resources:
        **job_resources(run_request, RUN_REQUESTS.values()),
    params:
        spec=run_spec_json,
        on_failure=config["on_failure"],  # params as well: a change re-runs the runs
        retry_lost=config["retry_lost_runs"],
    shell:
        launch_command(config["on_failure"])


# `snakemake check --profile slurm`: what each task of each allocation shape sees (host,
# CUDA_VISIBLE_DEVICES, nvidia-smi -L, torch's devices), launched exactly as its runs are.
rule probe:
    output:
        f"{RESULTS}/check/{{run}}.txt",
    log:
        f"logs/{STUDY}/check/{{run}}.log",
    conda:
        "../../envs/torch.yaml"
    threads: run_threads
    resources:
        **job_resources(run_request, RUN_REQUESTS.values()),
    params:
        spec=run_spec_json,
    shell:
        "python -m trainscale.launch --spec {params.spec:q} --probe > {output:q} 2> {log:q}"


rule check:
    input:
        check_targets(),
    log:
        f"logs/{STUDY}/check.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    shell:
        "tail -n +1 {input:q} | tee {log:q}"


rule deepspeed_ops:
    output:
        touch(DEEPSPEED_OPS),
    log:
        "logs/deepspeed_ops.log",
    conda:
        "../../envs/deepspeed.yaml"
    resources:
        **job_resources(build_request),
    shell:
        # the absolute path the runs get (trainscale.launch.slurm.detect): torch rebuilds an op whose
        # build directory is named differently, and the first DeepSpeed run would build it again
        'TORCH_EXTENSIONS_DIR="$PWD/.cache/torch_extensions"'
        " python -m trainscale.runners.torch.deepspeed_zero --build-ops > {log:q} 2>&1"


# DeepSpeed's CPU Adam, which steps an offloaded optimizer (matrix offload), built once
rule deepspeed_cpu_adam:
    output:
        touch(DEEPSPEED_CPU_ADAM),
    log:
        "logs/deepspeed_cpu_adam.log",
    conda:
        "../../envs/deepspeed.yaml"
    resources:
        **job_resources(build_request),
    shell:
        'TORCH_EXTENSIONS_DIR="$PWD/.cache/torch_extensions"'
        " python -m trainscale.runners.torch.deepspeed_zero --build-ops cpu-adam > {log:q} 2>&1"
