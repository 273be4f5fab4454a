#!/usr/bin/env bash
# The whole test suite: install what is missing, build, then run every ctest test.
# Every distributed test has its own timeout, so a hang fails instead of waiting.
#
#   bash scripts/test.sh          # Debian's LibTorch 1.13 (preset default): the README's test command
#   bash scripts/test.sh torch2   # the pinned pip torch 2.x on CPU/Gloo (preset torch2; installs it first)
#   bash scripts/test.sh cuda     # CUDA + NCCL (preset cuda): compiles and links the programs, then runs
#                                 # the tests that need no GPU (the NCCL refusals)
#   bash scripts/test.sh all      # all three, one after the other, timed: what CI runs (torch2 without
#                                 # the margin grid and the bad-input refusals; default in full, last)
# Extra arguments go to ctest (e.g. -R Stage05, -L e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
config=default
case "${1:-}" in
  default|torch2|cuda|all) config=$1; shift ;;
  -*|"") ;;
  *) echo "test.sh: unknown configuration '$1'; use default, torch2, cuda or all" >&2; exit 2 ;;
esac

run_config() {  # preset, ctest arguments...
  local preset=$1; shift
  local dir=build; [ "$preset" = default ] || dir=build-$preset
  local t0=$(date +%s)
  [ -f "$dir/CMakeCache.txt" ] || cmake --preset "$preset"
  if [ "$preset" = cuda ]; then
    # The programs and the two test programs with the NCCL refusals: the CUDA/NCCL code is theirs (every
    # test program compiles against LibTorch 2.x in the torch2 configuration).
    cmake --build --preset cuda --target ddp_launch stage01_allreduce stage02_naive_ddp stage03_flat \
      stage04_overlap stage05_bucketed stage06_sharded_opt stage07_fsdp stage08_train_lm test_dist test_cli
  else
    cmake --build --preset "$preset"
  fi
  local t1=$(date +%s)
  if [ "$preset" = cuda ]; then
    # No GPU here: the build is the proof; the tests below check the NCCL refusals of a CUDA build.
    ctest --test-dir "$dir" --output-on-failure --timeout 120 -R 'Nccl|nccl' "$@"
  else
    ctest --preset "$preset" "$@"
  fi
  local t2=$(date +%s)
  echo "test.sh: $preset: build $((t1 - t0)) s, tests $((t2 - t1)) s" | tee -a "$timings"
}

timings=$(mktemp); trap 'rm -f "$timings"' EXIT
bash scripts/install_deps.sh
case "$config" in
  # The default suite needs the pip torch 2.x too: its torchrun starts our programs in the launcher test.
  default) bash scripts/install_torch2.sh >/dev/null; run_config default "$@" ;;
  torch2|cuda) bash scripts/install_torch2.sh >/dev/null; run_config "$config" "$@" ;;
  all)
    t=$(date +%s); bash scripts/install_torch2.sh >/dev/null
    echo "test.sh: pip torch 2.x ready in $(( $(date +%s) - t )) s" | tee -a "$timings"
    run_config cuda
    # LibTorch 2.x: every test but the margin grid (its kernels are measured on 1.13 here and by
    # scripts/margins.py on either) and the bad-input refusals (CLI and launcher, the same on both): the
    # configuration's tests in a third of the time, so that CI stays well under its limit.
    run_config torch2 -LE margins -E '^bad_input_'
    run_config default "$@"   # last, so CI's closing ctest line is the README's own test command
    echo "test.sh: all configurations passed:"; cat "$timings" ;;
esac
