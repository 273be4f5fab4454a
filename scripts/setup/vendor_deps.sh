#!/usr/bin/env bash
# Copies the project's small dependencies (sources and headers, no binaries) from this Debian machine into
# third_party/ (ignored by git), for a machine that has a compiler, CMake, ninja and a pip torch but no
# package manager: a GPU machine without apt (scripts/machines/gpu_check.sh builds there), a cluster login node.
# CMake uses the system's copy of each when it has one and third_party/'s otherwise (cmake/DpDependencies.cmake).
#
#   bash scripts/setup/vendor_deps.sh        # then copy the repository, third_party/ included, to that machine
#
# What it copies, about 6 MB, each with its licence (Debian's copyright file):
#   CLI11 (header-only)            /usr/include/CLI            from libcli11-dev
#   nlohmann-json (header-only)    /usr/include/nlohmann       from nlohmann-json3-dev
#   {fmt} headers (header-only)    /usr/include/fmt            from libfmt-dev (a pip torch brings its own)
#   GoogleTest sources             /usr/src/googletest         from googletest (built with the project)
#   Gloo headers                   /usr/include/gloo           from libgloo-dev (a pip torch links Gloo but
#                                                              ships no headers, which c10d's Gloo header needs)
# Nothing is downloaded; a missing package is named with the command that installs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=third_party
declare -A pkg=([/usr/include/CLI/CLI.hpp]=libcli11-dev [/usr/include/nlohmann/json.hpp]=nlohmann-json3-dev
                [/usr/include/fmt/core.h]=libfmt-dev [/usr/src/googletest/CMakeLists.txt]=googletest
                [/usr/include/gloo/config.h]=libgloo-dev)
missing=()
for f in "${!pkg[@]}"; do [ -e "$f" ] || missing+=("${pkg[$f]}"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "vendor_deps: missing ${missing[*]}: run 'apt-get install -y ${missing[*]}' (or bash scripts/setup/install_deps.sh)" >&2
  exit 2
fi
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"/{CLI11/include,nlohmann_json/include,fmt/include,gloo/include}
cp -r /usr/include/CLI "$dest.tmp/CLI11/include/"
cp -r /usr/include/nlohmann "$dest.tmp/nlohmann_json/include/"
cp -r /usr/include/fmt "$dest.tmp/fmt/include/"
cp -r /usr/src/googletest "$dest.tmp/googletest"
cp -r /usr/include/gloo "$dest.tmp/gloo/include/"
cp /usr/share/doc/libcli11-dev/copyright "$dest.tmp/CLI11/COPYRIGHT"
cp /usr/share/doc/nlohmann-json3-dev/copyright "$dest.tmp/nlohmann_json/COPYRIGHT"
cp /usr/share/doc/libfmt-dev/copyright "$dest.tmp/fmt/COPYRIGHT"
cp /usr/share/doc/googletest/copyright "$dest.tmp/googletest/COPYRIGHT"
cp /usr/share/doc/libgloo-dev/copyright "$dest.tmp/gloo/COPYRIGHT"
{
  echo "Copied by scripts/setup/vendor_deps.sh from Debian's packages on $(date -u +%F):"
  dpkg-query -W -f='  ${Package} ${Version}\n' libcli11-dev nlohmann-json3-dev libfmt-dev googletest libgloo-dev
} > "$dest.tmp/VERSIONS"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "vendor_deps: $(du -sh "$dest" | cut -f1) in $dest/ ($(tr '\n' ' ' < "$dest/VERSIONS"))"
