#!/usr/bin/env bash
# ctest's runner of the Python package's suite (tests/python/CMakeLists.txt):
#   run_pytest.sh PYTHON PACKAGE_PARENT TEST_FILE [pytest arguments...]
# runs pytest under PYTHON (the Python of the build's torch) with the package from PACKAGE_PARENT.
set -euo pipefail
py=$1
pkg=$2
shift 2
"$py" -c "import pytest" 2>/dev/null || {
  echo "run_pytest: $py has no pytest. Debian's Python: bash scripts/setup/install_deps.sh (python3-pytest);" \
       "the pip torch's venv: bash scripts/setup/install_torch2.sh" >&2
  exit 1
}
cd "$(dirname "$0")"
PYTHONPATH="$pkg" exec "$py" -m pytest -q -p no:cacheprovider "$@"
