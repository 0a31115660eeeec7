import gc
import importlib.util
import inspect
import json
import os
import sys
from pathlib import Path

# The trainscale package lives in workflow/: import it here, and let every job import it and
# run with the interpreter that runs Snakemake (the project's .venv) unless a conda env is
# activated in front of it (see trainscale.launch.commands.job_environment).
sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

# (from trainscale.launch.slurm and launch_commands, not trainscale.launch: that one imports the
# launcher's attempts and metrics modules, a tenth of a second of every Snakemake start)
from trainscale.launch.commands import job_environment
from trainscale.launch.container import CONTAINER_ENV, to_environ
from trainscale.launch.slurm import (
    MEMORY_KEY,
    SLURM_RESOURCE_KEYS,
    build_mem_mb,
    collectives_mem_mb,
    slurm_request,
    slurm_resources,
    with_options,
)
from trainscale.launch import progress as ts_progress
from trainscale.launch import terminal as ts_terminal

os.environ.update(job_environment(Path(workflow.basedir) / "workflow", sys.executable))

import yaml
from snakemake.common import overwrite_function_params
from snakemake.logging import logger as snakemake_logger
from snakemake.settings.types import DeploymentMethod

from trainscale import data as ts_data
from trainscale.report import endnote as ts_endnote
from trainscale.data import imagesets as ts_imagesets
from trainscale.plan import cluster as ts_cluster
from trainscale.plan import machine as ts_machine
from trainscale.plan.preflight import memory as ts_memory
from trainscale.plan import overlay as ts_overlay
from trainscale.plan import study as ts_study


