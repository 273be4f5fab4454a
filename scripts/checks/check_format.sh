#!/usr/bin/env bash
# The tree's C++ is formatted by its .clang-format (Debian 12's clang-format 14), not squeezed by hand.
#
#   bash scripts/checks/check_format.sh              exit 1 naming each file clang-format would change (ctest format)
#   bash scripts/checks/check_format.sh --fix        format them in place
#   bash scripts/checks/check_format.sh --self-test  the check fails on a squeezed file and passes a formatted one
#
# Another clang-format major version formats some lines differently: the check wants 14 and says so.
set -euo pipefail
cd "$(dirname "$0")/../.."
cf=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$cf" ]; then
  echo "check_format: no clang-format: apt-get install clang-format (bash scripts/setup/install_deps.sh installs it)" >&2
  exit 2
fi
major=$("$cf" --version | sed -E 's/.*version ([0-9]+).*/\1/')
if [ "$major" != 14 ]; then
  echo "check_format: $cf is version $major; the tree is formatted by 14 (Debian 12's clang-format)" >&2
  exit 2
fi

# Files that clang-format would change, one per line; $1: the folder holding .clang-format and the files.
unformatted() {
  local dir=$1; shift
  local f
  for f in "$@"; do
    "$cf" --style=file --dry-run -Werror "$dir/$f" >/dev/null 2>&1 || echo "$f"
  done
}

case "${1:-}" in
  --self-test)
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    cp .clang-format "$tmp/"
    printf 'int f(int a) {\n  int b = a + 1;\n  return b;\n}\n' >"$tmp/plain.cpp"
    printf 'int f(int a) { int b = a+1; return b; }\n' >"$tmp/squeezed.cpp"
    printf 'int g(int a) {\n  return a;  // a line past the limit of one hundred and twenty columns, which clang-format breaks somewhere before it ends\n}\n' >"$tmp/long.cpp"
    got=$(unformatted "$tmp" plain.cpp squeezed.cpp long.cpp | tr '\n' ' ')
    if [ "$got" != "squeezed.cpp long.cpp " ]; then
      echo "check_format --self-test: FAIL: wanted 'squeezed.cpp long.cpp' flagged, got '$got'"
      exit 1
    fi
    echo "check_format --self-test: PASS: a squeezed function and a line past 120 columns flagged, a formatted file passed"
    exit 0 ;;
  --fix)
    git ls-files '*.cpp' '*.hpp' '*.cu' | xargs "$cf" -i --style=file
    echo "check_format: formatted $(git ls-files '*.cpp' '*.hpp' '*.cu' | wc -l) files"
    exit 0 ;;
  "") ;;
  *) echo "check_format: unknown argument '$1'; use --fix or --self-test" >&2; exit 2 ;;
esac

mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu')
mapfile -t bad < <(unformatted . "${files[@]}")
if [ ${#bad[@]} -gt 0 ]; then
  for f in "${bad[@]}"; do echo "$f: not formatted as .clang-format says: clang-format -i $f"; done
  echo "check_format: FAIL: ${#bad[@]} of ${#files[@]} files (all at once: bash scripts/checks/check_format.sh --fix)"
  exit 1
fi
echo "check_format: PASS: ${#files[@]} C++ files formatted as .clang-format says (clang-format $major)"
