#!/usr/bin/env bash
# A real single-node Slurm on this machine, from Debian's packages (munge, slurmctld, slurmd), configured for
# this host alone in a temporary folder, runs the documented batch script (scripts/slurm_ddp.sbatch) with
# 2 tasks: stage 01, then stage 05 (tiny, one step). Each job must print its PASS line. Everything started
# here is stopped on exit, whatever happens; nothing is written outside the temporary folder.
#
#   tests/slurm.sh BIN_DIR        (ctest: slurm_single_node)
# Exit 0: both jobs passed; 1: a job failed (its output is printed), or Slurm/munge is missing although
# scripts/install_deps.sh installs it (run it); 77: skipped, with the reason: not root.
set -u
bin=${1:?usage: tests/slurm.sh BIN_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "a private Slurm needs root (slurmd runs jobs as their user)"
for t in munged mungekey slurmctld slurmd sbatch scontrol sinfo; do
  command -v $t >/dev/null || fail "no $t: run bash scripts/install_deps.sh (it installs slurmd slurmctld slurm-client munge)"
done

tmp=$(mktemp -d /tmp/dp-slurm.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
host=$(hostname -s)
# Three ports (slurmctld, slurmd, rank 0's store) picked as the launcher picks its own: free now and outside
# the kernel's ephemeral range, so no outgoing connection of a test running beside this one takes them first.
ports=($("$bin/ddp_launch" --free-ports 3)) && [ ${#ports[@]} = 3 ] || fail "ddp_launch --free-ports 3 found no ports"

# munge: a key of our own and a socket in the temporary folder, so a system munged is never touched.
mungekey -c -k "$tmp/munge.key" -b 1024 || fail "mungekey could not create a key"
chmod 600 "$tmp/munge.key"
munged -F --force -S "$tmp/munge.sock" --key-file="$tmp/munge.key" --pid-file="$tmp/munged.pid" \
    --log-file="$tmp/munged.log" --seed-file="$tmp/munged.seed" &
pids+=($!)

# The controller and the node by address: this host's name need not resolve (a container's often does not).
cat > "$tmp/slurm.conf" <<EOF
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
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=dp Nodes=$host Default=YES MaxTime=10 State=UP
EOF
mkdir -p "$tmp/state" "$tmp/spool"
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -f "$tmp/slurm.conf" &
pids+=($!)
slurmd -D -f "$tmp/slurm.conf" -N "$host" &
pids+=($!)
up=0 died="" names=(munged slurmctld slurmd)
for _ in $(seq 30); do  # idle within 30 s, or fail at once when a daemon has exited (it says why in its log)
  sinfo -h -o %T 2>/dev/null | grep -q idle && { up=1; break; }
  for i in 0 1 2; do kill -0 "${pids[i]}" 2>/dev/null || died+=" ${names[i]}"; done
  [ -n "$died" ] && break
  sleep 1
done
if [ $up = 0 ]; then
  [ -n "$died" ] && echo "exited during start-up:$died"
  echo "slurm did not come up; its logs:"
  tail -n 20 "$tmp"/slurmctld.log "$tmp"/slurmd.log "$tmp"/munged.log 2>/dev/null
  fail "Slurm's daemons did not come up (see the logs above)"
fi
sinfo

failed=0
job() {  # name, expected PASS regex, program and options
  local name=$1 expect=$2; shift 2
  local out=$tmp/$name.out
  # Submitted, then polled every 0.2 s: `sbatch --wait` polls at growing intervals and returned 5-7 s after
  # each job had ended (half of this test's time).
  local id rc=1 state=""
  id=$(cd "$root" && MASTER_PORT=${ports[2]} sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
      --time=5 --output="$out" scripts/slurm_ddp.sbatch "$@") || { echo "sbatch refused job $name"; failed=1; return; }
  for _ in $(seq 1500); do  # at most 300 s, the test's own limit
    state=$(scontrol show job -o "$id" 2>/dev/null)
    [[ "$state" =~ JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) ]] && break
    sleep 0.2
  done
  [[ "$state" =~ JobState=COMPLETED ]] && [[ "$state" =~ ExitCode=0:0 ]] && rc=0
  if [ $rc = 0 ] && grep -qE "$expect" "$out"; then
    echo "slurm job $name: $(grep -E "$expect" "$out" | tail -n 1)"
  else
    echo "slurm job $name failed ($(grep -oE 'JobState=[A-Z_]+|ExitCode=[0-9:]+' <<<"$state" | tr '\n' ' ')); its output:"
    cat "$out" 2>/dev/null
    failed=1
  fi
}
job stage01 "PASS" "$bin/stage01_allreduce"
job stage05 "PASS stage 05" "$bin/stage05_bucketed" --bench --preset tiny --context 16 --warmup 0 --steps 1 \
    --caps 1 --variants bucketed
exit $failed
