"""A test plug-in, never imported by production code: put this directory on PYTHONPATH and set
TRAINSCALE_TEST_TAP=DIR, and every process of a run (each rank) writes into DIR

- `init-<pid>.pt` / `init-<pid>.npz`: the model's weights as `trainscale.models.torch_models.build`
  / `trainscale.models.keras_models.build` returned them, i.e. before any training step; for a
  model built on the meta device or inside deepspeed.zero.Init, the full weights (gathered,
  from rank 0) once the PyTorch loop's set-up has built, sharded and initialised it;
- `samples-<pid>.txt`: one line `<rank> <unix seconds> <rows>` for every training batch this
  process really fed: for PyTorch runners each call of `F.cross_entropy` that builds a graph
  (a training loss; evaluation runs under no_grad), for TensorFlow runners each call of the Keras
  model's `train_step` (once per replica and step, with that replica's share of the batch);
- `epochs-<strategy>-<workers>-<pid>.txt`: for TensorFlow runners, one line `<rank> <unix seconds>
  <epoch>` as each epoch of `model.fit` begins (the epoch numbered from 1; the file named after
  the run's strategy and worker count from its `--spec`), so that every batch in `samples-<pid>.txt`
  can be put in the epoch it was fed in, and each run of a study told apart;
- with TRAINSCALE_SAVE_WEIGHTS=PATH: the final weights of a Keras run (`get_weights()` as
  `.npz`, once `model.fit` returns), at PATH from rank 0, or, where PATH holds `{rank}` (and
  `{strategy}`), from every rank at PATH formatted with its rank (and the run's strategy);
- `final-lightning-ddp-0.pt`: for Lightning runners, rank 0's model weights as `Trainer.fit`
  left them (keys as `models.build` names them, the LightningModule's `net.` prefix removed);
- `exposed-<pid>.txt`: the same lines for the extra steps a multi-worker run takes with
  gradient synchronisation off (`trainscale.runners.torch.exposed`), which count in no epoch and no
  throughput figure, so they are kept apart from the training batches;
- `losses-<pid>.txt`: one line `<rank> <unix seconds> <loss>` for every training loss of a
  PyTorch runner (the value `F.cross_entropy` returned, exactly, as Python's repr writes it);
- `labels-<pid>.txt`: one line `<rank> <unix seconds> <l1,l2,...>` for the same training
  losses: the labels of the batch (with one sample per class, which samples were fed);
- `final-<strategy>-<rank>.pt`: the trained model's full weights (keys as `models.build`
  names them: FSDP's and ZeRO-3's gathered, a pipeline's stages put together) when the PyTorch
  loop (`trainscale.runners.torch.torch_loop.Loop.report`) starts its report, after the last epoch
  (`final-<strategy>-<precision>-<rank>.pt` at a precision other than fp32: a study's runs of a
  strategy at two precisions keep both);
- `ended-<strategy>-<rank>.pt`: the same weights once the report is written, after the extra
  steps of exposed communication, which must have put the trained weights back.

It wraps those functions after their module is imported (a meta-path finder), so the runners
run unchanged. tests/tap.py reads the files back.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time

TAP = os.environ.get("TRAINSCALE_TEST_TAP")


def _rank() -> int:
    for k in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        if k in os.environ:
            return int(os.environ[k])
    cfg = os.environ.get("TF_CONFIG")
    if cfg:
        import json

        return int(json.loads(cfg)["task"]["index"])
    return 0


#: which file a fed batch is noted in: "samples" (training) or "exposed" (the no-sync steps)
_PHASE = ["samples"]


def _note(rows: int) -> None:
    with open(os.path.join(TAP, f"{_PHASE[-1]}-{os.getpid()}.txt"), "a") as f:
        f.write(f"{_rank()} {time.time():.6f} {rows}\n")


def _in_pipeline_setup() -> bool:
    """Whether torch.distributed.pipelining calls the loss to infer gradient shapes before its
    first step (a forward of one micro-batch that no optimizer step follows), not to train."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        if frame.f_code.co_name in ("_backward_metadata_inference", "_prepare_backward_infra"):
            return True
        frame = frame.f_back
    return False


