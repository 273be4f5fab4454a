#!/usr/bin/env bash
# A real single-node Slurm on this machine, from Debian's packages (munge, slurmctld, slurmd), configured for
# this host alone in a temporary folder, runs the documented batch script (slurm_ddp.sbatch under scripts/)
# with 2 tasks: stage 01, then stage 05 (tiny, one step). Each job must print its PASS line. Everything started
# here is stopped on exit, whatever happens; nothing is written outside the temporary folder.
#
#   tests/slurm.sh BIN_DIR        (ctest: slurm_single_node, TIMEOUT 300)
# Exit 0: both jobs passed; 1: a job failed (its output is printed), a wait ran out (the node's and the job's
# state and the daemons' logs are printed), or Slurm/munge is missing although scripts/setup/install_deps.sh
# installs it (run it); 77: skipped, with the reason: not root.
#
# Every wait is bounded, and all of them together end well before ctest's 300 s, so that this script, not
# ctest, reports what was stuck: munged and slurmctld answering and the node IDLE (60 s in all), then each job
# started (40 s after its submission) and ended (60 s); every Slurm command has 5 s (15 s for sbatch). At most
# about 240 s with the diagnosis and the teardown; a passing run takes 9-13 s on 2 cores.
set -u
bin=${1:?usage: tests/slurm.sh BIN_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "a private Slurm needs root (slurmd runs jobs as their user)"
for t in munged mungekey munge unmunge slurmctld slurmd sbatch scontrol sinfo squeue scancel; do
  command -v $t >/dev/null || fail "no $t: run bash scripts/setup/install_deps.sh (it installs slurmd slurmctld slurm-client munge)"
done
# The documented batch script, wherever under scripts/ it lives.
sbatch_file=$root/scripts/machines/slurm_ddp.sbatch
[ -f "$sbatch_file" ] || sbatch_file=$(find "$root/scripts" -name slurm_ddp.sbatch -type f 2>/dev/null | sort | head -n 1)
[ -n "$sbatch_file" ] && [ -f "$sbatch_file" ] || fail "no slurm_ddp.sbatch under $root/scripts"

tmp=$(mktemp -d /tmp/dp-slurm.XXXXXX)
conf=$tmp/slurm.conf
pids=() names=() ctld=""  # the daemons and their names; slurmctld's pid once started
cleanup() {
  local p i ids
  trap - EXIT INT TERM HUP
  # Jobs first (their steps are slurmstepd's, which outlive slurmd), then the daemons: TERM, up to 5 s, KILL.
  if [ -n "$ctld" ] && kill -0 "$ctld" 2>/dev/null; then
    ids=$(SLURM_CONF=$conf timeout 5 squeue -h -o %i 2>/dev/null)
    [ -n "$ids" ] && SLURM_CONF=$conf timeout 5 scancel $ids >/dev/null 2>&1
  fi
  unset SLURM_CONF  # nothing started from here on carries it, so the sweep below finds only what we started
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    i=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && i=1; done
    [ $i = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  # What slurmd started (slurmstepd, the job's ranks) carries this run's own SLURM_CONF: end it too.
  for p in $(grep -lzxF "SLURM_CONF=$conf" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
    [ "$p" != $$ ] && kill -9 "$p" 2>/dev/null
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
host=$(hostname -s)
# Ports (slurmctld's, slurmd's; rank 0's store, picked again just before each job, so that another test has
# only a moment to take it) picked as the launcher picks its own: free now and outside the kernel's ephemeral
# range, so no outgoing connection of a test running beside this one takes them first.
ports=($("$bin/ddp_launch" --free-ports 2)) && [ ${#ports[@]} = 2 ] || fail "ddp_launch --free-ports 2 found no ports"

# What is printed when a wait runs out or a daemon exits: the node, the queue, the job, the daemons' logs.
diagnose() {  # [job id]
  if [ -n "$ctld" ]; then  # once slurmctld was started
    echo "---- scontrol show node"; timeout 5 scontrol show node 2>&1
    echo "---- squeue (id, state, reason)"; timeout 5 squeue -o '%i %T %r' 2>&1
    [ -n "${1:-}" ] && { echo "---- scontrol show job $1"; timeout 5 scontrol show job "$1" 2>&1; }
  fi
  local d f
  for d in slurmctld slurmd munged; do  # its log file, else what it wrote to stderr
    f=$tmp/$d.log; [ -s "$f" ] || f=$tmp/$d.out
    [ -s "$f" ] && { echo "---- last 25 lines of ${f##*/}"; tail -n 25 "$f"; }
  done
}
dead() {  # the daemons that have exited, if any
  local i d=""
  for i in "${!pids[@]}"; do kill -0 "${pids[i]}" 2>/dev/null || d+=" ${names[i]}"; done
  echo "$d"
}
start() {  # name, command...: a daemon in the foreground, its own output in $tmp/name.out
  local name=$1; shift
  "$@" > "$tmp/$name.out" 2>&1 &
  pids+=($!) names+=("$name")
}
waited() {  # what, deadline (in $SECONDS), command...: 0 once the command succeeds; 1 at the deadline or when a
  local what=$1 until=$2 d; shift 2  # daemon exits (both said, with the diagnosis)
  local rc
  while :; do
    "$@"; rc=$?
    [ $rc = 0 ] && return 0
    [ $rc = 2 ] && { diagnose; return 1; }  # the command says waiting is no use (it returns 2 for nothing else)
    d=$(dead)
    [ -n "$d" ] && { echo "exited while waiting for $what:$d"; diagnose; return 1; }
    [ $SECONDS -ge $until ] && { echo "waited in vain for $what"; diagnose; return 1; }
    sleep 0.2
  done
}

# munge: a key of our own and a socket in the temporary folder, so a system munged is never touched.
mungekey -c -k "$tmp/munge.key" -b 1024 || fail "mungekey could not create a key"
chmod 600 "$tmp/munge.key"
start munged munged -F --force -S "$tmp/munge.sock" --key-file="$tmp/munge.key" --pid-file="$tmp/munged.pid" \
    --log-file="$tmp/munged.log" --seed-file="$tmp/munged.seed"
munge_ok() { munge -n -S "$tmp/munge.sock" 2>/dev/null | unmunge -S "$tmp/munge.sock" >/dev/null 2>&1 || return 1; }
up_until=$((SECONDS + 60))  # munged and slurmctld answering, the node IDLE: 60 s from here
waited "munged to answer" $up_until munge_ok || fail "munged did not answer"

# The controller and the node by address: this host's name need not resolve (a container's often does not).
# Timeouts for a loaded machine (ctest runs other tests beside this one): Slurm's defaults give slurmd 10 s
# (MessageTimeout, BatchStartTimeout) to confirm a batch job's launch; a slurmd held up longer had the job
# requeued and left in COMPLETING/PENDING for minutes ("Could not confirm batch launch for job 1"). With
# JobRequeue=0 a launch that fails anyway ends the job (its state says so) instead of requeueing it, and
# KillOnBadExit=1 ends the other rank when one exits non-zero instead of leaving it waiting for rank 0.
cat > "$conf" <<EOF
ClusterName=dp
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmctldPort=${ports[0]}
SlurmdPort=${ports[1]}
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
MessageTimeout=60
BatchStartTimeout=60
JobRequeue=0
KillOnBadExit=1
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=dp Nodes=$host Default=YES MaxTime=10 State=UP
EOF
mkdir -p "$tmp/state" "$tmp/spool"
export SLURM_CONF=$conf
start slurmctld slurmctld -D -f "$conf"
ctld=${pids[-1]}
start slurmd slurmd -D -f "$conf" -N "$host"
ctld_ok() { timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' || return 1; }
waited "slurmctld to answer" $up_until ctld_ok || fail "slurmctld did not answer within 60 s (see above)"
# IDLE and nothing else: not IDLE+NOT_RESPONDING (sinfo's idle*), not drained. A node drained or invalid
# stays so: no use waiting for it.
node_idle() {
  local s
  s=$(timeout 5 scontrol show node -o "$host" 2>/dev/null | grep -oE 'State=[A-Z_+]+')
  [[ "$s" =~ DRAIN|INVALID|FAIL ]] && { echo "node $host is ${s#State=}: no use waiting"; return 2; }
  [ "$s" = State=IDLE ]
}
waited "node $host to be IDLE" $up_until node_idle || fail "node $host was not IDLE within 60 s (see above)"
timeout 5 sinfo

job() {  # name, expected PASS regex, program and options
  local name=$1 expect=$2; shift 2
  local out=$tmp/$name.out id port state js="" reason t0=$SECONDS started=0
  port=$("$bin/ddp_launch" --free-ports 1) || fail "ddp_launch --free-ports 1 found no port"
  # Submitted, then polled every 0.2 s: `sbatch --wait` polls at growing intervals and returned 5-7 s after
  # each job had ended (half of this test's time).
  id=$(cd "$root" && MASTER_PORT=$port timeout 15 sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
      --time=2 --output="$out" "$sbatch_file" "$@") || { echo "sbatch refused job $name"; diagnose; exit 1; }
  id=${id%%;*}
  while :; do
    state=$(timeout 5 scontrol show job -o "$id" 2>/dev/null)
    js=$(grep -oE 'JobState=[A-Z_]+' <<<"$state"); js=${js#JobState=}
    [[ "$js" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)$ ]] && break
    [ -n "$js" ] && [ "$js" != PENDING ] && started=1
    reason=$(grep -oE 'Reason=[^ ]+' <<<"$state")
    if [ -n "$(dead)" ]; then
      echo "slurm job $name ($id, ${js:-state unknown}): daemons exited:$(dead)"; diagnose "$id"; exit 1
    elif [ $started = 0 ] && [ $((SECONDS - t0)) -ge 40 ]; then
      echo "slurm job $name ($id) submitted, not started in 40 s (${js:-state unknown} ${reason})"
      diagnose "$id"; exit 1
    elif [ $((SECONDS - t0)) -ge 60 ]; then
      echo "slurm job $name ($id) not ended 60 s after its submission (${js} ${reason}); its output so far:"
      cat "$out" 2>/dev/null; diagnose "$id"; exit 1
    fi
    sleep 0.2
  done
  if [ "$js" = COMPLETED ] && [[ "$state" =~ ExitCode=0:0 ]] && grep -qE "$expect" "$out"; then
    echo "slurm job $name: $(grep -E "$expect" "$out" | tail -n 1)"
  else
    echo "slurm job $name failed ($(grep -oE 'JobState=[A-Z_]+|Reason=[^ ]+|ExitCode=[0-9:]+' <<<"$state" | tr '\n' ' ')); its output:"
    cat "$out" 2>/dev/null
    diagnose "$id"
    failed=1
  fi
}
failed=0
job stage01 "PASS" "$bin/stage01_allreduce"
job stage05 "PASS stage 05" "$bin/stage05_bucketed" --bench --preset tiny --context 16 --warmup 0 --steps 1 \
    --caps 1 --variants bucketed
exit $failed
