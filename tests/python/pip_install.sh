#!/usr/bin/env bash
# pip install ./python, as docs/python.md tells a user, into a throwaway directory, then the installed package
# against this build's Python (its torch) on one case of each suite:
#   pip_install.sh PYTHON WORKDIR
# pip builds the module in an isolated environment (scikit-build-core from PyPI) over this project's CMake.
set -euo pipefail
py=$1
work=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
"$py" -m pip install --quiet --no-warn-script-location --target "$work/site" "$root/python" 2> "$work/pip.log" || {
  tail -30 "$work/pip.log" >&2
  echo "pip_install: pip install ./python failed under $py (its log above)" >&2
  exit 1
}
echo "pip_install: pip install ./python under $py took $(( $(date +%s) - start )) s"
bash "$root/tests/python/run_pytest.sh" "$py" "$work/site" test_ddp.py test_sharded_optimizer.py test_fsdp.py \
  -k "ddp2026 or adamw or float32"
"$py" -c "import sys; sys.path.insert(0, '$work/site'); import ddp_from_scratch as d, torch
assert d.__file__.startswith('$work/site'), d.__file__
print('pip_install: the installed ddp_from_scratch loads into torch', torch.__version__)"
