#!/usr/bin/env bash
# Install requirements.txt's pins and trainscale itself (editable) into a virtual environment:
#
#     scripts/install-requirements.sh [VENV] [REQUIREMENTS]
#
# (defaults .venv and requirements.txt; `make setup` runs it).
# With uv where it installs (its pin is requirements.txt's `uv==` line; pip puts it into the
# venv first), with pip where it does not or where uv fails: the same pins either way.
# TRAINSCALE_INSTALLER=pip skips uv; =uv fails rather than fall back (benchmarks/setup_install.py).
#
# uv reads none of pip's configuration. Where this machine's pip is told where a wheel lies
# (find-links: here the CPU build of torch==2.13.0 on local disk), what to cap (constraint)
# or which extra indexes to read, uv would not look there and would take PyPI's torch, a CUDA
# build of several GB. So every such setting `pip config list` shows (files and PIP_*
# variables alike) is passed to uv on its command line, and uv picks among all indexes the
# way pip does (--index-strategy unsafe-best-match). uv compiles bytecode only when asked:
# --compile-bytecode, as pip does, or where PYTHONDONTWRITEBYTECODE is set every run would
# compile torch's and TensorFlow's modules again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
REQUIREMENTS=${2:-requirements.txt}
PY=$VENV/bin/python
INSTALLER=${TRAINSCALE_INSTALLER:-auto}
say() { echo "install-requirements: $*" >&2; }
pip_() { DS_BUILD_OPS=0 "$PY" -m pip --disable-pip-version-check -q "$@"; }

with_pip() {
  pip_ install -r "$REQUIREMENTS"
  pip_ install --no-deps -e .
}

# pip's settings that decide where packages come from, as uv options
pip_settings_for_uv() {
  local key value v
  while IFS= read -r line; do
    key=${line%%=*}
    value=${line#*=}
    value=${value#\'}
    value=${value%\'}
    for v in $value; do  # pip splits list settings at whitespace
      case ${key##*.} in
        find-links | constraint | extra-index-url | index-url) echo "--${key##*.}=$v" ;;
      esac
    done
  done < <("$PY" -m pip config list 2>/dev/null) | awk '!seen[$0]++'
}

with_uv() {
  local uv_pin args
  uv_pin=$(grep -E '^uv==' requirements.txt)  # the project's uv, whatever is installed
  pip_ install "$uv_pin" || return 1
  mapfile -t args < <(pip_settings_for_uv)
  say "uv $("$VENV/bin/uv" --version | cut -d' ' -f2), pip's settings: ${args[*]:-none}"
  DS_BUILD_OPS=0 "$VENV/bin/uv" pip install --quiet --python "$PY" --compile-bytecode \
    --index-strategy unsafe-best-match "${args[@]}" -r "$REQUIREMENTS" || return 1
  "$VENV/bin/uv" pip install --quiet --python "$PY" --no-deps "${args[@]}" -e . || return 1
}

test -x "$PY" || "${PYTHON:-python3}" -m venv "$VENV"
start=$SECONDS
case $INSTALLER in
  pip) with_pip; how=pip ;;
  uv) with_uv; how=uv ;;
  auto)
    if with_uv; then
      how=uv
    else
      say "uv did not install the requirements; installing them with pip"
      with_pip
      how=pip
    fi
    ;;
  *) say "TRAINSCALE_INSTALLER=$INSTALLER: use auto, uv or pip"; exit 2 ;;
esac
say "installed with $how in $((SECONDS - start)) s"

# On a host with an NVIDIA driver: the CUDA 12 libraries TensorFlow was built for, the wheels of
# tensorflow[and-cuda] but its cuDNN and NCCL (nvidia-cudnn-cu12 and nvidia-nccl-cu12 write the
# same files as torch's nvidia-cudnn-cu13 and nvidia-nccl-cu13, libcudnn*.so.9 and libnccl.so.2:
# installed after torch they would replace torch's; TensorFlow finds torch's there instead), then
# the driver against torch's CUDA and torch's libraries against their wheels (trainscale.gpu.stack:
# exit 1 naming what and the fix). Nothing of this runs where there is no driver.
if [ -e /proc/driver/nvidia/version ]; then
  mapfile -t tf_cuda < <("$PY" -m trainscale.gpu.stack --tensorflow-cuda)
  say "NVIDIA driver found: TensorFlow's CUDA 12 libraries (tensorflow[and-cuda]'s wheels but cuDNN and NCCL, which are torch's): ${tf_cuda[*]}"
  pip_ install "${tf_cuda[@]}"
  "$PY" -m trainscale.gpu.stack
fi
