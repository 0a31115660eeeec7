"""Run nanoGPT's own `bench.py`, its text unchanged, at a smaller GPT's shape and on CPU: the
peer's side of benchmarks/peer_nanogpt.py.

bench.py hard-codes GPT-2 124M's shape in its `GPTConfig(...)` call and calls
`torch.cuda.synchronize()` unconditionally, so on CPU at gpt-micro's shape it cannot run as
it stands. This driver changes neither file: it imports the checkout's `model.py`, gives
bench.py a `model` module whose `GPTConfig` takes the shape asked for (every other field as
bench.py passes it), makes `torch.cuda.synchronize` a no-op where there is no GPU (the CPU's
work is done when a call returns), and runs bench.py as `__main__` with nanoGPT's own
`--key=value` overrides (its configurator.py). Prints one JSON line: tokens_per_second from
bench.py's "time per iteration" line, which times 20 steps after 10 of burn-in.

    python benchmarks/nanogpt_bench.py NANOGPT_CHECKOUT --layers 6 --heads 6 --width 384 \
        -- --batch_size=8 --block_size=256
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import sys
import types

import torch


def main() -> None:
    p = argparse.ArgumentParser(
        description=(
            "Run nanoGPT's own `bench.py`, its text unchanged, at a smaller GPT's shape and "
            "on CPU: the peer's side of benchmarks/peer_nanogpt.py."
        )
    )
    p.add_argument("checkout", help="a checkout of github.com/karpathy/nanoGPT")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--width", type=int, required=True)
    a, overrides = p.parse_known_args()  # the rest: bench.py's own --key=value overrides
    overrides = [o for o in overrides if o != "--"]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    sys.path.insert(0, a.checkout)
    os.chdir(a.checkout)  # bench.py reads configurator.py from its working directory
    import model as nanogpt_model  # the checkout's model.py

    shape = {"n_layer": a.layers, "n_head": a.heads, "n_embd": a.width}
    shim = types.ModuleType("model")
    shim.GPT = nanogpt_model.GPT
    shim.GPTConfig = lambda **kw: nanogpt_model.GPTConfig(**{**kw, **shape})
    sys.modules["model"] = shim
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *args, **kwargs: None
    cpu = [] if torch.cuda.is_available() else ["--device=cpu", "--dtype=float32"]
    sys.argv = ["bench.py", "--compile=False", "--real_data=False", *cpu, *overrides]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        g = runpy.run_path("bench.py", run_name="__main__")
    ms = float(re.search(r"time per iteration: ([0-9.]+)ms", printed.getvalue()).group(1))
    tokens = g["batch_size"] * g["block_size"]
    print(json.dumps({"tokens_per_second": tokens / (ms / 1000), "ms_per_step": ms,
                      "batch_size": g["batch_size"], "block_size": g["block_size"],
                      "params": g["model"].get_num_params()}))  # fmt: skip


if __name__ == "__main__":
    main()
