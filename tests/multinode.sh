#!/usr/bin/env bash
# multinode.sh LAUNCHER PROGRAM
# Two launcher invocations with --nnodes 2 (node ranks 0 and 1, master on 127.0.0.1) must train exactly
# like one launcher with 4 local ranks: the final parameter fingerprints must be identical.
set -u
launch=$1; prog=$2
one=$(timeout -k 5 120 "$launch" --nproc 4 -- "$prog" 2>&1) || { echo "single-node run failed:"; echo "$one"; exit 1; }
# A port picked as the launcher picks its own (free now, outside the kernel's ephemeral range, so no outgoing
# connection of a test running beside this one takes it first); --nnodes 2 would otherwise use 29500.
port=$("$launch" --free-ports 1) || { echo "ddp_launch --free-ports 1 failed: $port"; exit 1; }
log0=$(mktemp); log1=$(mktemp); trap 'rm -f "$log0" "$log1"' EXIT
timeout -k 5 120 "$launch" --nnodes 2 --node-rank 0 --nproc 2 --master-addr 127.0.0.1 --master-port $port -- "$prog" >"$log0" 2>&1 &
p0=$!
timeout -k 5 120 "$launch" --nnodes 2 --node-rank 1 --nproc 2 --master-addr 127.0.0.1 --master-port $port -- "$prog" >"$log1" 2>&1 &
p1=$!
wait $p0; rc0=$?; wait $p1; rc1=$?
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { echo "two-node run failed ($rc0, $rc1)"; cat "$log0" "$log1"; exit 1; }
a=$(grep -o 'PARAMS [0-9a-f]* world [0-9]*' <<<"$one")
b=$(grep -o 'PARAMS [0-9a-f]* world [0-9]*' "$log0")
echo "1 node x 4 ranks : $a"
echo "2 nodes x 2 ranks: $b"
[ -n "$a" ] && [ "$a" = "$b" ] && [ "${a##* }" = 4 ] || { echo "MISMATCH"; exit 1; }
echo "identical"
