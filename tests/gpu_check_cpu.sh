#!/usr/bin/env bash
# scripts/machines/gpu_check.sh on a machine without a GPU: its steps name programs this build makes, and it refuses
# (exit 2, a message saying why and what to do) before building anything.
#   tests/gpu_check_cpu.sh <source dir> <bin dir of this build>
set -uo pipefail
src=$1 bin=$2
fail() { echo "FAIL: $*"; exit 1; }
cd "$src"
list=$(bash scripts/machines/gpu_check.sh --list) || fail "--list exited $?"
n=$(grep -c . <<< "$list")
[ "$n" -ge 20 ] || fail "--list printed $n steps, expected every stage's: $list"
# Every program a step runs is one this build has (the CPU build makes the same programs).
for prog in $(grep -o 'build-gpu/bin/[a-z0-9_]*' <<< "$list" | sort -u); do
  [ -x "$bin/${prog##*/}" ] || fail "step runs ${prog##*/}, which this build does not make ($bin)"
done
for s in 01 02 03 04 05 06 07 08; do
  grep -q "stage${s}_.*--backend nccl" <<< "$list" || fail "no NCCL step for stage $s"
  grep -q "stage${s}_.*--device cuda" <<< "$list" || fail "no Gloo-on-CUDA step for stage $s"
done
for e in 05d 06a 06b; do  # the extensions with checks of their own against single-process training
  grep -q "^ext${e}_nccl_w1 .*ext${e}_.*--backend nccl" <<< "$list" || fail "no NCCL step for extension $e"
  grep -q "^ext${e}_gloo_cuda_w2 .*ext${e}_.*--device cuda" <<< "$list" || fail "no Gloo-on-CUDA step for extension $e"
done
expect() {  # expected exit | regex | env assignments...
  local code=$1 regex=$2; shift 2
  local out rc
  out=$(env "$@" GPU_CHECK_BUILD=/nonexistent-gpu-build timeout 60 bash scripts/machines/gpu_check.sh 2>&1); rc=$?
  [ "$rc" -eq "$code" ] || fail "with $*: exit $rc, expected $code: $out"
  grep -Eq "$regex" <<< "$out" || fail "with $*: message does not match /$regex/: $out"
  [ ! -e /nonexistent-gpu-build ] || fail "it started building before refusing"
  echo "ok: $* -> exit $rc: $out"
}
expect 2 "cannot import torch|CPU-only build" DP_TORCH_PYTHON=/bin/false
if [ -x build-venv/torch2/bin/python ]; then  # the pinned pip torch: a CUDA build, on a machine without a GPU
  expect 2 "no GPU is visible here .*counts 0 devices" DP_TORCH_PYTHON=build-venv/torch2/bin/python
else
  echo "note: build-venv/torch2 absent (scripts/setup/install_torch2.sh); the no-GPU refusal is checked in the cuda build"
fi
out=$(bash scripts/machines/gpu_check.sh --bogus 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "unknown argument" <<< "$out" || fail "--bogus: exit $rc: $out"
echo "PASS gpu_check.sh lists $n steps on real programs and refuses without a GPU (exit 2) before any build"