def load_yaml(path):
    """A YAML file of the workflow's own (reports/figures.yaml), read with libyaml where
    PyYAML has it: the pure-Python reader took a tenth of a second of every Snakemake start
    for the config schema alone (trainscale.plan.study reads that one)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(Path(path).read_text(), Loader=loader)


# --configfile FILE was laid over config.yaml by Snakemake (nested keys merged); a study file
# must name its own study, and its `matrix` replaces config.yaml's as a whole
# (trainscale/plan/overlay.py says why; `trainscale check FILE` applies the same rules).
_unnamed = ts_overlay.unnamed_study(
    workflow.config_settings.overwrite_config,
    workflow.overwrite_configfiles,
    config.get("study"),
)
if _unnamed:
    raise ValueError(f"config: {_unnamed}")
ts_overlay.replace_whole_keys(config, workflow.config_settings.overwrite_config)

# The config, checked before any job (every problem listed at once with its key and a fix),
# its defaults filled from the schema once (skipped, as snakemake.utils.validate skips it,
# where the workflow is used as a module with skip_validation), kept as a frozen StudyConfig
# (trainscale.plan.studyconfig); the rules below read the filled `config` as before.
try:
    STUDY_CONFIG = ts_study.validated(
        config, fill_defaults=not workflow.modifier.skip_validation
    )
except ts_study.ConfigError as e:
    raise ValueError(f"config: {e}") from None
config.update(STUDY_CONFIG.as_dict())

# config `env` and `container` reach every job through its environment, outside the run spec
# (changing them re-runs nothing): the variables themselves, and both as JSON for the
# launcher (trainscale.launch.container); set before planning, whose pre-flight children
# inherit them
os.environ.pop(CONTAINER_ENV, None)
os.environ.update(to_environ(config.get("container"), config.get("env") or {}))

STUDY = config["study"]
RESULTS = f"results/{STUDY}"
DEEPSPEED_OPS = ".cache/torch_extensions/deepspeed-ops.done"
#: named for the flags (trainscale.runners.torch.deepspeed_zero.cpu_adam_builder: no -g since
#: issue 71), so a build of the old name, with -g, is built again by the rule, not in a run
DEEPSPEED_CPU_ADAM = ".cache/torch_extensions/deepspeed-cpu-adam-no-g.done"
#: The build jobs (Horovod, DeepSpeed's ops) take every core of this machine and go first: a
#: compiler beside a timed run would slow its steps, and nothing is timed while they build.
#: (Locally Snakemake gives a job at most --cores; under SLURM the builds ask for their own.)
BUILD_THREADS = len(os.sched_getaffinity(0))
BUILD_PRIORITY = 100
#: Horovod has no wheel that loads into this torch and TensorFlow (scripts/build-horovod.sh):
#: the `horovod` rule builds it into the Python that runs the jobs (this one), and writes the
#: stamp `make horovod` writes. Horovod runs wait for it only where that Python lacks Horovod
#: and no conda env brings it (envs/horovod.yaml builds it when conda creates the env).
HOROVOD_STAMP = os.path.relpath(Path(sys.prefix) / ".horovod")
if HOROVOD_STAMP.startswith(".."):
    HOROVOD_STAMP = str(Path(sys.prefix) / ".horovod")
HOROVOD_TO_BUILD = (
    DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method
    and importlib.util.find_spec("horovod") is None
)
ACCELERATOR = ts_machine.detect_accelerator(config["accelerator"])
# the GPUs of this machine, where it has some: a study is planned for the machine it is
# planned on (as memory's limit is), and on a cluster each worker is given a GPU of its own
GPUS_HERE = ts_machine.visible_gpus() if ACCELERATOR == "cuda" else 0

# The study's plan (trainscale.plan.study_plan): its runs, the cells dropped and why, the
# prices checked, each run's predicted memory. The rules read it through these names.
try:
    PLAN = ts_study.study_plan(STUDY_CONFIG, ACCELERATOR, GPUS_HERE or None)
except ts_study.ConfigError as e:
    raise ValueError(f"config: {e}") from None
RUNS = PLAN.runs
DROPPED = PLAN.dropped
PREDICTED = PLAN.predicted
#: config `repeats`: every cell runs REPEATS_MIN repeats (FIRST_RUNS, their paths); with
#: REPEATS_MAX above it the racing step (repeats.smk) asks for more, which RUNS also plans.
REPEATS_MIN, REPEATS_MAX, RACING = PLAN.repeats_min, PLAN.repeats_max, PLAN.racing
FIRST_RUNS = PLAN.first_runs
RUN_BY_PATH = PLAN.run_by_path
# each run's launcher records its prediction from this study's index (its host bytes at
# least: those need no trace)
_index = ts_memory.write_index(STUDY, PREDICTED, RUNS)
if _index:
    os.environ[ts_memory.INDEX_ENV] = str(_index)
else:
    os.environ.pop(ts_memory.INDEX_ENV, None)
# While the study runs, a line per finished run in the log (on the terminal: the first, one per
# 5 % of the runs, failures and the last): its cell (the matrix keys that vary here), status,
# throughput and time, the runs left and an estimate of the time left
# (trainscale.launch.progress; it reads the records Snakemake's finished jobs wrote).
if workflow.is_main_process:
    # the profile's quiet setting hides Snakemake's job blocks from the terminal, not its log
    # file nor a failed job's error (trainscale.launch.terminal)
    ts_terminal.show_people(snakemake_logger)
    ts_progress.watch(
        snakemake_logger,
        lambda wildcards: f"{RESULTS}/runs/{wildcards['run']}/metrics.json",
        ts_progress.varying(RUNS, [*config["matrix"], "repeat"]),
    )
print(f"trainscale: study {STUDY!r}: {PLAN.summary}", file=sys.stderr)
if not config["collectives"]["enabled"]:
    print(
        "trainscale: all-reduce benchmark switched off (collectives.enabled: false): "
        "no communication model",
        file=sys.stderr,
    )
elif config["collectives"]["max_bytes"]:
    print(
        "trainscale: all-reduce benchmark stops at collectives.max_bytes = "
        f"{config['collectives']['max_bytes']} bytes where a gradient is larger (its record "
        "then says cut_short: true)",
        file=sys.stderr,
    )


wildcard_constraints:
    run=r"strategy~[A-Za-z0-9.-]+(/[a-z_]+~[A-Za-z0-9._-]+)+",


def check_local_capacity():
    """Before the first job of a study run on this machine (not through a cluster executor):
    no run may need more nodes, GPUs or cores than it has."""
    if workflow.executor_plugin is None or workflow.executor_plugin.name != "local":
        return
    problems = ts_machine.capacity_problems(
        RUNS, ACCELERATOR, os.cpu_count() or 1, ts_machine.visible_gpus()
    ) + ts_cluster.local_problems(PLAN.config.container)
    if problems:
        raise ValueError(
            "config: this machine cannot run the study as configured:\n  - "
            + "\n  - ".join(problems)
        )


def per_job(func):
    """`func`, a function Snakemake calls for every job (input, params, threads, conda,
    resources), with its signature given once: Snakemake looks up which arguments a function
    takes (inspect.signature) at every call, which was a quarter of a large study's dry-run.
    The parameters given are exactly the ones inspect finds."""
    overwrite_function_params(func, inspect.signature(func).parameters)
    return func


def run_of(wildcards):
    """The frozen RunSpec behind a run path (the only place a path becomes a spec)."""
    try:
        return RUN_BY_PATH[wildcards.run]
    except KeyError:
        raise ValueError(
            f"{wildcards.run} is not a run of study {STUDY!r} as config.yaml defines it"
        ) from None


@per_job
def run_spec_json(wildcards):
    return run_of(wildcards).to_json()


def threads_of(spec):
    """Cores one run occupies on its node: workers × (threads_per_worker + loader_workers),
    plus threads_per_worker for each process beside the workers (tf-ps: servers, chief).
    """
    servers = spec.processes - spec.world_size
    return spec.workers * (spec.threads_per_worker + spec.loader_workers) + (
        servers * spec.threads_per_worker
    )


@per_job
def run_threads(wildcards):
    return threads_of(run_of(wildcards))


def launch_command(on_failure, env=""):
    """The shell command of a job that trains one run (rules train and tune_train): the
    launcher, given the run's spec and where its record goes (`env`: variables set before
    it). The study-wide values are written into it here, not as {params.*} fields: Snakemake
    formats every job's command three times in a dry-run (a large study's, thousands of
    jobs, paid for each field).
    """
    return (
        f"{env}python -m trainscale.launch --spec {{params.spec:q}} --out {{output.metrics:q}}"
        f" --on-failure {on_failure} --retry-lost-runs {config['retry_lost_runs']}"
        " > {log:q} 2>&1"
    )


def job_resources(request, every_request=None):
    """The SLURM resources of a rule whose jobs start processes (train, probe, collectives,
    deepspeed_ops): every key trainscale.launch.slurm.slurm_request can set (nodes, tasks,
    cpus_per_task, runtime, mpi, gres, ...), from the request `request(wildcards)` returns;
    a key the job needs none of is None (unset). Ignored by local runs; read by
    snakemake-executor-plugin-slurm (profiles/slurm). Table, figure and report rules are
    local rules and ask for nothing.

    `every_request`: all the requests the rule's jobs can make, where known while parsing. A
    key with one value among them is given as that value (left out when None), not as a
    function: Snakemake calls a resource function once per job, inspecting its signature
    each time, which was most of a large study's dry-run (8 functions × 8,000 runs)."""

    def get(key):
        return per_job(lambda wildcards: request(wildcards).get(key))

    resources = {}
    keys = list(SLURM_RESOURCE_KEYS)
    if every_request is None or any(MEMORY_KEY in r for r in every_request):
        keys.append(MEMORY_KEY)  # every job's memory: a run's, a benchmark's, a build's
    for key in keys:
        values = (
            {r.get(key) for r in every_request} if every_request is not None else ()
        )
        if len(values) != 1:
            resources[key] = get(key)
        elif None not in values:
            (resources[key],) = values
    return resources


