#!/usr/bin/env bash
# Build and install Horovod 0.28.1 into a Python environment that already has torch and
# TensorFlow, reproducibly:
#
#     scripts/build-horovod.sh [PYTHON]        (default: .venv/bin/python; `make setup` runs it)
#
# Why a build step: Horovod's last release (0.28.1, 2023) no longer builds against current
# PyTorch/TensorFlow as published, and PyPI has no wheel of it. This script fetches the sdist
# from PyPI, applies three small scripted edits (each commented below), builds a wheel with
# the torch and TensorFlow ops and gloo -- plus MPI and NCCL where the machine has them, so the
# same script serves a GPU cluster node -- caches the wheel under $HOROVOD_CACHE (default
# .cache/horovod, keyed by everything the binary depends on) so a rebuild is skipped, and
# installs it with --no-deps: pip never touches torch or tensorflow. Horovod's own runtime
# dependencies (cloudpickle, psutil, pyyaml, packaging) are pinned in requirements.txt.
set -euo pipefail

HOROVOD_VERSION=0.28.1
# sha256 of horovod-0.28.1.tar.gz on PyPI: the edits below are written for exactly this source
HOROVOD_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
PYTHON=${1:-.venv/bin/python}
CACHE=${HOROVOD_CACHE:-.cache/horovod}
say() { echo "build-horovod: $*" >&2; }

versions=$(TF_CPP_MIN_LOG_LEVEL=3 "$PYTHON" - 2>/dev/null <<'EOF'
import sys, torch, tensorflow as tf
print(f"cp{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}-tf{tf.__version__}")
print(torch.version.cuda or "")
EOF
) || {
  say "$PYTHON needs torch and tensorflow installed first (pip install -r requirements.txt)"
  exit 1
}
key=$(sed -n 1p <<<"$versions")
torch_cuda=$(sed -n 2p <<<"$versions")

# --- what this machine has: MPI, and CUDA + NCCL for GPU collectives ----------------------
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
export HOROVOD_WITHOUT_MXNET=1
features=gloo
if command -v mpicxx >/dev/null 2>&1; then
  export HOROVOD_WITH_MPI=1
  features+=-mpi
else
  export HOROVOD_WITHOUT_MPI=1
fi
nccl_lib=""
# the NCCL that torch's CUDA wheel brings (pip package nvidia-nccl-cu*), before any system one
# (a CUDA devel image's libnccl2): one NCCL per process, torch's and Horovod's the same
wheel_nccl=$("$PYTHON" -c 'import nvidia.nccl as n; print(list(n.__path__)[0] + "/lib")' 2>/dev/null || true)
if [[ -n "${HOROVOD_NCCL_HOME:-}" ]]; then
  nccl_lib=$HOROVOD_NCCL_HOME/lib
elif [[ -n "$wheel_nccl" && -e "$wheel_nccl/libnccl.so.2" ]]; then
  nccl_lib=$wheel_nccl
elif ldconfig -p 2>/dev/null | grep -q 'libnccl\.so'; then
  nccl_lib=system
fi
if [[ -n "$torch_cuda" ]] && command -v nvcc >/dev/null 2>&1 && [[ -n "$nccl_lib" ]]; then
  export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED
  features+=-nccl-cuda$torch_cuda
else
  # no GPU build: NVTX only annotates GPU ranges, and must not tie the wheel to a CUDA toolkit
  # that merely happens to be installed (as on CPU CI machines with nvcc)
  export HOROVOD_WITHOUT_NVTX=1
fi
# the recipe (this script: its edits and flags) is part of the key, so an edit to it rebuilds
recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-10)
dir="$CACHE/horovod-$HOROVOD_VERSION-$key-$features-$recipe"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

