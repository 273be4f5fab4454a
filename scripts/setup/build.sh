#!/usr/bin/env bash
# Configures (once) and builds the project into build/ with the 'default' preset: everything, or only
# the targets named (the tour builds its nine programs, not the test suite).
#   bash scripts/setup/build.sh                                  # every target, tests included
#   bash scripts/setup/build.sh ddp_launch stage01_allreduce     # only these and what they need
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup/install_deps.sh
[ -f build/CMakeCache.txt ] || cmake --preset default
if [ $# -gt 0 ]; then
  cmake --build --preset default --target "$@"
else
  cmake --build --preset default
fi
