#!/usr/bin/env bash
# The workbook (docs/workbook.md): write each stage's core yourself; the stage's own tests check it.
#   bash scripts/workbook.sh init        # workbook/stages/: the stages with every exercise stubbed
#   bash scripts/workbook.sh status      # which exercises are written
#   bash scripts/workbook.sh diff 02     # your code against the reference
#   bash scripts/workbook.sh reset 02    # stage 02's stubs again;  solve 02: its reference code
# Then: cmake --preset workbook && cmake --build --preset workbook && ctest --preset workbook -L stage02
set -euo pipefail
exec python3 "$(dirname "$0")/workbook.py" "$@"
