#!/usr/bin/env bash
# A real 2-node Slurm on this machine for tests/slurm (Debian's slurm-wlm 22.05 + munge).
#
#   bash tests/engines/slurm_cluster.sh install   # Debian packages, if missing (root)
#   bash tests/engines/slurm_cluster.sh up        # config + daemons; prints SLURM READY
#   bash tests/engines/slurm_cluster.sh down      # stop what 'up' started, drop the hosts block
#
# Two fake nodes tfrun-node1/tfrun-node2: two slurmd (`slurmd -N <node>`) on this machine,
# their names resolving (an /etc/hosts block) to 127.0.10.1/.2, so TF_CONFIG can carry
# "tfrun-node2:PORT". Both are this machine: one port space, one hostname; a process tells
# its node by $SLURMD_NODENAME. Every daemon listens on 127.0.0.1 only.
# Adapted from ../shared/engines/slurm-local.sh.
set -euo pipefail

MARK="# tfrun-tests-slurm"
CONF=/etc/slurm/slurm.conf
RUN=/run/tfrun-tests-slurm
log() { echo "[slurm_cluster] $*"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null \
    && command -v munged >/dev/null && return 0
  log "installing slurmctld slurmd slurm-client munge"
  # No daemon may start while installing (no systemd here; the tests start their own).
  local made=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d; made=1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
  if [ "$made" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
}

# /etc/hosts without this script's block, then (add) with it. Rewritten in place, never
# replaced (not sed -i): a file renamed over /etc/hosts detaches every mount on it in every
# mount namespace, and the fake hosts' (tests/multihost) bind their own hosts file there.
hosts_block() {
  local kept
  kept=$(grep -v "$MARK\$" /etc/hosts || true)
  {
    printf '%s\n' "$kept"
    if [ "$1" = add ]; then for i in 1 2; do echo "127.0.10.$i tfrun-node$i $MARK"; done; fi
  } >/etc/hosts
}

up() {
  install
  mkdir -p "$RUN" /etc/munge /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
  chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key; chmod 0755 /run/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"; runuser -u munge -- /usr/sbin/munged; touch "$RUN/started-munged"
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  hosts_block add
  mkdir -p /etc/slurm /var/spool/slurm/tfrun-tests-ctld /var/log/slurm /run/slurm
  local conf
  conf=$(cat <<CONF
# written by tests/engines/slurm_cluster.sh: 2 fake nodes, all traffic on 127.0.0.1
ClusterName=tfruntests
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
KillWait=5
MinJobAge=600
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmdSpoolDir=/var/spool/slurm/tfrun-tests-d-%n
StateSaveLocation=/var/spool/slurm/tfrun-tests-ctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
NodeName=tfrun-node[1-2] NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
)
  if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$conf" ]; then
    printf '%s\n' "$conf" >"$CONF"
    for pf in /run/slurm/slurmd-*.pid /run/slurm/slurmctld.pid; do
      if [ -e "$pf" ] && alive "$pf"; then log "config changed: stopping pid $(cat "$pf")"; kill "$(cat "$pf")"; fi
    done
    sleep 1
  fi
  alive /run/slurm/slurmctld.pid || { log "starting slurmctld"; slurmctld -c; }
  for n in tfrun-node1 tfrun-node2; do
    alive "/run/slurm/slurmd-$n.pid" || { log "starting slurmd -N $n"; slurmd -N "$n"; }
  done
  for _ in $(seq 150); do
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null || true)
    if [ -n "$states" ] && ! echo "$states" | grep -qvE ' idle$'; then log "SLURM READY"; return 0; fi
    if echo "$states" | grep -qE 'down|drain'; then scontrol update nodename=ALL state=resume 2>/dev/null || true; fi
    sleep 0.2
  done
  sinfo >&2 || true
  tail -5 /var/log/slurm/slurmctld.log >&2 || true
  echo "[slurm_cluster] nodes not idle; see /var/log/slurm/" >&2
  return 1
}

stop_pid() {
  local pf=$1 pid
  [ -s "$pf" ] || return 0
  pid=$(cat "$pf")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$pf"
}

down() {
  if command -v scancel >/dev/null; then scancel --quiet -u root 2>/dev/null || true; fi
  for pf in /run/slurm/slurmd-*.pid; do stop_pid "$pf"; done
  stop_pid /run/slurm/slurmctld.pid
  if [ -e "$RUN/started-munged" ]; then stop_pid /run/munge/munged.pid; rm -f "$RUN/started-munged"; fi
  hosts_block drop
  log "stopped"
}

case "${1:-}" in
  install) install ;;
  up) up ;;
  down) down ;;
  *) echo "usage: $0 install|up|down" >&2; exit 2 ;;
esac
