#!/usr/bin/env bash
# expect_exit.sh CODE REGEX -- COMMAND...     (CODE may list alternatives: "1|137")
# Runs COMMAND in a session of its own (bounded by 90 s) and passes when it exits with CODE, its output
# matches REGEX, and no process of that session is left running afterwards.
set -u
want=$1; pattern=$2; shift 2; [ "$1" = "--" ] && shift
log=$(mktemp); trap 'rm -f "$log"' EXIT
setsid timeout -k 5 90 "$@" >"$log" 2>&1 &
sid=$!
wait $sid; rc=$?
out=$(cat "$log")
if ! [[ "$rc" =~ ^($want)$ ]]; then
  echo "expected exit code $want, got $rc from: $*"; echo "$out" | tail -30; exit 1
fi
if ! grep -qE -- "$pattern" <<<"$out"; then
  echo "output does not match /$pattern/ for: $*"; echo "$out" | tail -30; exit 1
fi
for _ in 1 2 3 4 5 6 7 8 9 10; do pgrep -s "$sid" >/dev/null || break; sleep 0.3; done
if pgrep -s "$sid" >/dev/null; then
  echo "processes left running after the command returned:"; ps -o pid,args -s "$sid"; pkill -9 -s "$sid"; exit 1
fi
echo "ok: exit $rc, output matches /$pattern/, nothing left running"
