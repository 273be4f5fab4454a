#!/usr/bin/env bash
# Writes docs/diffs/NN.diff: what stage NN changed relative to the previous stage, file by file of the same
# role, so each page can show "what changed since the previous stage": the gradient synchronization
# against the previous stage's (naive -> flat -> overlap -> bucketed, .cpp against .cpp), main.cpp against
# main.cpp, and a file new in this stage against /dev/null. Stage 06 is a new idea rather than an edit of
# stage 05's code: docs/diffs/06.txt lists its files instead.
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
# NN, then pairs of files: old new [old new ...]
pairs=(
  "02 stages/01_allreduce/main.cpp stages/02_naive_ddp/main.cpp"
  "03 stages/02_naive_ddp/naive_ddp.cpp stages/03_flat/flat_ddp.cpp
      stages/02_naive_ddp/main.cpp stages/03_flat/main.cpp"
  "04 stages/03_flat/flat_ddp.cpp stages/04_overlap/overlap_ddp.cpp
      /dev/null stages/04_overlap/accumulate_grad_hooks.cpp
      stages/03_flat/main.cpp stages/04_overlap/main.cpp"
  "05 stages/04_overlap/overlap_ddp.cpp stages/05_bucketed/bucketed_ddp.cpp
      /dev/null stages/05_bucketed/buckets.cpp
      /dev/null stages/05_bucketed/comm_hooks.cpp
      /dev/null stages/05_bucketed/bucket_rebuild.cpp
      stages/04_overlap/main.cpp stages/05_bucketed/main.cpp"
)
for p in "${pairs[@]}"; do
  set -- $p
  n=$1; shift
  : > "$out/$n.diff"
  while [ $# -ge 2 ]; do
    # diff exits 1 when the files differ, which is the point here.
    diff -u --label "$1" --label "$2" "$1" "$2" >> "$out/$n.diff" || [ $? = 1 ]
    shift 2
  done
done
# Stage 06: each file with its line count and its first comment line, which says what it holds.
files06=(stages/06_sharded_opt/main.cpp stages/06_sharded_opt/benchmark.hpp stages/06_sharded_opt/benchmark.cpp
         stages/06_sharded_opt/sharded_optimizer.hpp stages/06_sharded_opt/sharded_optimizer.cpp
         stages/06_sharded_opt/zero1_optimizer.hpp stages/06_sharded_opt/zero1_optimizer.cpp
         stages/06_sharded_opt/checkpoint.hpp stages/06_sharded_opt/checkpoint.cpp stages/06_sharded_opt/CMakeLists.txt
         common/shard_comm.hpp common/shard_comm.cpp
         common/memory.hpp common/memory.cpp common/optim_state.hpp common/optim_state.cpp
         common/checkpoint_file.hpp common/checkpoint_file.cpp)
{
  echo "lines  file                                        what it holds"
  for f in "${files06[@]}"; do
    printf '%5d  %-43s %s\n' "$(wc -l < "$f")" "$f" "$(head -n 1 "$f" | sed -E 's@^(//|#) ?@@')"
  done
} > "$out/06.txt"
# Stage 07, FSDP, is again a new idea: its files, and what it added to common/.
files07=(stages/07_fsdp/main.cpp stages/07_fsdp/benchmark.hpp stages/07_fsdp/benchmark.cpp
         stages/07_fsdp/fsdp.hpp stages/07_fsdp/fsdp.cpp stages/07_fsdp/fsdp_check.hpp stages/07_fsdp/fsdp_check.cpp
         stages/07_fsdp/CMakeLists.txt common/transformer.hpp common/shard_comm.hpp common/memory.hpp)
{
  echo "lines  file                                        what it holds"
  for f in "${files07[@]}"; do
    printf '%5d  %-43s %s\n' "$(wc -l < "$f")" "$f" "$(head -n 1 "$f" | sed -E 's@^(//|#) ?@@')"
  done
} > "$out/07.txt"
# Stage 08, the capstone, puts the earlier stages' classes to work: its files.
files08=(stages/08_train_lm/main.cpp stages/08_train_lm/corpus.hpp stages/08_train_lm/corpus.cpp
         stages/08_train_lm/trainer.hpp stages/08_train_lm/trainer.cpp stages/08_train_lm/train_loop.hpp
         stages/08_train_lm/train_loop.cpp stages/08_train_lm/lm_checkpoint.hpp stages/08_train_lm/lm_checkpoint.cpp
         stages/08_train_lm/lm_check.hpp stages/08_train_lm/lm_check.cpp stages/08_train_lm/CMakeLists.txt)
{
  echo "lines  file                                        what it holds"
  for f in "${files08[@]}"; do
    printf '%5d  %-43s %s\n' "$(wc -l < "$f")" "$f" "$(head -n 1 "$f" | sed -E 's@^(//|#) ?@@')"
  done
} > "$out/08.txt"
echo "wrote ${#pairs[@]} diffs and the stage 06, 07 and 08 file lists to $out"
