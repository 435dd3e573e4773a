#!/usr/bin/env bash
# A real Slurm 22.05 on this one machine, for the Slurm tests (Debian packages, run as root, no systemd).
#
#   tests/slurm/cluster.sh install   apt-get: slurm-wlm munge slurmdbd mariadb-server
#   tests/slurm/cluster.sh start     munged, mariadbd, slurmdbd, slurmctld, slurmd for n0 and n1
#   tests/slurm/cluster.sh stop      cancel every job, stop every daemon it started (by pid file)
#   tests/slurm/cluster.sh env       prints `export SLURM_CONF=...` (every client needs it)
#
# Two logical nodes on this host (a hetjob never puts two components on one node): n0 with a fake
# gpu:2 GRES (two char devices) and n1, one slurmd each. Short scheduler intervals and
# cred_expire=10 so a hetjob starts in ~1 s and a requeued job restarts in ~10 s. State lives in
# $POLAR_SLURM_DIR (default /tmp/polar-slurm); nothing under /etc is written.
set -euo pipefail
D=${POLAR_SLURM_DIR:-/tmp/polar-slurm}
export SLURM_CONF=$D/etc/slurm.conf DEBIAN_FRONTEND=noninteractive
SOCK=$D/munge/socket

say() { echo "[cluster.sh] $*" >&2; }
up() { local s; [ -s "$1" ] && s=$(ps -o stat= -p "$(cat "$1")" 2>/dev/null) && [[ $s != Z* ]]; }
until_ok() {  # until_ok SECONDS WHAT CMD...
  local end=$(( $(date +%s) + $1 )) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || { say "gave up waiting for $what"; return 1; }
    sleep 0.2
  done
}

install() {
  command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && return
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm munge slurmdbd mariadb-server >/dev/null
}

configure() {
  mkdir -p "$D"/{etc,log,run,gpu,munge,db,state/ctld,state/n0,state/n1}
  chmod 0755 "$D/munge"  # munged wants its socket folder o+x
  local i; for i in 0 1; do [ -e "$D/gpu/nvidia$i" ] || mknod -m 666 "$D/gpu/nvidia$i" c 1 3; done
  cat > "$SLURM_CONF" <<CONF
ClusterName=polar
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK,cred_expire=10
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$D/state/ctld
SlurmdSpoolDir=$D/state/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStoragePass=$SOCK
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_resolution=5,bf_hetjob_immediate,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=10
InactiveLimit=0
MinJobAge=300
NodeName=n0 NodeHostname=n0 NodeAddr=127.0.0.1 Port=6818 CPUs=8 RealMemory=8000 Gres=gpu:2 State=UNKNOWN
NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.2 Port=6828 CPUs=8 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=n0,n1 Default=YES MaxTime=INFINITE State=UP
CONF
  printf 'AutoDetect=off\nNodeName=n0 Name=gpu File=%s/gpu/nvidia[0-1]\n' "$D" > "$D/etc/gres.conf"
  cat > "$D/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$SOCK
DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=$D/log/slurmdbd.log
PidFile=$D/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=13306
StorageUser=slurm
StoragePass=polar
StorageLoc=polar_acct
CONF
  chmod 600 "$D/etc/slurmdbd.conf"
  cat > "$D/db/my.cnf" <<CONF
[mariadbd]
user=root
datadir=$D/db/data
socket=$D/db/sock
pid-file=$D/run/mariadbd.pid
log-error=$D/log/mariadbd.err
bind-address=127.0.0.1
port=13306
skip-name-resolve
innodb_buffer_pool_size=64M
CONF
}

start() {
  command -v slurmctld >/dev/null || { say "slurm is not installed: run '$0 install'"; exit 1; }
  configure
  if ! up "$D/run/munged.pid"; then
    [ -s "$D/munge/key" ] || head -c 1024 /dev/urandom > "$D/munge/key"
    chmod 0400 "$D/munge/key"
    munged --num-threads=10 --socket="$SOCK" --key-file="$D/munge/key" --pid-file="$D/run/munged.pid" \
      --log-file="$D/log/munged.log" --seed-file="$D/munge/seed"
  fi
  if ! up "$D/run/mariadbd.pid"; then
    [ -d "$D/db/data/mysql" ] || mariadb-install-db --defaults-file="$D/db/my.cnf" \
      --auth-root-authentication-method=socket --skip-test-db > "$D/log/mariadb-install.log" 2>&1
    nohup mariadbd --defaults-file="$D/db/my.cnf" >> "$D/log/mariadbd.out" 2>&1 &
    until_ok 60 mariadbd mariadb-admin --socket="$D/db/sock" ping
    mariadb --socket="$D/db/sock" -u root -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'polar';
      GRANT ALL ON polar_acct.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  fi
  up "$D/run/slurmdbd.pid" || slurmdbd  # reads slurmdbd.conf next to SLURM_CONF
  until_ok 60 slurmdbd sacctmgr -n list cluster
  sacctmgr -n -P list cluster format=cluster | grep -qx polar || sacctmgr -i add cluster polar >/dev/null
  if ! up "$D/run/slurmctld.pid"; then rm -rf "$D"/state/ctld/* "$D"/state/n0/* "$D"/state/n1/*; slurmctld; fi
  local n; for n in n0 n1; do up "$D/run/slurmd-$n.pid" || slurmd -N "$n"; done
  until_ok 60 "both nodes idle" bash -c '[ "$(sinfo -h -N -o %T | grep -cx idle)" = 2 ]' || { sinfo -N; exit 1; }
  say "up: $(sinfo -h -N -o '%N:%T:%G' | tr '\n' ' ')"
}

stop_pids() {  # TERM each daemon by its pid file, wait, KILL what is left
  local name pids=() i
  for name in "$@"; do up "$D/run/$name.pid" && { pids+=("$(cat "$D/run/$name.pid")"); kill -TERM "${pids[-1]}" || true; }; done
  for i in $(seq 100); do
    local left=0 p; for p in "${pids[@]}"; do s=$(ps -o stat= -p "$p" 2>/dev/null) && [[ $s != Z* ]] && left=1; done
    [ $left = 0 ] && break; sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for name in "$@"; do rm -f "$D/run/$name.pid"; done
}

stop() {
  if up "$D/run/slurmctld.pid"; then
    local jobs; jobs=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then scancel $jobs || true; until_ok 60 "the queue to drain" bash -c '[ -z "$(squeue -h)" ]' || true; fi
  fi
  stop_pids slurmd-n0 slurmd-n1 slurmctld
  stop_pids slurmdbd
  stop_pids mariadbd munged
  say "stopped"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "usage: $0 install|start|stop|env" >&2; exit 2 ;;
esac
