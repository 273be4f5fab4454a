#!/usr/bin/env bash
# The presets name clang++. Where it is missing, configuring must stop before project() with a message that
# names both remedies (install_deps.sh, or -DCMAKE_CXX_COMPILER=g++), not CMake's own "not found" error.
# Run with a PATH that holds cmake and nothing else: no compiler, no ninja.
# Usage: configure_without_clang.sh SOURCE_DIR CMAKE
set -u
src=$1 cmake=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin" && ln -s "$cmake" "$tmp/bin/cmake"
out=$(env PATH="$tmp/bin" "$cmake" -S "$src" -B "$tmp/build" -DCMAKE_CXX_COMPILER=clang++ 2>&1)
rc=$?
echo "$out"
if [ $rc -eq 0 ]; then echo "FAIL: configured without clang++ in PATH"; exit 1; fi
for want in "clang++, which is not installed" "scripts/setup/install_deps.sh" "-DCMAKE_CXX_COMPILER=g++"; do
  if ! grep -qF -- "$want" <<<"$(tr '\n' ' ' <<<"$out" | tr -s ' ')"; then
    echo "FAIL: the error does not say '$want'"; exit 1
  fi
done
echo "PASS: without clang++ the configure stops (exit $rc) naming install_deps.sh and -DCMAKE_CXX_COMPILER=g++"
