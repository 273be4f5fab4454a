#!/usr/bin/env bash
# The launch contract, both ways, with the pip torch 2.x of scripts/setup/install_torch2.sh:
#   torchrun  -> our programs:  stage 01 and stage 05 (tiny, one step) under
#                               torchrun --standalone --nproc_per_node 2 print their PASS lines;
#   ddp_launch -> torch.distributed: a Python script joins its process group from ddp_launch's variables.
# Exit 77 (ctest: skipped, with the reason) when the venv is not installed.
# Our programs built against LibTorch 1.13 cannot join the store a torchrun 2.x agent hosts: there the
# test expects the refusal (exit 2, naming the remedy, within seconds) and then applies the remedy,
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, under which rank 0 hosts its own store.
#   usage: torchrun.sh VENV_PYTHON DDP_LAUNCH STAGE01 STAGE05 PEER_SCRIPT LIBTORCH_MAJOR
set -uo pipefail
py=$1 launch=$2 stage01=$3 stage05=$4 peer=$5 major=$6
torchrun="$(dirname "$py")/torchrun"
if [ ! -x "$torchrun" ]; then
  echo "SKIPPED: no pip torch 2.x at $(dirname "$py") (its torchrun is the one that works here; run: bash scripts/setup/install_torch2.sh)"
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
# --local-addr: the agent and the workers meet on 127.0.0.1, not on this machine's hostname, which need not
# resolve (a fresh root, a container without /etc/hosts: torchrun would wait there until its timeout).
tr_args=(--standalone --local-addr 127.0.0.1 --nproc_per_node 2 --no-python)
if [ "$major" -lt 2 ]; then
  t0=$(date +%s)
  timeout -k 5 60 "$torchrun" "${tr_args[@]}" "$stage01" --bench --sizes 1MB --iters 3 \
    > "$out/refusal.log" 2>&1; rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" "$out/refusal.log"; then
    echo "FAIL: LibTorch $major.x under torchrun's agent store: expected a refusal naming the remedy (exit $rc)"
    tail -20 "$out/refusal.log"; fail=1
  else
    echo "ok: LibTorch $major.x refuses torchrun 2.x's agent store in $(( $(date +%s) - t0 )) s, naming the remedy"
  fi
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
fi
run torchrun_stage01 "$torchrun" "${tr_args[@]}" "$stage01" --bench --sizes 1MB --iters 3
run torchrun_stage05 "$torchrun" "${tr_args[@]}" "$stage05" \
    --bench --preset tiny --context 16 --warmup 0 --steps 1 --caps 1
run ddp_launch_python "$launch" --nproc 2 -- "$py" "$peer"
exit $fail
