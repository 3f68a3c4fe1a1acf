#!/usr/bin/env bash
# A throwaway one-node Slurm cluster with job accounting, for testing the workflow's cluster
# path (profiles/slurm, Snakemake's Slurm executor plugin) on one machine without a GPU.
#
#   bash tools/slurm-local.sh check          # exit 3, naming what is missing, if it cannot run
#   bash tools/slurm-local.sh start DIR      # start it; then: source DIR/env
#   bash tools/slurm-local.sh stop DIR       # cancel its jobs, stop its daemons
#
# Everything lives in DIR (a new or empty folder): configuration, munge key and socket, the
# accounting database, state, spool, logs and pid files. Its ports are free ones picked at
# start. Nothing under /etc is read or written (the daemons get their files on the command
# line or through SLURM_CONF; MariaDB runs with --no-defaults), so a cluster already configured
# on the machine is not touched. `stop` stops, by the pids they wrote, exactly the daemons
# `start` started, after cancelling the jobs of this cluster.
#
# Debian's packages (bookworm: Slurm 22.05, MariaDB 10.11, munge 0.5), as root:
#   apt-get install -y --no-install-recommends slurmctld slurmd slurm-client slurmdbd munge mariadb-server
#
# Why slurmdbd (job accounting, in MariaDB): sites run it, and snakemake-executor-plugin-slurm
# (2.8) leans on it. Its default status command is sacct whenever sacct is installed (always,
# with slurm-client); without accounting sacct answers "Slurm accounting storage is disabled",
# the plugin never learns that a job ended and the run waits forever (tried with this script's
# cluster less slurmdbd). profiles/slurm asks for squeue instead, for another reason (see
# there), but the plugin still turns to sacct where MinJobAge is short, checks an account given
# in the profile with sacctmgr, and the tests read each job's record with sacct.
#
# The node, `kbfuse`, declares more than a small machine has (SlurmdParameters=config_overrides):
# 16 CPUs, 64000 MB and two GPUs of type h200 (with no GPU behind them), so that the profile's
# requests (a GPU job asks for 4 CPUs, 16000 MB and a GPU) are scheduled as a site would
# schedule them, several runs at once. The jobs the tests run use little of it; a GPU "granted"
# here is a scheduling token, the job runs on the CPU. Memory is enforced by polling each job's
# RSS (jobacct_gather/linux with OverMemoryKill, every second), which needs no cgroups: such a
# job ends FAILED, where a cgroup limit would make it OUT_OF_MEMORY. MinJobAge is an hour, so
# that `scontrol show job` still shows a test session's finished jobs.
set -euo pipefail

NODE=kbfuse
PARTITION=main
ACCOUNT=kbfuse
CLUSTER=kbfuse
NODE_CPUS=16
NODE_MEMORY_MB=64000
NODE_GPUS=2  # one gres.conf line each
GPU_TYPE=h200
PROGRAMS=(munged slurmctld slurmd slurmdbd sbatch squeue sacct sacctmgr scontrol scancel sinfo
    srun mariadbd mariadb-install-db mariadb python3)
PACKAGES="slurmctld slurmd slurm-client slurmdbd munge mariadb-server"

die() {
    echo "slurm-local: $*" >&2
    exit 1
}

