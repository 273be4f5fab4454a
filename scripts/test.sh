#!/usr/bin/env bash
# The whole test suite: install what is missing, build, then run every ctest test.
# Every distributed test has its own timeout, so a hang fails instead of waiting.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --preset default "$@"
