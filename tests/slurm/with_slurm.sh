#!/usr/bin/env bash
# Starts a private single-node Slurm cluster on this machine (Debian's Slurm
# 22.05: slurmctld, slurmd, munge), runs COMMAND inside it with SLURM_CONF
# pointing at the generated configuration, and always stops the daemons it
# started (by pid) when it exits.
#
#   tests/slurm/with_slurm.sh [--keep] [--cpus N] [--fake-gpus N] -- COMMAND [ARGS...]
#
# --cpus N (default 16) CPUs the node claims, more than the machine may have.
# --fake-gpus N gives the node N "gpu" generic resources with no device files
# behind them (plain files stand in for /dev/nvidiaN): enough for Slurm to
# schedule --gpus-per-task jobs (the sbatch template's test), not for CUDA.
#
# Exit status: COMMAND's, or 77 when this machine cannot host the cluster
# (not root, packages missing: the message says which and how to fix it).
# Everything lives under one temporary folder (configuration, state, spool,
# logs, munge socket); --keep leaves it in place for inspection. The daemons'
# logs are printed when COMMAND fails or the cluster does not come up.
#
# Needs root: slurmd launches job steps as the submitting user and munged must
# run as the munge user. Packages: slurmctld slurmd slurm-client munge
# (scripts/install_deps.sh installs them).
set -euo pipefail

keep=0
cpus=16
gpus=0
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    --keep) keep=1; shift ;;
    --cpus) cpus=$2; shift 2 ;;
    --fake-gpus) gpus=$2; shift 2 ;;
    *) echo "with_slurm.sh: unknown option $1" >&2; exit 64 ;;
  esac