#: config `slurm`: --exclusive, the GPUs asked of a node, a constraint (with_options)
SLURM_OPTIONS = config.get("slurm") or {}
if SLURM_OPTIONS.get("exclusive"):
    # exclusive jobs ask for mem_mb 0 (launch.slurm.WHOLE_NODE), for which the plugin sends
    # no --mem: sbatch reads this variable instead, --mem=0, all of each node's memory
    os.environ.update(SBATCH_MEM_PER_NODE="0")
#: Every run's SLURM request (trainscale.launch.slurm.slurm_resources), made once per run:
#: its memory per node from the planner's host bytes per rank (trainscale.plan.preflight.memory).
RUN_REQUESTS = {
    path: slurm_resources(r, ACCELERATOR, PREDICTED[path]["host_bytes"], SLURM_OPTIONS)
    for path, r in RUN_BY_PATH.items()
}


def run_request(wildcards):
    """A training run's SLURM request: its workers, nodes, threads, timeout and memory."""
    run_of(wildcards)  # an unknown run path is named as such
    return RUN_REQUESTS[wildcards.run]


def collectives_request(wildcards):
    """The all-reduce benchmark of (workers, nodes) asks for what a training run of that
    shape asks for (one task per node, the node's workers × threads, GPUs on CUDA), and at
    most the memory of its largest (launch.slurm.collectives_mem_mb)."""
    workers, nodes = int(wildcards.workers), int(wildcards.nodes)
    request = slurm_request(
        workers,
        nodes,
        config["threads_per_worker"],
        ACCELERATOR,
        config["collectives"]["timeout_minutes"],
    )
    request[MEMORY_KEY] = collectives_mem_mb(
        [
            RUN_REQUESTS[path][MEMORY_KEY]
            for path, r in RUN_BY_PATH.items()
            if (r.workers, r.nodes) == (workers, nodes)
        ]
    )
    return with_options(request, SLURM_OPTIONS, ACCELERATOR)


