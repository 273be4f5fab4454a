#!/usr/bin/env bash
# Installs the pinned PyTorch 2.x from PyPI into a virtual environment inside the ignored build area
# (build-venv/torch2), never into the system Python. Its LibTorch (headers, libtorch*.so, CMake config)
# is what the 'torch2' and 'cuda' presets build against, and its torchrun starts our programs.
# The wheel is a CUDA build; its LibTorch also runs on the CPU with Gloo. pip pulls the CUDA runtime
# wheels it depends on (nvidia-*), a few GB the first time; later runs find everything and do nothing.
#
#   bash scripts/setup/install_torch2.sh          # prints the venv's python on its last line
set -euo pipefail
cd "$(dirname "$0")/../.."
version="$(tr -d ' \n' < cmake/torch2_version.txt)"   # the one place the version is pinned
venv=build-venv/torch2
py="$venv/bin/python"
have=""
[ -x "$py" ] && have="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
if [ "$have" = "$version" ]; then
  # pytest: the Python package's suite (tests/python) runs under this venv's torch too
  "$py" -c 'import pytest' 2>/dev/null || "$py" -m pip install --quiet pytest >&2
  echo "install_torch2: torch $version already in $venv" >&2
  echo "$py"; exit 0
fi
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || {
  echo "install_torch2: python3-venv is missing: run 'apt-get install python3-venv' (or bash scripts/setup/install_deps.sh)" >&2; exit 2; }
echo "install_torch2: installing torch==$version into $venv (first time: a few GB from PyPI)" >&2
start=$(date +%s)
/usr/bin/python3 -m venv "$venv"
"$py" -m pip install --quiet --upgrade pip >&2
"$py" -m pip install --quiet "torch==$version" numpy pytest >&2  # pytest: the Python package's suite
echo "install_torch2: done in $(( $(date +%s) - start )) s: $("$py" -c 'import torch; print(torch.__version__)')" >&2
echo "$py"
