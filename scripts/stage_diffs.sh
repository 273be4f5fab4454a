#!/usr/bin/env bash
# Writes docs/diffs/NN.diff: what stage NN's program changed relative to the previous stage's (main.cpp
# plus the stage's own DDP file), so each page can show "what changed since the previous stage".
#   bash scripts/stage_diffs.sh            writes docs/diffs/
#   bash scripts/stage_diffs.sh --check    fails if docs/diffs/ is not what the sources give (ctest)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--check" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  bash "$0" "$tmp" >/dev/null
  diff -r "$tmp" docs/diffs || { echo "docs/diffs is stale: run bash scripts/stage_diffs.sh"; exit 1; }
  echo "docs/diffs is current"; exit 0
fi
out=${1:-docs/diffs}
mkdir -p "$out"
pairs=(
  "02 stages/01_allreduce/main.cpp stages/02_naive_ddp/main.cpp"
  "03 stages/02_naive_ddp/naive_ddp.cpp stages/03_flat/flat_ddp.cpp"
  "04 stages/03_flat/main.cpp stages/04_overlap/main.cpp"
  "05 stages/04_overlap/ddp_overlap.hpp stages/05_bucketed/ddp_bucketed.hpp"
  "06 stages/05_bucketed/main.cpp stages/06_sharded_opt/main.cpp"
)
for p in "${pairs[@]}"; do
  set -- $p
  # diff exits 1 when the files differ, which is the point here.
  diff -u --label "$2" --label "$3" "$2" "$3" > "$out/$1.diff" || [ $? = 1 ]
done
echo "wrote ${#pairs[@]} diffs to $out"
