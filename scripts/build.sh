#!/usr/bin/env bash
# Configures (once) and builds the project into build/ with the 'default' preset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
[ -f build/CMakeCache.txt ] || cmake --preset default
cmake --build --preset default
