"""The parts of a memory prediction that are arithmetic, not traced (docs/memory.md): what a
GPU process holds besides its tensors (the CUDA runtime, NCCL's buffers), DeepSpeed's model
states as its ds_config sizes them, and each rank's host memory. Imports no framework: the
planner computes the host figure of every cell, traced or not.
"""

from __future__ import annotations

import os

from trainscale import data
from trainscale.data import imagesets
from trainscale.plan import catalog
from trainscale.plan.runspec import RunSpec

MIB, GIB = 2**20, 2**30

#: device memory of a CUDA process besides its tensors: the CUDA context with its kernels
#: loaded (781 MB in nvidia-smi for a process that allocates almost nothing: pytorch/pytorch
#: issue 34323) and cuBLAS's and cuDNN's workspaces; 0.5-1 GiB per process, the upper end
#: taken (not yet measured by trainscale: each CUDA run records peak_nvml_process_bytes and
#: peak_reserved_bytes, whose difference is this part and NCCL's)
CUDA_RUNTIME_BYTES = 1 * GIB
#: NCCL's buffers per communicator: its Simple protocol's NCCL_BUFFSIZE (4 MiB by default) to
#: send and to receive on each of up to 32 channels (LL and LL128 buffers left out)
NCCL_CHANNELS = 32
NCCL_BUFFSIZE = 4 * MIB

#: resident memory of a rank before its model: the interpreter and the framework's libraries,
#: by framework (the peak RSS of CPU runs of models of a few MB on the 2-core machine)
HOST_RUNTIME = {"torch": 352 * MIB, "horovod": 352 * MIB, "deepspeed": 424 * MIB,
                "lightning": 496 * MIB, "tensorflow": 784 * MIB}  # fmt: skip
#: what a CUDA process adds on the host: the CUDA runtime's, cuBLAS's, cuDNN's and NCCL's
#: libraries mapped and touched (an estimate, not measured by trainscale)
HOST_CUDA_BYTES = 2 * GIB
#: the SLURM request's margin over the ranks' host need: a share, and the launcher's process
HOST_MARGIN, LAUNCHER_BYTES = 0.10, 512 * MIB

#: strategies whose runner builds the model on the meta device (sharded before it is held),
#: and the one that builds it under deepspeed.zero.Init, where the model initialises module by
#: module (the GPT family, `hf:`, own models with `init`)
META_BUILDS = ("torch-fsdp", "torch-tp", "torch-fsdp-tp")
ZERO_INIT_BUILDS = ("deepspeed-zero3",)


def nccl_communicators(spec: RunSpec) -> int:
    """NCCL communicators a rank of `spec` joins: the world's, and the groups it adds (a
    DeviceMesh's dimensions, DeepSpeed's data-parallel group, a pipeline's neighbours)."""
    if spec.world_size == 1 or spec.strategy == "torch":
        return 0
    if spec.strategy in ("torch-tp", "torch-fsdp-tp"):
        return 3  # the world, its dp group, its tp group
    if spec.strategy == "torch-pipeline":
        return 1 + min(2, spec.world_size - 1)  # the world, each neighbouring stage
    if spec.strategy.startswith("deepspeed-"):
        return 2  # the world, DeepSpeed's data-parallel group
    return 1


def gpu_parts(spec: RunSpec, target: str, environ: dict | None = None) -> dict[str, int]:
    """`runtime` and `nccl`: what a CUDA process holds on its device besides its tensors
    (0 on CPU)."""
    if target != "cuda" or catalog.STRATEGIES[spec.strategy].runtime != "torch":
        return {"runtime": CUDA_RUNTIME_BYTES if target == "cuda" else 0, "nccl": 0}
    env = os.environ if environ is None else environ
    buffsize = int(env.get("NCCL_BUFFSIZE") or NCCL_BUFFSIZE)
    return {"runtime": CUDA_RUNTIME_BYTES,
            "nccl": nccl_communicators(spec) * 2 * buffsize * NCCL_CHANNELS}  # fmt: skip


def optimizer_state_bytes(spec: RunSpec) -> int:
    """fp32 state bytes per parameter: Adam's two moments, SGD's momentum where it is on."""
    if spec.optimizer in ("adam", "adamw"):
        return 8
    return 4 if spec.momentum > 0 else 0


