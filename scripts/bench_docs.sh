#!/usr/bin/env bash
# Regenerates the benchmark results behind docs/ on this machine, then the plots and the tables.
# Each result file records the exact command and the machine. About 30 minutes on 2 cores.
#   bash scripts/bench_docs.sh [PRESET] [PART...]     PRESET: small (default); PART: allreduce torch ddp zero
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-small}
shift || true
parts=${*:-allreduce torch ddp zero}
R=docs/results
mkdir -p $R
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
L="./build/bin/ddp_launch --nproc 2 --"
B=./build/bin
T="--bench --preset $preset --context 128 --warmup 1 --steps 4"

for part in $parts; do
  case $part in
  allreduce)
    echo "== stage 01: the all-reduce grid"
    bash scripts/bench_allreduce.sh ;;
  torch)
    echo "== stage 01: this project's all-reduce against PyTorch's, 100MB over 2 ranks, alternating 3 times"
    if ! $PY -c 'import torch' 2>/dev/null; then
      echo "(skipped: the comparison needs Debian's python3-torch: apt-get install python3-torch)"; continue
    fi
    for i in 1 2 3; do
      $L $B/stage01_allreduce --bench --sizes 100MB --iters 20 --json $R/torch_compare_$i.json
      $PY scripts/torch_allreduce.py --size 100MB --world 2 --iters 20 --json $R/torch_compare_$i.json
    done
    $PY scripts/merge_results.py $R/torch_compare.json $R/torch_compare_{1,2,3}.json
    rm -f $R/torch_compare_?.json ;;
  ddp)
    echo "== stages 02-05 on the $preset Transformer (variants take turns step by step)"
    $L $B/stage03_flat $T --json $R/stage03.json
    $L $B/stage04_overlap $T --json $R/stage04.json
    $L $B/stage05_bucketed $T --caps 1,10,100,1000 --json $R/stage05.json
    # The same comparison on the tiny preset, where a step takes well under a second: many more
    # timed steps, so differences of a few percent rise above the step-to-step noise.
    $L $B/stage05_bucketed --bench --preset tiny --context 128 --warmup 3 --steps 20 --caps 1,10,100,1000 \
        --json $R/stage05_tiny.json ;;
  zero)
    echo "== stage 06: memory and speed with and without sharding"
    $L $B/stage06_sharded_opt $T --json $R/stage06.json ;;
  *) echo "bench_docs.sh: unknown part '$part' (allreduce, torch, ddp, zero)" >&2; exit 2 ;;
  esac
done

for f in allreduce stage03 stage04 stage05 stage05_tiny stage06; do
  [ -f $R/$f.json ] && $PY scripts/plot.py $R/$f.json
done
$PY scripts/make_tables.py
