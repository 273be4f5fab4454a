#!/usr/bin/env bash
# net_bandwidth.sh LAUNCHER STAGE01 NPROC RATE EXPECTED_GBPS [TOLERANCE [LAUNCHER OPTIONS...]]
# Runs stage01's all-reduce benchmark (10 MB) on NPROC ranks under `ddp_launch --net RATE` (and the launcher
# options after TOLERANCE, e.g. --net-nodes 2 --net-uplink 500mbit, whose ring crosses each uplink once per
# direction, so that its bus bandwidth is the uplink's rate) and checks
# the bus bandwidth of its fastest round against the closed form RATE/8 (EXPECTED_GBPS, GB = 10^9 B) within
# TOLERANCE (default 0.15). A ring all-reduce moves 2(n-1)/n of the buffer over every link in each
# direction, so its bus bandwidth is the link rate whatever n is. What it cannot reach: Ethernet, IP
# and TCP headers take ~4.4% of each 1514-byte frame, and ACKs share the links.
# Exit 77 (ctest: skipped) with the reason when this machine cannot build the network.
set -u
launch=$1; prog=$2; nproc=$3; rate=$4; want=$5; tol=${6:-0.15}
shift $(( $# < 6 ? $# : 6 )); extra=("$@")

skip() { echo "SKIP: $*"; exit 77; }
caps=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
(( (16#${caps:-0} >> 12 & 1) && (16#${caps:-0} >> 21 & 1) )) ||
  skip "--net needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to build network namespaces"
for tool in ip tc python3; do command -v $tool >/dev/null || skip "'$tool' is not on PATH"; done

dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# 10 MB per all-reduce: 80 ms a round at 1 Gbit/s, long enough that the token bucket's burst and
# the per-call latency hardly count; 3 warm-up and 20 timed rounds keep the test under ~10 s. The check
# takes the fastest round: what the link allows. Anything else only adds time to a round (4 ranks share
# 2 cores; the VM's host is busy at times): in a clean-clone CI run the median round of 4 ranks came out
# 36% slow, its fastest round 5% slow, the same as on an idle machine; but once, late in a full suite, every
# round of 4 ranks was slow (fastest 150 ms, -20%; the same test alone right after: 126 ms, -4.5%). So a
# run whose fastest round is too SLOW is tried once more and the better attempt counts: a busy host cannot
# make a round faster, so a link shaped too fast still fails at once, and one shaped too slow fails twice.
attempt() {  # prints the verdict; exit 0 within tolerance, 3 too slow, 1 otherwise
  timeout -k 5 150 "$launch" --nproc "$nproc" --net "$rate" "${extra[@]}" -- \
    "$prog" --bench --sizes 10MB --warmup 3 --iters 20 --json "$dir/out.json" >"$dir/log" 2>&1
  local rc=$?
  [ $rc = 0 ] || { echo "ddp_launch exited with $rc:"; cat "$dir/log"; return 1; }
  python3 - "$dir/out.json" "$nproc" "$rate${extra[*]:+ ${extra[*]}}" "$want" "$tol" <<'PY'
import json, sys
path, nproc, rate, want, tol = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
row = json.load(open(path))["rows"][0]
got = row["busbw_GBps"] * row["latency_median_s"] / row["latency_min_s"]  # the fastest round's
off = (got - want) / want
fast, ms, iters = row["latency_min_s"] * 1e3, row["latency_median_s"] * 1e3, row["iters"]
print(f"{nproc} ranks at {rate}: bus bandwidth {got:.4f} GB/s in the fastest round, expected {want:.4f} GB/s: "
      f"{off:+.1%} (tolerance {tol:.0%}; fastest {fast:.1f} ms, median {ms:.1f} ms of {iters} rounds)")
sys.exit(0 if abs(off) <= tol else 3 if off < 0 else 1)
PY
}
attempt; rc=$?
if [ $rc = 3 ]; then echo "too slow: once more (a busy host only adds time)"; attempt; rc=$?; fi
exit $(( rc == 0 ? 0 : 1 ))