def zero_states(spec: RunSpec, ds_config: dict, params: int, largest: int) -> dict[str, int]:
    """DeepSpeed's memory per rank as the run's ds_config sizes it, for `params` parameters
    whose largest module holds `largest`: on the device `model_states` (parameters and
    gradients in the precision's bytes, the fp32 master copy, fp32 gradients and the
    optimizer's state, each whole or partitioned over the ranks by the stage, ZeRO-3's
    gathered modules) and `buckets` (the gradient reduction buffers), and on the host
    `host` (what the offload flags move there)."""
    zero = ds_config.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0))
    low = any((ds_config.get(k) or {}).get("enabled") for k in ("bf16", "fp16"))
    p = 2 if low else 4  # bytes per parameter and per gradient as the model holds them
    n = spec.world_size
    k = optimizer_state_bytes(spec)
    offload_opt = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
    offload_par = stage == 3 and (zero.get("offload_param") or {}).get("device") in ("cpu", "nvme")
    if stage == 0:  # DeepSpeed's engine and the torch optimizer; bf16/fp16: an fp32 master
        master = (4 + 4) * params if low else 0  # fp32 weights and fp32 gradients
        return {"model_states": (p + p + k) * params + master, "host": 0,
                "buckets": min(int(zero.get("reduce_bucket_size", 5e8)), params) * p}  # fmt: skip
    fp32 = (4 + 4 + k) * params // n  # master weights, fp32 gradients, optimizer state
    weights = p * params if stage < 3 else p * params // n
    grads = p * params if stage == 1 else p * params // n
    gathered = 0
    if stage == 3:
        prefetch = min(int(zero.get("stage3_prefetch_bucket_size", 5e7)), params)
        gathered = p * (largest + prefetch)
    bucket = int(zero.get("reduce_bucket_size", 5e8)) * p
    overlap = zero.get("overlap_comm", stage == 3)
    if zero.get("contiguous_gradients", True) or offload_opt:
        bucket *= 2 if overlap and stage < 3 else 1
    else:
        bucket = 0
    host = (fp32 + p * params // n if offload_opt else 0) + (weights if offload_par else 0)
    device = (0 if offload_par else weights) + gathered + grads + (0 if offload_opt else fp32)
    return {"model_states": device, "buckets": bucket, "host": host}


# --- host memory per rank -------------------------------------------------------------------


def build_mode(spec: RunSpec) -> str:
    """How the runner builds the model: `whole` on every rank's host, on `meta` (each rank
    materialises its shard on the device) or under `zero.Init` (partitioned as it is built)."""
    own = spec.own_model
    module_wise = own.init is not None if own is not None else bool(_row(spec).gpt)
    if module_wise and spec.strategy in META_BUILDS:
        return "meta"
    if module_wise and spec.strategy in ZERO_INIT_BUILDS:
        return "zero.Init"
    return "whole"


def _row(spec: RunSpec):
    return spec.own_model.row() if spec.own_model is not None else catalog.MODELS[spec.model]


#: the classifier's input width of the built-in image models (its parameters follow the classes)
CLASSIFIER_IN = {"resnet50": 2048, "vgg19": 4096, "alexnet": 4096, "googlenet": 1024}


def param_count(spec: RunSpec) -> int:
    """The model's parameters at the run's input, without building it: an own or `hf:` model's
    from its pre-flight, a GPT's from its shape, a built-in image model's from the catalogue
    (its classifier resized to the data set's classes; the seed models' first linear layer at
    their published input: a few MB at most)."""
    row = _row(spec)
    if spec.own_model is not None:
        return spec.own_model.params
    info = imagesets.spec_info(spec.to_dict())
    if row.gpt:
        layers, _, width = row.gpt
        vocab, context = info.num_classes, info.shape[0]
        return layers * (12 * width * width + 2 * width) + (vocab + context + 1) * width
    extra = (CLASSIFIER_IN.get(spec.model, 0) + 1) * (info.num_classes - row.published_classes)
    return row.params + (extra if spec.model in CLASSIFIER_IN else 0)


def data_bytes(spec: RunSpec) -> int:
    """A built-in image set held in memory as float32 tensors (train and test) with int64
    labels; token sets and the user's images are read as they train (memory-mapped, decoded
    by the loader): none."""
    if spec.seq_len or spec.image_source is not None:
        return 0
    info = data.info(spec.dataset)
    samples = (spec.samples or info.train_samples) + info.test_samples
    pixels = 1
    for side in info.shape:
        pixels *= side
    return samples * (4 * pixels + 8)


def host(spec: RunSpec, target: str, traced: dict | None = None,
         states: dict | None = None) -> tuple[int, dict[str, int]]:  # fmt: skip
    """(host bytes per rank, by part): `runtime` (the process before its model: the framework,
    and on CUDA its libraries), `data` (an image set in memory), `build` (the model as the
    runner builds it: fp32 parameters whole on the host, nothing on meta or under zero.Init),
    `offload` (what stays on the host: FSDP's fp32 shards, their gradients and the optimizer
    state; DeepSpeed's offloaded states, `states` from zero_states) and, on CPU, where the
    host is the device, `step`: the traced step (`traced`, its total) or, untraced, the model
    states (fp32 parameters, gradients and optimizer state) in place of the build."""
    framework = spec.framework
    if framework == "torch" and spec.strategy.startswith("lightning"):
        framework = "lightning"
    runtime = HOST_RUNTIME.get(framework, HOST_RUNTIME["torch"])
    runtime += HOST_CUDA_BYTES if target == "cuda" else 0
    n = param_count(spec)
    build = 4 * n if build_mode(spec) == "whole" else 0
    offload = 0
    if target == "cuda" and spec.strategy == "torch-fsdp" and spec.offload == "params":
        offload = (4 + 4 + optimizer_state_bytes(spec)) * n // spec.world_size
    elif target == "cuda" and states is not None:
        offload = states["host"]
    parts = {"runtime": runtime, "data": data_bytes(spec), "build": build, "offload": offload}
    if target != "cuda":
        step = traced["total_bytes"] if traced else (8 + optimizer_state_bytes(spec)) * n
        shards = spec.world_size if spec.strategy in ("torch-fsdp", "deepspeed-zero3") else 1
        parts["step"] = max(step if traced else step // shards, build) - build
    return sum(parts.values()), parts


def slurm_mem_mb(spec: RunSpec, host_bytes: int) -> int:
    """The train job's memory request per node (sbatch --mem, in MB): its ranks on a node
    (the workers; tf-ps's servers and chief beside them) at `host_bytes` each, HOST_MARGIN
    over it, and the launcher's process."""
    per_node = -(-spec.processes // spec.nodes)
    return -(-int(per_node * host_bytes * (1 + HOST_MARGIN) + LAUNCHER_BYTES) // MIB)
