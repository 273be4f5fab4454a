#!/usr/bin/env bash
# The tour: every stage in order through the launcher (CPU, Gloo, 2 ranks; stage 10: 4, as 2 nodes x 2), each
# checking itself and printing its key numbers, then one summary table. A few minutes on a 2-core machine.
#   bash scripts/tour.sh            # the tour (sizes that finish quickly)
#   bash scripts/tour.sh --full     # also re-run every benchmark behind docs/ and regenerate tables and plots
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
for a in "$@"; do
  case $a in
    --full) full=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "tour.sh: unknown option '$a'; use --full or nothing" >&2; exit 2 ;;
  esac
done
# The tour builds only what it runs (the test suite is scripts/test.sh's business); --full builds everything,
# since the benchmarks behind docs/ use more programs.
if [ $full = 1 ]; then
  bash scripts/setup/build.sh
else
  bash scripts/setup/build.sh ddp_launch stage01_allreduce stage02_naive_ddp stage03_flat stage04_overlap \
    stage05_bucketed stage06_sharded_opt stage07_fsdp stage08_train_lm stage09_elastic stage10_hierarchy
fi
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
# The ranks talk over a simulated cluster network (every rank in its own network namespace behind a
# 10 Gbit/s link, ddp_launch --net) when this machine allows it, so that communication costs wall time
# as on a cluster; otherwise over loopback, where it is CPU work competing with backward. 10 Gbit/s, not 1:
# the tiny Transformer's 37 MB of gradients take about 0.31 s to all-reduce at 1 Gbit/s (stage 03's page),
# longer than one process's whole step, so there no way of sending them can beat one process; at 10 Gbit/s
# they take about a tenth of that, and overlap and buckets show the speed-up they win. TOUR_NET=1gbit shows
# the other side (docs/05_measured.md has both links).
NET=${TOUR_NET:-10gbit}
# Each rank on cores of its own, as each owns a GPU on a cluster (ddp_launch --cpus-per-rank), where the machine
# has a core per rank: the single process the speed-ups are read against then runs on as many cores as one
# rank, so N ranks have N times its compute and the ceiling is N. TOUR_PIN=0 shares the cores instead.
NP=${NPROC:-2}
PIN=""
cores=$(nproc)
if [ "${TOUR_PIN:-1}" = 1 ] && [ "$cores" -ge "$NP" ]; then PIN="--cpus-per-rank $((cores / NP))"; fi
if [ "$NET" != none ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v tc >/dev/null; then
  L="./build/bin/ddp_launch --nproc $NP $PIN --net $NET --"
  # Stage 10: 4 ranks as 2 simulated nodes of 2, each node's link $NET, the nodes joined by 1 Gbit/s uplinks
  # (more ranks than cores here, so not pinned).
  L10="./build/bin/ddp_launch --nproc 4 --net $NET --net-nodes 2 --net-uplink 1gbit --"
  LE="./build/bin/ddp_launch --elastic --nproc $NP $PIN --max-restarts 3 --net $NET --"
  link="a simulated $NET link per rank"
else
  L="./build/bin/ddp_launch --nproc $NP $PIN --"
  LE="./build/bin/ddp_launch --elastic --nproc $NP $PIN --max-restarts 3 --"
  L10="./build/bin/ddp_launch --nproc 4 --"
  link="loopback"
  [ "$NET" = none ] || echo "tour: running over loopback: the simulated network (ddp_launch --net) needs root and iproute2 (ip, tc)"
fi
B=./build/bin
out=build/tour
mkdir -p "$out"
rm -f "$out"/*.json

step() { echo; echo "==== [$1/10] $2"; }
step 1 "stage 01: all-reduce (demo checked against the closed form, then a short benchmark)"
$L $B/stage01_allreduce --bench --sizes 1MB,10MB,32MB --iters 5 --json $out/stage01.json
T="--bench --preset tiny --context 128 --warmup 1 --steps 3"
step 2 "stage 02: naive DDP (checked against single-process training, then the tiny Transformer)"
$L $B/stage02_naive_ddp $T --json $out/stage02.json
step 3 "stage 03: one flattened all-reduce"
$L $B/stage03_flat $T --json $out/stage03.json
step 4 "stage 04: all-reduce from gradient hooks, overlapped with backward"
$L $B/stage04_overlap $T --json $out/stage04.json
step 5 "stage 05: gradient buckets"
$L $B/stage05_bucketed $T --caps 1,10,100 --json $out/stage05.json
step 6 "stage 06: ZeRO-1 optimizer-state sharding (beside stage 05's DDP)"
$L $B/stage06_sharded_opt $T --json $out/stage06.json
step 7 "stage 07: FSDP, parameters, gradients and optimizer state sharded (both resharding modes)"
$L $B/stage07_fsdp $T --json $out/stage07.json
step 8 "stage 08: the capstone, a byte-level language model trained on real text (Debian's fortunes)"
$L $B/stage08_train_lm --steps 100 --curve $out/stage08.json
step 9 "stage 09: elastic, a rank killed (SIGKILL) as steps 6, 11 and 16 begin; the others go on, replacements join"
DP_FAULT=die@*:step5,die@*:step10,die@*:step15 $LE $B/stage09_elastic --steps 20 --warmup 5 --curve $out/stage09.json
step 10 "stage 10: a cluster of 2 nodes x 2 ranks: hierarchical all-reduce, HSDP, clipping (4 ranks share the cores)"
$L10 $B/stage10_hierarchy --nodes 2 $T --json $out/stage10.json

echo
echo "==== summary (tiny Transformer, ${NPROC:-2} ranks (stage 10: 4, as 2 nodes x 2), $link, this machine)"
$PY scripts/course/tour_summary.py $out

if [ $full = 1 ]; then
  echo; echo "==== --full: regenerating every benchmark behind docs/ (about 50 minutes)"
  bash scripts/bench/bench_docs.sh
fi
