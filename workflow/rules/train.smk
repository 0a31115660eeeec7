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


# The build jobs below take every core and go first (BUILD_THREADS, BUILD_PRIORITY in
# common.smk): no timed run shares the CPU with a compiler.
rule deepspeed_ops:
    output:
        touch(DEEPSPEED_OPS),
    log:
        "logs/deepspeed_ops.log",
    priority: BUILD_PRIORITY
    conda:
        "../../envs/deepspeed.yaml"
    threads: BUILD_THREADS
    resources:
        **job_resources(build_request),
    shell:
        # the absolute path the runs get (trainscale.launch.slurm.detect): torch rebuilds an op whose
        # build directory is named differently, and the first DeepSpeed run would build it again
        'TORCH_EXTENSIONS_DIR="$PWD/.cache/torch_extensions" MAX_JOBS={threads}'
        " python -m trainscale.runners.torch.deepspeed_zero --build-ops > {log:q} 2>&1"


# DeepSpeed's CPU Adam, which steps an offloaded optimizer (matrix offload), built once
rule deepspeed_cpu_adam:
    output:
        touch(DEEPSPEED_CPU_ADAM),
    log:
        "logs/deepspeed_cpu_adam.log",
    priority: BUILD_PRIORITY
    conda:
        "../../envs/deepspeed.yaml"
    threads: BUILD_THREADS
    resources:
        **job_resources(build_request),
    shell:
        'TORCH_EXTENSIONS_DIR="$PWD/.cache/torch_extensions" MAX_JOBS={threads}'
        " python -m trainscale.runners.torch.deepspeed_zero --build-ops cpu-adam > {log:q} 2>&1"


# Horovod, built from source into the Python that runs Snakemake where a Horovod cell needs it
# and it is missing (HOROVOD_TO_BUILD in common.smk; `make horovod` writes the same stamp). On
# the submitting host under SLURM: the build downloads Horovod's sdist from PyPI.
rule horovod:
    output:
        touch(HOROVOD_STAMP),
    log:
        "logs/horovod.log",
    priority: BUILD_PRIORITY
    localrule: True
    conda:
        "../../envs/horovod.yaml"
    threads: BUILD_THREADS
    resources:
        mem_mb=build_mem_mb(BUILD_THREADS),
    params:
        python=sys.executable,
        script=f"{workflow.basedir}/scripts/build-horovod.sh",
        cache=f"{workflow.basedir}/.cache/horovod",  # the Makefile's, unless HOROVOD_CACHE is set
    shell:
        'HOROVOD_BUILD_JOBS={threads} HOROVOD_CACHE="${{HOROVOD_CACHE:-{params.cache}}}"'
        " bash {params.script:q} {params.python:q} > {log:q} 2>&1"