def _patch_torch_functional(mod) -> None:
    import torch

    real = mod.cross_entropy

    def cross_entropy(input, target, *args, **kw):
        training = torch.is_grad_enabled() and input.requires_grad and target.dim() >= 1
        if not training or _in_pipeline_setup():
            return real(input, target, *args, **kw)
        _note(int(target.shape[0]))
        loss = real(input, target, *args, **kw)
        if _PHASE[-1] == "samples":
            with open(os.path.join(TAP, f"losses-{os.getpid()}.txt"), "a") as f:
                f.write(f"{_rank()} {time.time():.6f} {loss.item()!r}\n")
            with open(os.path.join(TAP, f"labels-{os.getpid()}.txt"), "a") as f:
                labels = ",".join(str(v) for v in target.tolist())
                f.write(f"{_rank()} {time.time():.6f} {labels}\n")
        return loss

    mod.cross_entropy = cross_entropy


def _patch_models(mod) -> None:
    real = mod.build

    def build(*args, **kw):
        import torch

        net = real(*args, **kw)
        state = net.state_dict()
        path = os.path.join(TAP, f"init-{os.getpid()}.pt")
        # the first real model a process builds is the one it trains; a later one (the local
        # replica that times the no-sync steps of DeepSpeed and Horovod runs) is not
        # (a model built on the meta device, or inside deepspeed.zero.Init, has no weights yet:
        # the loop's start writes them, gathered, once they are initialised)
        held = not any(v.is_meta or hasattr(v, "ds_id") for v in net.parameters())
        if held and not os.path.exists(path):
            torch.save({k: v.detach().cpu().clone() for k, v in state.items()}, path)
        return net

    mod.build = build


def _spec() -> dict:
    """The run's spec, from the worker's command line (`--spec JSON`); {} without one."""
    import json

    argv = sys.argv
    return json.loads(argv[argv.index("--spec") + 1]) if "--spec" in argv else {}


def _spec_strategy() -> str:
    """The run's strategy, from the worker's command line (`--spec JSON`)."""
    return _spec().get("strategy", "")


