#!/usr/bin/env bash
# The launch contract, both ways, with the pip torch 2.x of scripts/install_torch2.sh:
#   torchrun  -> our programs:  stage 01 and stage 05 (tiny, one step) under
#                               torchrun --standalone --nproc_per_node 2 print their PASS lines;
#   ddp_launch -> torch.distributed: a Python script joins its process group from ddp_launch's variables.
# Exit 77 (ctest: skipped, with the reason) when the venv is not installed.
#   usage: torchrun.sh VENV_PYTHON DDP_LAUNCH STAGE01 STAGE05 PEER_SCRIPT
set -uo pipefail
py=$1 launch=$2 stage01=$3 stage05=$4 peer=$5
torchrun="$(dirname "$py")/torchrun"
if [ ! -x "$torchrun" ]; then
  echo "SKIPPED: no pip torch 2.x at $(dirname "$py") (its torchrun is the one that works here; run: bash scripts/install_torch2.sh)"
  exit 77
fi
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fail=0
run() {  # name, command...: run with a deadline, keep the output, expect a PASS line
  local name=$1; shift
  timeout -k 5 100 "$@" > "$out/$name.log" 2>&1; local rc=$?
  if [ $rc -ne 0 ] || ! grep -q "PASS" "$out/$name.log"; then
    echo "FAIL: $name (exit $rc): $*"; tail -20 "$out/$name.log"; fail=1
  else
    echo "ok: $name: $(grep PASS "$out/$name.log" | tail -1)"
  fi
}
export OMP_NUM_THREADS=1
run torchrun_stage01 "$torchrun" --standalone --nproc_per_node 2 --no-python "$stage01" --sizes 1MB --iters 3
run torchrun_stage05 "$torchrun" --standalone --nproc_per_node 2 --no-python "$stage05" \
    --bench --preset tiny --context 16 --warmup 0 --steps 1 --caps 1
run ddp_launch_python "$launch" --nproc 2 -- "$py" "$peer"
exit $fail
