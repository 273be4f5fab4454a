#!/usr/bin/env bash
# fork_cases_can_fail.sh PROGRAM FORK_CASES_LIBRARY
# The bad-input runner (tests/support/fork_cases.hpp) catches its mutants: a case file with one good case and four
# bad ones (a wrong exit code, an output that does not match, a case that outlives its timeout, one that leaves
# a process running: DP_FAULT=orphan@0) must give one `ok`, four `FAIL` lines naming each case and its reason,
# the count, and exit code 1, in seconds; a case file whose regex does not compile is refused with exit 2.
set -u
prog=$1
export LD_PRELOAD=$2  # the fork server (tests/support/fork_cases.hpp): preloaded, never linked into a program
export OPENBLAS_NUM_THREADS=1  # one thread at start-up: the fork path (with more, each case executes the program)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
cat >"$dir/mutants.cases" <<'CASES'
case good
codes 0
regex Options
arg --help
end
case wrong_code
codes 3
regex Options
arg --help
end
case wrong_output
codes 2
regex no such words
arg --no-such-option
end
case outlives_its_timeout
codes 2
timeout 2
regex rendezvous
env RANK=1
env WORLD_SIZE=2
env MASTER_ADDR=127.0.0.1
env MASTER_PORT=9
arg --timeout
arg 60s
end
case leaves_a_process
codes 0
regex PASS
env DP_FAULT=orphan@0
end
CASES
out=$(DP_FORK_CASES="$dir/mutants.cases" timeout 60 "$prog" 2>&1); rc=$?
fail=0
for want in "^ok   good " "^FAIL wrong_code: expected exit code 3, got 0" \
            "^FAIL wrong_output: output does not match /no such words/" \
            "^FAIL outlives_its_timeout: timed out after 2 s" \
            "^FAIL leaves_a_process: 1 process\(es\) left running after it returned" "1 of 5 bad-input cases passed$"; do
  grep -qE -- "$want" <<<"$out" || { echo "missing /$want/ in the runner's output"; fail=1; }
done
[ "$rc" = 1 ] || { echo "expected exit code 1, got $rc"; fail=1; }
[ $fail = 0 ] || { echo "$out" | tail -40; exit 1; }
# A case file whose regex does not compile is refused (exit 2, naming it), not read as "no match".
printf 'case bad_regex\ncodes 0\nregex (unclosed\narg --help\nend\n' >"$dir/bad_regex.cases"
out=$(DP_FORK_CASES="$dir/bad_regex.cases" timeout 60 "$prog" 2>&1); rc=$?
if [ "$rc" != 2 ] || ! grep -qF "/(unclosed/ is not a POSIX extended regular expression" <<<"$out"; then
  echo "a regex that does not compile: expected exit 2 and its refusal, got $rc:"; echo "$out" | tail -10; exit 1
fi
echo "fork_cases_can_fail: PASS: 4 mutants caught by name, exit 1; a broken regex refused, exit 2"