wheel=$(ls "$dir"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -1 || true)
if [[ -z "$wheel" ]]; then
  say "building Horovod $HOROVOD_VERSION ($features) for $key into $dir"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$PYTHON" -m pip download --disable-pip-version-check -q --no-binary :all: --no-deps \
    --no-build-isolation "horovod==$HOROVOD_VERSION" -d "$work"
  echo "$HOROVOD_SHA256  $work/horovod-$HOROVOD_VERSION.tar.gz" | sha256sum -c --quiet
  tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"

  # Edit 1 and 2: C++14 -> C++17. PyTorch >= 2.1 headers need C++17, and Horovod pins the
  # standard with CMAKE_CXX_STANDARD (and strips -std= from CXXFLAGS, so flags cannot help).
  sed -i 's/^set(CMAKE_CXX_STANDARD 14)$/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt"
  sed -i 's/^    set(CMAKE_CXX_STANDARD 14)$/    set(CMAKE_CXX_STANDARD 17)/' \
    "$src/horovod/torch/CMakeLists.txt"
  # Edit 3: leave out the XLA ops. xla_mpi_ops.cc includes XLA headers TensorFlow >= 2.16 no
  # longer ships; they serve only jit-compiled (XLA) TF graphs on GPU, which trainscale never uses.
  sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  # Edit 4: no debug info. Horovod builds RelWithDebInfo (-O3 -g); -g on the translation units
  # that include torch's and TensorFlow's headers costs 2.7x their compile time (one of them:
  # 175 vs 65 CPU-s; its object file 22 MB vs 0.7 MB), for symbols no benchmark run reads.
  # The -O3 stays.
  sed -i 's/^string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO .*$/&\nstring(REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")\nstring(REPLACE "-g" "" CMAKE_C_FLAGS_RELWITHDEBINFO "${CMAKE_C_FLAGS_RELWITHDEBINFO}")/' "$src/CMakeLists.txt"
  # fail loudly if an edit found nothing to change (a different source than expected)
  grep -q '^set(CMAKE_CXX_STANDARD 17)$' "$src/CMakeLists.txt"
  grep -q '^    set(CMAKE_CXX_STANDARD 17)$' "$src/horovod/torch/CMakeLists.txt"
  ! grep -q xla_mpi_ops "$src/horovod/tensorflow/CMakeLists.txt"
  grep -q '^string(REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO' "$src/CMakeLists.txt"

  if [[ -n "${HOROVOD_GPU_OPERATIONS:-}" && "$nccl_lib" != system && -z "${HOROVOD_NCCL_HOME:-}" ]]; then
    # pip's NCCL ships libnccl.so.2 only; CMake looks for libnccl.so
    mkdir -p "$work/nccl"
    ln -s "$nccl_lib/libnccl.so.2" "$work/nccl/libnccl.so"
    export HOROVOD_NCCL_LIB="$work/nccl" HOROVOD_NCCL_INCLUDE="$nccl_lib/../include"
  fi
  # compile jobs: every core this process may use (nproc follows taskset, cgroups and SLURM),
  # or HOROVOD_BUILD_JOBS (the workflow's `horovod` rule passes its threads); no more than
  # MemAvailable / 2.5 GiB: one g++ on Horovod's TensorFlow ops was seen holding 2.3 GiB
  jobs=${HOROVOD_BUILD_JOBS:-$(nproc)}
  by_memory=$(awk '/^MemAvailable:/ {print int($2 / 2621440)}' /proc/meminfo 2>/dev/null || true)
  if [[ -n "$by_memory" ]] && ((by_memory < jobs)); then jobs=$((by_memory > 0 ? by_memory : 1)); fi
  say "compiling with $jobs jobs"
  start=$SECONDS
  # --no-build-isolation: build against this environment's torch and TensorFlow (an isolated
  # build would download its own, and the ops must match the ones they load into)
  MAKEFLAGS=-j$jobs "$PYTHON" -m pip wheel --disable-pip-version-check -q \
    --no-deps --no-build-isolation -w "$dir" "$src"
  wheel=$(ls "$dir"/horovod-"$HOROVOD_VERSION"-*.whl | head -1)
  echo "$((SECONDS - start))" >"$dir/build-seconds"
  say "built $(basename "$wheel") in $((SECONDS - start)) s"
else
  say "cached wheel $wheel"
fi

"$PYTHON" -m pip install --disable-pip-version-check -q --no-deps --force-reinstall "$wheel"
bin=$(dirname "$PYTHON")
"$bin/horovodrun" --check-build
