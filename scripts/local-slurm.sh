#!/usr/bin/env bash
# A throw-away 2-node SLURM cluster on this machine, to try `--profile slurm` and for the tests.
#
#   scripts/local-slurm.sh start     # install Debian's packages if missing, start (about 10 s)
#   scripts/local-slurm.sh status    # sinfo of the cluster, exit 1 when it is not up
#   scripts/local-slurm.sh stop      # stop exactly the daemons `start` started, nothing else
#
# Root only, loopback only. State, logs and the database live in $TRAINSCALE_SLURM_DIR (default
# /tmp/trainscale-slurm); the configuration goes to /etc/slurm (slurm.conf, gres.conf,
# slurmdbd.conf), where every SLURM client looks: Snakemake's jobstep executor drops SLURM_*
# variables, SLURM_CONF included, before its srun. A /etc/slurm/slurm.conf this script did not
# write is never overwritten, and `stop` removes the files it wrote. NNODES slurmd daemons n1..nN run on this host (Debian builds slurm with
# MULTIPLE_SLURMD), each with GPUS fake GPUs (gres File= symlinks to /dev/null: SLURM allocates
# and exports them, no program can use them), and slurmdbd on a socket-only MariaDB gives
# `sacct`, which snakemake-executor-plugin-slurm checks job states with. Node names resolve
# through SLURM's NodeAddr (127.0.0.1), which trainscale's launcher uses for rendezvous.
# Env: NNODES=2 CPUS=<nproc> GPUS=2 SLURM_ACCOUNT=trainscale PORT_BASE=16817 TASKPLUGIN=task/none
# (TASKPLUGIN=task/affinity binds each task to the CPUs its step asked for, as clusters with
# task/cgroup's ConstrainCores do: tests/test_slurm.py starts it so; cgroups cannot run here)
set -euo pipefail
# This cluster's clients read /etc/slurm (see above). A SLURM_CONF from the caller (the Makefile
# and the tests set one whose controller refuses at once: scripts/slurm-offline.conf) would point
# this script's own checks elsewhere.
unset SLURM_CONF
D=${TRAINSCALE_SLURM_DIR:-/tmp/trainscale-slurm}
NNODES=${NNODES:-2}; CPUS=${CPUS:-$(nproc)}; GPUS=${GPUS:-2}; TASKPLUGIN=${TASKPLUGIN:-task/none}
ACCT=${SLURM_ACCOUNT:-trainscale}; PORT_BASE=${PORT_BASE:-16817}
CTLD_PORT=$PORT_BASE; DBD_PORT=$((PORT_BASE + 2)); NODE_PORT=$((PORT_BASE + 100))
ETC=/etc/slurm; MARK="# written by trainscale scripts/local-slurm.sh"
export MYSQL_UNIX_PORT=$D/mysql/mysqld.sock
PKGS="slurm-wlm munge slurmdbd mariadb-server"

die() { echo "local-slurm: $*" >&2; exit 1; }
waitfor() {  # waitfor SECONDS COMMAND...: poll until COMMAND succeeds
  local n=$(($1 * 5)); shift
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "timed out waiting for: $* (logs in $D/log)"
}
record() {  # record NAME PIDFILE: remember a daemon we started (stop kills only these)
  for _ in $(seq 100); do [ -s "$2" ] && break; sleep 0.1; done
  [ -s "$2" ] || die "$1 did not write $2 (logs in $D/log)"
  echo "$1 $(cat "$2")" >> "$D/pids"
}

install_packages() {  # idempotent; policy-rc.d keeps apt from starting the services itself
  local need="" p made=""
  for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need="$need $p"
  done
  [ -z "$need" ] && return 0
  echo "local-slurm: installing$need"
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made=1
  fi
  apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
  [ -z "$made" ] || rm -f /usr/sbin/policy-rc.d
}

forget_config() {  # a slurm.conf naming a stopped controller costs every SLURM client ~9 s
  local f
  for f in slurm.conf gres.conf slurmdbd.conf; do ours "$ETC/$f" && rm -f "$ETC/$f"; done
  return 0
}

stop() {
  # without the pids file (a start that died early) our configuration may still be there
  [ -f "$D/pids" ] || { forget_config; echo "local-slurm: not running ($D/pids absent)"; return 0; }
  if scontrol ping 2>/dev/null | grep -q UP; then  # end our jobs first, so none is left behind
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
    sleep 1
  fi
  local alive="" name pid
  while read -r name pid; do  # only PIDs we recorded, and only while they are still that daemon
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
      kill "$pid" && alive="$alive $pid" && echo "local-slurm: stop $name $pid"
    fi
  done < "$D/pids"
  for _ in $(seq 50); do
    local left=""
    for pid in $alive; do kill -0 "$pid" 2>/dev/null && left="$left $pid"; done
    alive=$left; [ -z "$alive" ] && break; sleep 0.2
  done
  # shellcheck disable=SC2086
  [ -z "$alive" ] || kill -9 $alive
  rm -f "$D/pids"
  forget_config
}

