#!/usr/bin/env bash
# Installs the Debian 12 packages this project needs, and only those that are missing.
# Needs root (or sudo) only when something is missing.
set -euo pipefail
packages=(
  g++ cmake ninja-build            # GCC (the asan preset's compiler, nvcc's host compiler) and the build tools
  clang                            # the presets' compiler: clean builds about a third shorter than with g++ (docs/building.md)
  clang-format                     # the format the tree follows (.clang-format; ctest format_clang checks it)
  lld                              # LLVM's linker: links LibTorch programs several times faster than GNU ld
  libtorch-dev libgloo-dev         # LibTorch 1.13 (CPU) with c10d and Gloo
  libopenblas0-pthread             # a fast BLAS: without it LibTorch runs matmuls ~100x slower
  libgtest-dev                     # GoogleTest
  libcli11-dev nlohmann-json3-dev libfmt-dev   # options, JSON, formatting
  doxygen                          # the documentation site
  python3 python3-matplotlib python3-scipy   # plots, timelines and confidence intervals for the docs
  python3-venv                     # scripts/setup/install_torch2.sh: the pip torch 2.x lives in a venv
  python3-torch                    # PyTorch 1.13's own DDP and all_reduce, the peers of stages 01 and 05
  python3-pip python3-dev pybind11-dev python3-pytest   # pip install ./python (docs/python.md) and its pytest suite
  iproute2                         # ip and tc: ddp_launch --net builds a simulated network from them
  procps                           # pgrep, used by the tests to look for left-over processes
  fortunes                         # 2.4 MB of English quotations: the text stage 08 learns from
  slurmd slurmctld slurm-client munge   # tests/slurm.sh: a private single-node Slurm runs the sbatch script
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: run as root (or install sudo) to install: ${missing[*]}" >&2; exit 2; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
