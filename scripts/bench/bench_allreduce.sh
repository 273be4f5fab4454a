#!/usr/bin/env bash
# The stage 01 grid: float32 all-reduce of 1MB, 10MB, 100MB and 1GB over 2, 4 and 6 processes (Gloo,
# CPU), each size bounded by --budget; one JSON, one Markdown table and one plot in docs/results/.
#   bash scripts/bench/bench_allreduce.sh [SIZES] [PROCS]     e.g.  bash scripts/bench/bench_allreduce.sh 1MB,10MB "2 4"
set -euo pipefail
cd "$(dirname "$0")/../.."
sizes=${1:-1MB,10MB,100MB,1GB}
procs=${2:-2 4 6}
out=docs/results
mkdir -p "$out"
parts=()
for n in $procs; do
  ./build/bin/ddp_launch --nproc "$n" -- ./build/bin/stage01_allreduce --bench --sizes "$sizes" \
      --warmup 5 --iters 20 --budget 20s --json "$out/allreduce_$n.json"
  parts+=("$out/allreduce_$n.json")
done
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
$PY scripts/pages/merge_results.py "$out/allreduce.json" "${parts[@]}"
rm -f "${parts[@]}"
$PY scripts/pages/plot.py "$out/allreduce.json"