def build_request(wildcards):
    """A one-process build job (DeepSpeed's ops): one worker's share of a node of the
    study's kind (its constraint)."""
    request = slurm_request(1, 1, config["threads_per_worker"], ACCELERATOR, 30)
    request[MEMORY_KEY] = build_mem_mb(request["cpus_per_task"])
    constraint = {"constraint": SLURM_OPTIONS.get("constraint")}
    return with_options(request, constraint, ACCELERATOR)


def check_targets():
    """One device probe per distinct SLURM allocation among the study's runs (the first run
    of each shape stands for it)."""
    shapes = {}
    # the same devices, whatever memory each run asks
    for path, request in RUN_REQUESTS.items():
        shape = sorted((k, v) for k, v in request.items() if k != "mem_mb")
        shapes.setdefault(tuple(shape), path)
    return [f"{RESULTS}/check/{path}.txt" for path in shapes.values()]


def conda_env_of(spec):
    return f"../../envs/{spec.framework}.yaml"


@per_job
def run_conda_env(wildcards):
    return conda_env_of(run_of(wildcards))


def files_needed(spec):
    """Files a run needs: its real dataset's files (fetched by the `download_*` rules), for
    Horovod its build where it is missing, and for DeepSpeed the once-built ops (CPU Adam too
    where it offloads) and the user's ds_config fragment."""
    files = [
        str(Path(spec.data_dir) / f)
        for f in ts_imagesets.spec_info(spec.to_dict()).files
    ]
    if spec.framework == "horovod" and HOROVOD_TO_BUILD:
        files.append(HOROVOD_STAMP)
    if spec.framework == "deepspeed":
        files.append(DEEPSPEED_OPS)
        if spec.offload != "none":  # DeepSpeed's CPU Adam steps the offloaded optimizer
            files.append(DEEPSPEED_CPU_ADAM)
        if spec.deepspeed_config:
            files.append(spec.deepspeed_config)
    return files


def inputs_by_run():
    """Every run's `files_needed`, by run path, worked out once per distinct data set, data
    directory and framework (a large study has thousands of runs and a handful of those), so
    that the per-job input function is a dict lookup."""
    by_key, by_run = {}, {}
    for path, r in RUN_BY_PATH.items():
        key = (
            r.dataset,
            r.data_dir,
            r.image_size,
            r.image_source,
            r.framework,
            r.deepspeed_config,
            r.offload != "none",
        )
        if key not in by_key:
            by_key[key] = files_needed(r)
        by_run[path] = by_key[key]
    return by_run


RUN_INPUTS = inputs_by_run()


@per_job
def run_inputs(wildcards):
    run_of(wildcards)  # an unknown run path is named as such
    return list(RUN_INPUTS[wildcards.run])


def metrics_of(paths):
    return [f"{RESULTS}/runs/{path}/metrics.json" for path in paths]


def all_metrics():
    """The metrics files of every cell's first `repeats.min` repeats (all, with an integer)."""
    return metrics_of(FIRST_RUNS)


#: The metrics files of the repeats past min that the racing step may ask (repeats.smk).
RACED_METRICS = metrics_of(r.path for r in RUNS if r.repeat >= REPEATS_MIN)


