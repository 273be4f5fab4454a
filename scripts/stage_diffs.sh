#!/usr/bin/env bash
# Writes docs/diffs/ (what each stage changed against the one before, from every file of both folders):
# scripts/stage_diffs.py does the work and says how files are paired.
#   bash scripts/stage_diffs.sh            writes docs/diffs/ and prints each diff's length
#   bash scripts/stage_diffs.sh --check    fails if docs/diffs/ is not what the sources give (ctest)
exec python3 "$(dirname "$0")/stage_diffs.py" "$@"