ours() { [ -f "$1" ] && head -1 "$1" | grep -qxF "$MARK"; }

write_config() {
  local host mem n g
  host=$(hostname -s)
  mem=$(($(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) * 8 / 10 / NNODES))
  echo "$MARK" > "$ETC/gres.conf"
  if [ "$GPUS" -gt 0 ]; then
    printf '%s\nAutoDetect=off\n' "$MARK" > "$ETC/gres.conf"
    for n in $(seq "$NNODES"); do
      for g in $(seq 0 $((GPUS - 1))); do ln -sf /dev/null "$D/gpu/n$n-gpu$g"; done
      echo "NodeName=n$n Name=gpu File=$D/gpu/n$n-gpu[0-$((GPUS - 1))]" >> "$ETC/gres.conf"
    done
  fi
  cat > "$ETC/slurm.conf" <<EOF
$MARK
ClusterName=trainscale
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort=$CTLD_PORT
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
SlurmdParameters=config_overrides
StateSaveLocation=$D/state/ctld
SlurmdSpoolDir=$D/state/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=$TASKPLUGIN
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
KillWait=10
ReturnToService=2
MailProg=/bin/true
$([ "$GPUS" -gt 0 ] && echo GresTypes=gpu)
NodeName=n[1-$NNODES] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$NODE_PORT-$((NODE_PORT + NNODES - 1))] CPUs=$CPUS RealMemory=$mem $([ "$GPUS" -gt 0 ] && echo "Gres=gpu:$GPUS") State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat > "$ETC/slurmdbd.conf" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=trainscale_slurm_acct
LogFile=$D/log/slurmdbd.log
PidFile=$D/run/slurmdbd.pid
EOF
  chmod 600 "$ETC/slurmdbd.conf"
}

start() {
  [ "$(id -u)" = 0 ] || die "run as root (slurmd runs jobs as their users)"
  local t0; t0=$(date +%s%N)
  install_packages
  stop >/dev/null
  if [ -e "$ETC/slurm.conf" ] && ! ours "$ETC/slurm.conf"; then
    die "$ETC/slurm.conf exists and was not written by this script: a SLURM is configured here"
  fi
  rm -rf "$D"; mkdir -p "$ETC" "$D"/{state/ctld,log,run,gpu,mysql}; : > "$D/pids"
  write_config

  # munge: reuse one that answers (it is shared by every SLURM on the host), else start one
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    [ -s /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge && chown munge:munge /run/munge && rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged; record munged /run/munge/munged.pid
    waitfor 20 sh -c "munge -n | unmunge"
  fi

  # MariaDB on a unix socket in $D only (no TCP); root logs in through the socket
  chown mysql:mysql "$D/mysql"
  mariadb-install-db --no-defaults --datadir="$D/mysql" --user=mysql --skip-test-db \
    --auth-root-authentication-method=socket > "$D/log/mysql-install.log" 2>&1
  setsid /usr/sbin/mariadbd --no-defaults --datadir="$D/mysql" --user=mysql --skip-networking \
    --socket="$MYSQL_UNIX_PORT" --pid-file="$D/mysql/mariadbd.pid" \
    --log-error="$D/mysql/mariadbd.err" --innodb-buffer-pool-size=128M \
    --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1 &
  record mariadbd "$D/mysql/mariadbd.pid"
  waitfor 60 mariadb-admin --socket="$MYSQL_UNIX_PORT" ping

  slurmdbd; record slurmdbd "$D/run/slurmdbd.pid"
  waitfor 60 sacctmgr -n list cluster
  slurmctld; record slurmctld "$D/run/slurmctld.pid"
  waitfor 60 sh -c "scontrol ping | grep -q UP"
  for n in $(seq "$NNODES"); do slurmd -N "n$n"; record slurmd "$D/run/slurmd-n$n.pid"; done
  waitfor 60 sh -c "[ \"\$(sinfo -h -t idle -o %D)\" = $NNODES ]"
  waitfor 60 sh -c "sacctmgr -n -P list cluster format=cluster | grep -qx trainscale"
  sacctmgr -i -Q add account "$ACCT" Description=trainscale Organization=trainscale >/dev/null
  sacctmgr -i -Q add user root account="$ACCT" >/dev/null
  sinfo -N -o "%N %t %c %m %G"
  echo "local-slurm: up in $((($(date +%s%N) - t0) / 1000000)) ms; account $ACCT, partition debug"
  echo "local-slurm: sbatch/squeue/sacct and snakemake --profile slurm use it; stop: $0 stop"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) [ -f "$D/pids" ] && sinfo -N -o "%N %t %c %m %G" || die "not running" ;;
  *) die "usage: $0 start|stop|status" ;;
esac