check() {
    local missing=()
    for program in "${PROGRAMS[@]}"; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$program" >/dev/null || missing+=("$program")
    done
    if ((${#missing[@]})); then
        echo "slurm-local: not installed: ${missing[*]} (Debian: apt-get install -y" \
            "--no-install-recommends $PACKAGES)" >&2
        exit 3
    fi
    [[ $(id -u) == 0 ]] || { echo "slurm-local: must run as root (slurmd starts jobs)" >&2; exit 3; }
}

free_ports() {  # N free TCP ports on 127.0.0.1, one a line
    python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print("\n".join(str(s.getsockname()[1]) for s in socks))
EOF
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: run COMMAND until it succeeds
    local seconds=$1 what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$what not ready after $seconds s (logs: $DIR/log)"
        sleep 0.2
    done
}

write_configs() {
    local ctld_port=$1 slurmd_port=$2 dbd_port=$3 db_port=$4 host
    host=$(hostname -s)
    cat >"$DIR/etc/slurm.conf" <<EOF
# Written by tools/slurm-local.sh: a one-node test cluster in $DIR
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmSchedLogFile=$DIR/log/sched.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
AccountingStoragePass=$DIR/munge/munge.socket
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
ReturnToService=2
KillWait=2
MinJobAge=3600
InactiveLimit=0
NodeName=$NODE NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$NODE_CPUS RealMemory=$NODE_MEMORY_MB Gres=gpu:$GPU_TYPE:$NODE_GPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    # Slurm 22.05 drops a GPU without a device file. It only stats the file here (task/none:
    # no device cgroup), so two character devices every machine has stand in for two GPUs.
    cat >"$DIR/etc/gres.conf" <<EOF
NodeName=$NODE Name=gpu Type=$GPU_TYPE File=/dev/null
NodeName=$NODE Name=gpu Type=$GPU_TYPE File=/dev/zero
EOF
    cat >"$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DIR/etc/slurmdbd.conf"
    # Inside a job, snakemake-executor-plugin-slurm-jobstep (0.6.1) calls srun with every
    # SLURM_* variable but the job's identity removed, SLURM_CONF too, so a plain srun would
    # look for /etc/slurm/slurm.conf and fail ("Could not establish a configuration source").
    # This srun, first on the jobs' PATH, puts it back.
    cat >"$DIR/bin/srun" <<EOF
#!/bin/sh
SLURM_CONF=$DIR/etc/slurm.conf exec $(command -v srun) "\$@"
EOF
    chmod 755 "$DIR/bin/srun"
    # shellcheck disable=SC2016  # $PATH expands where the file is sourced
    printf 'export SLURM_CONF=%s\nexport PATH=%s:"$PATH"\n' "$DIR/etc/slurm.conf" "$DIR/bin" \
        >"$DIR/env"
}

start_munge() {
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$DIR/munge/munge.key"
    # --force: munged refuses a socket below a folder that not everyone may enter, as pytest's
    # temporary folders are (it then only warns)
    munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed"
}

start_database() {
    local port=$1
    mariadb-install-db --no-defaults --datadir="$DIR/db" --user=root --skip-test-db \
        --auth-root-authentication-method=socket >"$DIR/log/mariadb-install.log" 2>&1 ||
        die "mariadb-install-db failed: $DIR/log/mariadb-install.log"
    # --no-defaults: none of /etc/mysql is read, so a database server of the machine is not
    # touched; TCP on 127.0.0.1 only, and a socket in DIR for the setup below.
    mariadbd --no-defaults --datadir="$DIR/db" --user=root --bind-address=127.0.0.1 \
        --port="$port" --socket="$DIR/run/mariadb.sock" --pid-file="$DIR/run/mariadb.pid" \
        --log-error="$DIR/log/mariadb.log" --skip-name-resolve --innodb-buffer-pool-size=16M \
        --skip-log-bin </dev/null >/dev/null 2>&1 &
    echo $! >"$DIR/run/mariadb.pid"  # (mariadbd writes the same once it is up)
    wait_for 60 MariaDB mariadb --no-defaults --socket="$DIR/run/mariadb.sock" -u root -e 'select 1'
    mariadb --no-defaults --socket="$DIR/run/mariadb.sock" -u root -e \
        "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
         GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start() {
    check
    [[ -d $DIR && -n $(ls -A "$DIR") ]] && die "$DIR is not empty"
    mkdir -p "$DIR"/{bin,etc,munge,db,state,spool,log,run}
    chmod 755 "$DIR" "$DIR/munge"
    DIR=$(cd "$DIR" && pwd)
    export SLURM_CONF=$DIR/etc/slurm.conf
    local ports
    mapfile -t ports < <(free_ports 4)
    write_configs "${ports[@]}"
    trap stop_after_failure EXIT
    start_munge
    start_database "${ports[3]}"
    slurmdbd
    wait_for 60 slurmdbd sacctmgr -n list cluster
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
    sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description=tests Organization=kbfuse >/dev/null
    sacctmgr -i add user root Account="$ACCOUNT" Cluster="$CLUSTER" >/dev/null
    slurmctld
    slurmd -N "$NODE"
    wait_for 60 "the node" node_idle
    trap - EXIT
    echo "slurm-local: cluster $CLUSTER up in $DIR (source $DIR/env)"
}

stop_after_failure() {
    local status=$?
    ((status == 0)) && return
    echo "slurm-local: start failed; stopping what it started" >&2
    stop >/dev/null 2>&1 || true
    exit "$status"
}

node_idle() {
    [[ $(sinfo -h -n "$NODE" -o %t) == idle ]]
}

stop_pids() {  # stop_pids NAME...: TERM the pids in DIR/run/NAME.pid, KILL those left after 20 s
    local name pids=()
    for name in "$@"; do
        [[ -s $DIR/run/$name.pid ]] && pids+=("$(<"$DIR/run/$name.pid")")
        rm -f "$DIR/run/$name.pid"
    done
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "${pids[@]}" 2>/dev/null || break  # succeeds while any is alive
        sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
}

stop() {
    [[ -f $DIR/etc/slurm.conf ]] || die "no cluster of slurm-local in $DIR"
    DIR=$(cd "$DIR" && pwd)
    export SLURM_CONF=$DIR/etc/slurm.conf
    if [[ -s $DIR/run/slurmctld.pid ]] && kill -0 "$(<"$DIR/run/slurmctld.pid")" 2>/dev/null; then
        scancel --full --user=root 2>/dev/null || true
        for _ in $(seq 50); do
            [[ -z $(squeue -h -t running,completing,pending 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
    # the scheduler first, then what it reports to and authenticates with
    stop_pids slurmd slurmctld
    stop_pids slurmdbd mariadb munged
    echo "slurm-local: stopped the cluster in $DIR"
}

case "${1:-}" in
check) check ;;
start | stop)
    [[ $# == 2 ]] || die "usage: $0 $1 DIR"
    DIR=$2
    "$1"
    ;;
*) die "usage: $0 check | start DIR | stop DIR" ;;
esac
