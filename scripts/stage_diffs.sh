#!/usr/bin/env bash
# Writes docs/diffs/NN.diff: what stage NN's program changed relative to the previous stage's (main.cpp
# plus the stage's own DDP file), so each page can show "what changed since the previous stage".
# Stage 06 is a new idea rather than an edit of stage 05's code: docs/diffs/06.txt lists its files.
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
)
for p in "${pairs[@]}"; do
  set -- $p
  # diff exits 1 when the files differ, which is the point here.
  diff -u --label "$2" --label "$3" "$2" "$3" > "$out/$1.diff" || [ $? = 1 ]
done
# Stage 06: each file with its line count and its first comment line, which says what it holds.
files06=(stages/06_sharded_opt/main.cpp stages/06_sharded_opt/sharded_optimizer.hpp
         stages/06_sharded_opt/sharded_optimizer.cpp stages/06_sharded_opt/checkpoint.hpp
         stages/06_sharded_opt/checkpoint.cpp stages/06_sharded_opt/CMakeLists.txt
         common/memory.hpp common/memory.cpp common/optim_state.hpp common/optim_state.cpp
         common/checkpoint_file.hpp common/checkpoint_file.cpp)
{
  echo "lines  file                                        what it holds"
  for f in "${files06[@]}"; do
    printf '%5d  %-43s %s\n' "$(wc -l < "$f")" "$f" "$(head -n 1 "$f" | sed -E 's@^(//|#) ?@@')"
  done
} > "$out/06.txt"
echo "wrote ${#pairs[@]} diffs and the stage 06 file list to $out"
