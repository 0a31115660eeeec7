#!/usr/bin/env bash
# CI: from a clean checkout, install what the tests need and run the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}"  # reused between CI runs
# The Horovod wheel this project builds (scripts/build-horovod.sh, ~7 min on 2 idle cores),
# cached like pip's wheels: keyed by Python, torch, TF and build features.
export HOROVOD_CACHE="${HOROVOD_CACHE:-$HOME/.cache/trainscale/horovod}"
# Debian packages the tests use: headless Chromium renders the HTML report.
if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium fonts-liberation >/dev/null
fi
# iproute2 (ip netns, tc) for tests/test_network.py: two network namespaces joined by a veth.
if ! dpkg-query -W -f='${Status}' iproute2 2>/dev/null | grep -q "ok installed"; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
fi
# SLURM for tests/test_slurm.py (scripts/local-slurm.sh starts a 2-node cluster from them);
# policy-rc.d keeps apt from starting the packages' services: the tests start their own.
NEED=""
for p in slurm-wlm munge slurmdbd mariadb-server; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || NEED="$NEED $p"
done
if [ -n "$NEED" ]; then
  MADE=""; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; MADE=1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $NEED >/dev/null
  [ -z "$MADE" ] || rm -f /usr/sbin/policy-rc.d
fi
make setup