def print_results_location():
    """Where the results are, naming only the outputs this run left up to date."""
    print(ts_endnote.message(STUDY, RESULTS))


def data_dir_of(path):
    """The data_dir a dataset file lives in (files are data_dir/<dataset>/...)."""
    return str(
        Path(path).parents[len(Path(path).relative_to(config["data_dir"]).parts) - 1]
    )


#: The built-in data set `snakemake export_data` writes in both user layouts (docs/data.md).
EXPORT_DATASET = config["export_data"]["dataset"]


#: The all-reduce benchmark's backend: what torch-ddp uses on the study's accelerator.
COLLECTIVES_BACKEND = "nccl" if ACCELERATOR == "cuda" else "gloo"


def collective_shapes():
    """(workers, nodes) of every run with more than one worker, and the model:dataset pairs of
    those runs, whose largest gradient sets the benchmark's largest message (a one-worker run
    reduces no gradient). Worked out once per distinct model and data set."""
    if not config["collectives"]["enabled"]:
        return [], []
    multi = [r for r in RUNS if r.world_size > 1]
    shapes = sorted({(r.workers, r.nodes) for r in multi})
    models = {
        (
            r.model,
            r.dataset,
            r.image_size,
            r.image_source,
            r.seq_len,
            r.token_source,
            r.own_model,
        ): r
        for r in multi
    }
    pairs = sorted(
        {
            (
                f"params={r.own_model.params}"  # the user's model: counted before any job
                if r.own_model
                else f"{r.model}:{ts_imagesets.shape_name(r.to_dict())}"
            )
            for r in models.values()
        }
    )
    return shapes, pairs


#: (workers, nodes) and model:dataset pairs of the all-reduce benchmark (collective_shapes).
COLLECTIVE_SHAPES, COLLECTIVE_PAIRS = collective_shapes()


def collective_files():
    return [
        f"{RESULTS}/collectives/backend~{COLLECTIVES_BACKEND}/workers~{w}/nodes~{n}.json"
        for w, n in COLLECTIVE_SHAPES
    ]


# --- figures (rule `figures` in report.smk); the kinds are listed once, in reports/figures.yaml
FIGURES = load_yaml(Path(workflow.basedir) / "reports" / "figures.yaml")


#: Labels of every figure in `snakemake --report`, next to its title: for which runs it is.
STUDY_LABELS = {
    key: ", ".join(sorted({getattr(r, key) for r in RUNS}))
    for key in ("strategy", "model", "dataset")
}


def figure_outputs():
    """Every figure's PNG, registered for `snakemake --report` under its category with its own
    caption and labels, as named outputs `<name>_png`; and `<name>_svg` with report.svg.
    """
    out = {}
    for name, fig in FIGURES.items():
        out[f"{name}_png"] = report(
            f"{RESULTS}/figures/{name}.png",
            caption=f"../../reports/figures/{name}.rst",
            category=fig["category"],
            labels={"figure": fig["title"], **STUDY_LABELS},
        )
    return {**out, **svg_outputs(FIGURES)}


def svg_outputs(names):
    """`<name>_svg` outputs, only with config report.svg: true (report.html embeds PNG)."""
    if not config["report"]["svg"]:
        return {}
    return {f"{name}_svg": f"{RESULTS}/figures/{name}.svg" for name in names}


# --- predicted scaling (rule `predictions` in predict.smk, trainscale/analysis/predict.py)
#: on (predict.enabled, the default) when the study has a multi-worker cell
PREDICT = config["predict"]["enabled"] and any(r.world_size > 1 for r in RUNS)


def prediction_files():
    """The predictions' outputs the report shows; none when predictions are off."""
    if not PREDICT:
        return []
    return [
        f"{RESULTS}/predictions.csv",
        f"{RESULTS}/prediction_check.csv",
        f"{RESULTS}/figures/predicted_scaling.png",
    ]


# --- last: what parsing built (a large study's run specs and paths) lives as long as the run;
# freezing it keeps the garbage collector's full scans, frequent while Snakemake builds the
# DAG of thousands of jobs, from walking it again and again (~5-10% of a large dry-run)
gc.freeze()
