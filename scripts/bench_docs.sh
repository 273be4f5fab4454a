#!/usr/bin/env bash
# Regenerates every benchmark result behind docs/ on this machine, then the plots and the tables.
# Each result file records the exact command and the machine. Roughly 30-40 minutes on 2 cores.
#   bash scripts/bench_docs.sh [PRESET]      (default: small, the CPU benchmark preset)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-small}
R=docs/results
mkdir -p $R
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
L="./build/bin/ddp_launch --nproc 2 --"
B=./build/bin
T="--bench --preset $preset --warmup 1 --steps 3"

echo "== stage 01: the all-reduce grid"
bash scripts/bench_allreduce.sh

echo "== stage 01: this project's all-reduce against PyTorch's, 100MB over 2 ranks, back to back"
rm -f $R/torch_compare.json
$L $B/stage01_allreduce --bench --sizes 100MB --iters 20 --json $R/torch_compare.json
if $PY -c 'import torch' 2>/dev/null; then
  $PY scripts/torch_allreduce.py --size 100MB --world 2 --iters 20 --json $R/torch_compare.json
else
  echo "(python3-torch is not installed: apt-get install python3-torch for the PyTorch comparison)"
fi

echo "== stages 02-05 on the $preset Transformer"
$L $B/stage03_flat $T --json $R/stage03.json
$L $B/stage04_overlap $T --json $R/stage04.json
$L $B/stage05_bucketed $T --caps 1,10,100,1000 --json $R/stage05.json
echo "== stage 06: memory and speed with and without sharding"
$L $B/stage06_sharded_opt $T --json $R/stage06.json

$PY scripts/plot.py $R/allreduce.json $R/stage03.json $R/stage04.json $R/stage05.json $R/stage06.json
$PY scripts/make_tables.py
