#!/usr/bin/env bash
# Builds the CUDA configuration the way scripts/machines/gpu_check.sh does on a GPU machine without a package
# manager, but here: Debian's LibTorch, Gloo, CLI11, nlohmann-json, {fmt} and GoogleTest are hidden in a
# private mount namespace (empty folders mounted over theirs, visible to this build alone, gone when it
# ends), so the build sees only the pip torch, the compiler, CMake, ninja, the CUDA toolkit and
# third_party/ (bash scripts/setup/vendor_deps.sh). Root only (unshare -m).
#
#   bash scripts/machines/fresh_env_build.sh PYTHON [BUILD_DIR] [TARGET...]
#   bash scripts/machines/fresh_env_build.sh build-venv/t211/bin/python build-fresh stage01_allreduce test_dist
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${1:?usage: fresh_env_build.sh PYTHON [BUILD_DIR] [TARGET...]}
dir=${2:-build-fresh}
shift $(( $# >= 2 ? 2 : 1 ))
[ "$(id -u)" = 0 ] || { echo "fresh_env_build: needs root (a private mount namespace)" >&2; exit 2; }
[ -d third_party ] || { echo "fresh_env_build: no third_party/: run bash scripts/setup/vendor_deps.sh first" >&2; exit 2; }
hide=(/usr/include/{CLI,nlohmann,fmt,gtest,gmock,torch,ATen,c10,caffe2,gloo} /usr/src/googletest
      /usr/lib/x86_64-linux-gnu/cmake/{Caffe2,GTest,Torch,fmt} /usr/share/cmake/{CLI11,Gloo,nlohmann_json})
targets=${*:-"ddp_launch stage01_allreduce stage02_naive_ddp stage03_flat stage04_overlap stage05_bucketed stage06_sharded_opt stage07_fsdp stage08_train_lm ext07a_fsdp_bench test_dist test_cli"}
exec unshare -m --propagation private bash -c '
  set -euo pipefail
  for d in '"${hide[*]}"'; do [ -e "$d" ] && mount -t tmpfs -o size=1k,ro none "$d"; done
  echo "fresh_env_build: hidden: '"${hide[*]}"'"
  cmake -S . -B '"$dir"' -G Ninja -DCMAKE_BUILD_TYPE=Release -DDP_TORCH_PIP=ON -DDP_CUDA=ON \
        -DDP_TORCH_PYTHON='"$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"' -DDP_BUILD_DOCS=OFF -DTORCH_CUDA_ARCH_LIST=9.0 | grep -E "^-- +[A-Z]|From|Error" || true
  cmake --build '"$dir"' -j "$(nproc)" --target '"$targets"'
'