def _epoch_marks():
    """A Keras callback that notes when each epoch begins (`epochs-*.txt`). It reads no logs
    (`_supports_tf_logs`: Keras converts none for it, so a ParameterServerStrategy fit stays
    asynchronous) and has no batch hook."""
    import tf_keras as keras

    spec = _spec()
    name = f"epochs-{spec.get('strategy')}-{spec.get('workers')}-{os.getpid()}.txt"

    class EpochMarks(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True

        def on_epoch_begin(self, epoch, logs=None) -> None:
            with open(os.path.join(TAP, name), "a") as f:
                f.write(f"{_rank()} {time.time():.6f} {epoch + 1}\n")

    return EpochMarks()


def _save_final_weights(save) -> None:
    """`save(path)` the final weights where TRAINSCALE_SAVE_WEIGHTS says: with `{rank}` in it
    (and optionally `{strategy}`) every rank its own, else rank 0 alone at that path."""
    path = os.environ.get("TRAINSCALE_SAVE_WEIGHTS")
    if not path or ("{rank}" not in path and _rank() != 0):
        return
    save(path.format(rank=_rank(), strategy=_spec_strategy()))


def _patch_keras_models(mod) -> None:
    real = mod.build

    def build(*args, **kw):
        import numpy as np
        import tensorflow as tf

        model = real(*args, **kw)
        np.savez(os.path.join(TAP, f"init-{os.getpid()}.npz"), *model.get_weights())
        real_step = model.train_step

        def train_step(data):  # traced once; runs once per replica and step
            def note(rows):
                _note(int(rows))
                return rows

            rows = tf.py_function(note, [tf.shape(data[1])[0]], tf.int32)
            with tf.control_dependencies([rows]):
                return real_step(data)

        model.train_step = train_step
        real_fit = model.fit

        def fit(*args, **kw):  # the weights training ended with, before any evaluation after
            # (every runner passes its callbacks by keyword)
            kw["callbacks"] = [*(kw.get("callbacks") or []), _epoch_marks()]
            history = real_fit(*args, **kw)
            _save_final_weights(lambda path: np.savez(path, *model.get_weights()))
            return history

        model.fit = fit
        return model

    mod.build = build


def _patch_exposed(mod) -> None:
    real = mod.measure_exposed_communication

    def measure_exposed_communication(*args, **kw):
        _PHASE.append("exposed")
        try:
            return real(*args, **kw)
        finally:
            _PHASE.pop()

    mod.measure_exposed_communication = measure_exposed_communication


def _final_weights(loop) -> dict | None:
    """The trained model's full weights, keys as models.build names them, on this rank (None
    where it holds none). Called on every rank: the gathers are collectives."""
    p, strategy = loop.plugin, loop.spec.strategy
    if strategy in ("torch-fsdp", "torch-tp", "torch-fsdp-tp"):  # DTensors, gathered
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(p.net, options=full)
    if strategy == "deepspeed-zero3":
        return p.engine._zero3_consolidated_16bit_state_dict() or None  # rank 0's
    if strategy.startswith("deepspeed-"):
        return p.engine.module.state_dict()
    if strategy == "torch-pipeline":  # block i of stage [lo, hi) is the model's block lo + i
        local = {}
        for k, v in p.stage_mod.state_dict().items():
            block, rest = k.split(".", 1)
            local[f"{p.lo + int(block)}.{rest}"] = v.detach().cpu()
        return {k: v for part in p.gather_object(local) for k, v in part.items()}
    return p.eval_model.state_dict()


def _patch_torch_loop(mod) -> None:
    real = mod.Loop.report
    real_set_up = mod.Loop.set_up

    def set_up(self, *args, **kw):  # a model built on meta or by zero.Init: its first weights
        import torch

        real_set_up(self, *args, **kw)
        if getattr(self, "built", "whole") != "whole":
            weights = _final_weights(self)  # a collective: every rank
            if weights:
                path = os.path.join(TAP, f"init-{os.getpid()}.pt")
                torch.save({k: v.detach().cpu().clone() for k, v in weights.items()}, path)

    def report(self, out):
        import torch

        def save(kind: str) -> None:
            weights = _final_weights(self)
            if weights:
                at = "" if self.spec.precision == "fp32" else f"{self.spec.precision}-"
                path = os.path.join(TAP, f"{kind}-{self.spec.strategy}-{at}{self.rk.rank}.pt")
                torch.save({k: v.detach().float().cpu() for k, v in weights.items()}, path)

        save("final")
        done = real(self, out)
        save("ended")  # after the record: the no-sync steps of exposed communication undone
        return done

    mod.Loop.report = report
    mod.Loop.set_up = set_up


def _patch_lightning_trainer(mod) -> None:
    real = mod.Trainer.fit

    def fit(self, *args, **kw):
        import torch

        out = real(self, *args, **kw)
        if self.global_rank == 0:  # every rank holds the same DDP weights
            state = self.lightning_module.net.state_dict()
            path = os.path.join(TAP, "final-lightning-ddp-0.pt")
            torch.save({k: v.detach().float().cpu().clone() for k, v in state.items()}, path)
        return out

    mod.Trainer.fit = fit


PATCHES = {
    "torch.nn.functional": _patch_torch_functional,
    "trainscale.models.torch_models": _patch_models,
    "trainscale.models.keras_models": _patch_keras_models,
    "trainscale.runners.torch.exposed": _patch_exposed,
    "trainscale.runners.torch.torch_loop": _patch_torch_loop,
    "lightning.pytorch.trainer.trainer": _patch_lightning_trainer,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, real, patch) -> None:
        self.real, self.patch = real, patch

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module) -> None:
        self.real.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, PATCHES[name])
        return spec


if TAP:
    os.makedirs(TAP, exist_ok=True)
    sys.meta_path.insert(0, _Finder())
