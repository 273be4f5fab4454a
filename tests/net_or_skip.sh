#!/usr/bin/env bash
# net_or_skip.sh COMMAND...
# Runs COMMAND (which uses `ddp_launch --net`) and exits with its code, or exits 77 (ctest: skipped,
# see SKIP_RETURN_CODE) with the reason when this machine cannot build the emulated network: --net
# needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN (network namespaces, veth pairs, tc qdiscs) and
# iproute2's `ip` and `tc`.
set -u
skip() { echo "SKIP: $*"; exit 77; }
[ $# -gt 0 ] || { echo "usage: net_or_skip.sh COMMAND..."; exit 2; }
[ "$(id -u)" = 0 ] || skip "--net needs root (id -u is $(id -u)) to build network namespaces"
caps=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
(( (16#${caps:-0} >> 12 & 1) && (16#${caps:-0} >> 21 & 1) )) ||
  skip "--net needs CAP_NET_ADMIN and CAP_SYS_ADMIN, which this root lacks (a restricted container?)"
for tool in ip tc; do command -v $tool >/dev/null || skip "'$tool' (iproute2) is not on PATH"; done
exec "$@"
