#!/usr/bin/env bash
# net_tiers.sh LAUNCHER PROBE LAYOUT [TOLERANCE]
# ddp_launch --net-nodes: the two tiers cost what their rates say. One bulk TCP transfer between two ranks
# (launch_probe stream: 30 MB, timed where it arrives, its first 10% left out) under
#   --net 10gbit --net-nodes 2 --net-uplink 500mbit
# LAYOUT 2x1 (2 nodes x 1 rank): rank 1 -> rank 0 crosses both uplinks: its rate must be the uplink's,
#   500 Mbit/s within TOLERANCE (default 0.15, as net_bandwidth.sh; TCP/IP headers take ~4.4%).
# LAYOUT 2x2 (2 nodes x 2 ranks): rank 2 <-> rank 0 (other node) must run at the uplink rate as above, and
#   rank 1 -> rank 0 (same node, 10gbit links, no uplink on the way) well above it: over 2x the uplink.
# A run too SLOW is tried once more (a busy host only adds time; see net_bandwidth.sh); too fast fails at once.
# Exit 77 (ctest: skipped) with the reason when this machine cannot build the network.
set -u
launch=$1; probe=$2; layout=$3; tol=${4:-0.15}

skip() { echo "SKIP: $*"; exit 77; }
caps=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
(( (16#${caps:-0} >> 12 & 1) && (16#${caps:-0} >> 21 & 1) )) ||
  skip "--net needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to build network namespaces"
for tool in ip tc python3; do command -v $tool >/dev/null || skip "'$tool' is not on PATH"; done

uplink=500mbit; uplink_mbit=500
case $layout in
  2x1) nproc=2 ;;
  2x2) nproc=4 ;;
  *) echo "net_tiers.sh: LAYOUT must be 2x1 or 2x2, got '$layout'"; exit 2 ;;
esac

# stream FROM TO: prints the receiver's Mbit/s, or fails with the launcher's output.
stream() {
  local log
  log=$(timeout -k 5 40 "$launch" --nproc $nproc --net 10gbit --net-nodes 2 --net-uplink $uplink -- \
        "$probe" stream "$1" "$2" 30 2>&1)
  local rc=$?
  [ $rc = 0 ] || { echo "ddp_launch exited with $rc:" >&2; echo "$log" >&2; return 1; }
  echo "$log" | sed -n 's/.*STREAM_MBIT=//p'
}

# check FROM TO WHAT: exit 0 within tolerance of the uplink (or, for WHAT=above, over 2x it), 3 too slow, 1 otherwise
check() {
  local got
  got=$(stream "$1" "$2") || return 1
  python3 - "$1" "$2" "$3" "$got" "$uplink_mbit" "$tol" "$layout" <<'PY'
import sys
src, dst, what, got, up, tol, layout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
if what == "above":
    print(f"{layout}: rank {src} -> rank {dst} (same node, 10gbit links): {got:.0f} Mbit/s, must exceed 2 x the "
          f"{up:.0f} Mbit/s uplink")
    sys.exit(0 if got > 2 * up else 3)
off = (got - up) / up
print(f"{layout}: rank {src} -> rank {dst} (across the uplinks): {got:.0f} Mbit/s, expected the uplink's {up:.0f} "
      f"Mbit/s: {off:+.1%} (tolerance {tol:.0%})")
sys.exit(0 if abs(off) <= tol else 3 if off < 0 else 1)
PY
}

# once FROM TO WHAT: check, and once more if too slow
once() {
  check "$@"; local rc=$?
  if [ $rc = 3 ]; then echo "too slow: once more (a busy host only adds time)"; check "$@"; rc=$?; fi
  return $rc
}

status=0
if [ "$layout" = 2x1 ]; then
  once 1 0 uplink || status=1
  once 0 1 uplink || status=1
else
  once 2 0 uplink || status=1
  once 0 2 uplink || status=1
  once 1 0 above || status=1
fi
exit $status