done
[[ ${1:-} == -- ]] && shift
if [[ $# -eq 0 ]]; then
  echo "usage: $0 [--keep] [--cpus N] [--fake-gpus N] -- COMMAND [ARGS...]" >&2
  exit 64
fi

die_env() {  # the machine cannot host the cluster: say why, exit 77
  echo "with_slurm.sh: cannot start a Slurm cluster here: $*" >&2
  exit 77
}
[[ $(id -u) -eq 0 ]] || die_env "it must run as root (slurmd launches job steps and munged runs as the munge user); run the tests as root or in a container where you are root"
for b in slurmctld slurmd srun scontrol sinfo munged runuser; do
  command -v "$b" >/dev/null || PATH=$PATH:/usr/sbin:/sbin
  command -v "$b" >/dev/null || die_env "'$b' is not installed; run scripts/install_deps.sh (packages slurmctld slurmd slurm-client munge)"
done
id munge >/dev/null 2>&1 || die_env "no 'munge' user; reinstall the munge package"
[[ -r /etc/munge/munge.key ]] || die_env "/etc/munge/munge.key is missing; reinstall the munge package"

T=$(mktemp -d /tmp/adgt-slurm.XXXXXX)
chmod 755 "$T"  # munged (as the munge user) must reach $T/munge
pids=()
show_logs() {
  for f in "$T"/log/*.log; do
    [[ -f $f ]] || continue
    echo "---- $f (last 40 lines) ----" >&2
    tail -n 40 "$f" >&2
  done
}
# Processes still holding files of this cluster open (job step daemons,
# slurmstepd, outlive slurmd and keep its log open), by pid.
cluster_pids() {
  local d p
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [[ $p == "$$" || $p == "$BASHPID" ]] && continue
    if ls -l "$d/fd" 2>/dev/null | grep -q -- "-> $T/"; then echo "$p"; fi
  done
}
cleanup() {
  local rc=$?
  set +e
  # Let running jobs end first (their slurmstepd reports to slurmd), at most 10 s.
  if [[ ${#pids[@]} -ge 3 ]] && kill -0 "${pids[1]}" 2>/dev/null; then
    jobs_left=$(squeue -h -o %i 2>/dev/null)
    if [[ -n $jobs_left ]]; then
      scancel $jobs_left 2>/dev/null
      for _ in $(seq 100); do [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break; sleep 0.1; done
    fi
  fi
  # Newest first: slurmd, slurmctld, then munged.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null
  done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  local left
  left=$(cluster_pids)
  if [[ -n $left ]]; then
    kill -TERM $left 2>/dev/null
    sleep 1
    left=$(cluster_pids)
    [[ -n $left ]] && kill -KILL $left 2>/dev/null
  fi
  if [[ $rc -ne 0 ]]; then show_logs; fi
  if [[ $keep -eq 1 ]]; then echo "with_slurm.sh: kept $T" >&2; else rm -rf "$T"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$T/munge" "$T/munge-run" "$T/state" "$T/spool" "$T/log" "$T/etc"
# ---- munge: a private daemon with its own socket, as the munge user ----
cp /etc/munge/munge.key "$T/munge/munge.key"
chown -R munge:munge "$T/munge" "$T/munge-run"
chmod 700 "$T/munge"         # key, seed, log: the munge user's alone
chmod 755 "$T/munge-run"     # the socket's folder: every client must reach it
chmod 400 "$T/munge/munge.key"
sock=$T/munge-run/munge.socket
runuser -u munge -- munged -F --socket="$sock" --key-file="$T/munge/munge.key" \
  --pid-file="$T/munge-run/munged.pid" --seed-file="$T/munge/munged.seed" \
  --log-file="$T/munge/munged.log" >"$T/log/munged.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
if [[ ! -S $sock ]]; then
  cat "$T/munge/munged.log" >&2 2>/dev/null || true
  echo "with_slurm.sh: munged did not create $sock" >&2
  exit 1
fi

# ---- two free TCP ports for slurmctld and slurmd ----
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo $p; return; fi
  done
  echo "with_slurm.sh: no free port found" >&2; return 1
}
# ---- the node's generic resources (fake GPUs) ----
node=adgtnode
gres_types= node_gres=
if [[ $gpus -gt 0 ]]; then
  gres_types="GresTypes=gpu"
  node_gres="Gres=gpu:$gpus"
  # Slurm drops file-less GPUs: plain files stand in for /dev/nvidiaN.
  mkdir -p "$T/dev"
  for ((g = 0; g < gpus; g++)); do : >"$T/dev/fakegpu$g"; done
  echo "AutoDetect=off" >"$T/etc/gres.conf"
  echo "Name=gpu File=$T/dev/fakegpu[0-$((gpus - 1))]" >>"$T/etc/gres.conf"
fi
# ---- slurm.conf with two fresh ports; slurmctld and slurmd; wait until idle ----
# A start-up can fail for reasons outside adgt: a port that another process took
# between free_port's check and the daemon's bind, or munged not yet answering
# when slurmctld first authenticates ("Unauthorized credential" in munged's log).
# start_cluster returns 1 then (the daemons it started are stopped again) and the
# caller tries again with new ports, three times in all.
write_conf() {
  cat >"$T/etc/slurm.conf" <<EOF
# Generated by tests/slurm/with_slurm.sh: a one-node cluster on 127.0.0.1.
ClusterName=adgt
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock,cred_expire=5
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/state/slurmctld.pid
SlurmdPidFile=$T/spool/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
$gres_types
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$(hostname) CPUs=$cpus $node_gres State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
}
stop_slurm_daemons() {  # the slurmctld and slurmd of a failed attempt
  local p
  while [[ ${#pids[@]} -gt 1 ]]; do
    p=${pids[-1]}
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    unset 'pids[-1]'
  done
}
start_cluster() {
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  while [[ $slurmd_port == "$ctld_port" ]]; do slurmd_port=$(free_port); done
  write_conf
  rm -rf "$T/state"/* "$T/spool"/*
  slurmctld -D -i -f "$SLURM_CONF" >"$T/log/slurmctld.out" 2>&1 &
  pids+=($!)
  slurmd -D -N "$node" -f "$SLURM_CONF" >"$T/log/slurmd.out" 2>&1 &
  pids+=($!)
  state=
  for i in $(seq 300); do
    for p in "${pids[@]}"; do
      kill -0 "$p" 2>/dev/null || { echo "with_slurm.sh: a daemon (pid $p) exited during start-up" >&2; return 1; }
    done
    state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
    case $state in
      idle*) break ;;
      down*|drain*|unknown*|"") ((i % 10 == 0)) && scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
  done
  if [[ $state != idle* ]]; then
    echo "with_slurm.sh: node $node did not become idle within 60 s (state '${state}')" >&2
    return 1
  fi
}
cat >"$T/etc/cgroup.conf" <<EOF
CgroupPlugin=autodetect
IgnoreSystemd=yes
EOF
export SLURM_CONF=$T/etc/slurm.conf
# Nothing of an enclosing allocation may leak into the private cluster.
while IFS='=' read -r k _; do
  [[ $k == SLURM_* && $k != SLURM_CONF ]] && unset "$k"
done < <(env)

for attempt in 1 2 3; do
  start_cluster && break
  show_logs
  stop_slurm_daemons
  if [[ $attempt -eq 3 ]]; then
    echo "with_slurm.sh: the cluster did not come up in 3 attempts" >&2
    exit 1
  fi
  echo "with_slurm.sh: start-up attempt $attempt failed; trying again with new ports" >&2
  sleep 1
done
echo "with_slurm.sh: cluster up (SLURM_CONF=$SLURM_CONF, node $node idle, $cpus CPUs, $gpus fake GPUs)" >&2

set +e
"$@"
rc=$?
set -e
if [[ $rc -ne 0 ]]; then echo "with_slurm.sh: command exited $rc" >&2; fi
exit $rc
