#!/usr/bin/env bash
# Regenerates the benchmark results behind docs/ on this machine, then the plots, timelines and tables.
# Every result file records the exact command (launcher included) and the machine, row by row.
#
#   bash scripts/bench/bench_docs.sh [PART...]      PART: allreduce ddp weak features torch small zero ext06a ext06d ext07a ext07b ext07c lm hierarchy lowbyte elastic
#                                             (default:
#                                             all), or ext07a-memory, lm-speed (one table of those parts alone)
#
# The DDP runs use the tiny Transformer with 10 timed steps: once over loopback (where Gloo's
# communication is CPU work that competes with backward for the two cores) and on a simulated cluster
# (ddp_launch --net: every rank in its own network namespace behind a 1 or 10 Gbit/s link), where
# communication costs wall time as on a real one. --net needs root and iproute2; without them the net
# runs are skipped with the reason. About 150 minutes on 2 cores (ext07a alone: about 15, torch about 35, elastic 15,
# lowbyte 40, ext07c 20).
set -euo pipefail
cd "$(dirname "$0")/../.."
parts=${*:-allreduce ddp weak features torch small zero ext06a ext06d ext07a ext07b ext07c lm hierarchy lowbyte elastic}
R=docs/results
mkdir -p $R
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
L=./build/bin/ddp_launch
B=./build/bin
T="--bench --preset tiny --context 128 --warmup 2 --steps 10"

net_ok=1
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  net_ok=0
  echo "bench_docs: no --net runs: they need root and iproute2 (ip, tc); running the loopback ones only"
fi
net() { [ $net_ok = 1 ] && "$@" || echo "(skipped: $*)"; }
# Each of N ranks on cores of its own where the machine has a core per rank (ddp_launch --cpus-per-rank), as each
# rank owns a GPU on a cluster; the benchmark then times its single process on as many cores, and the ceiling
# of the speed-up column is N (docs/00_start_here.md, "What this machine can and cannot show").
pin() { local k=$(( $(nproc) / $1 )); [ $k -ge 1 ] && echo "--cpus-per-rank $k" || true; }

# Extension 06a's table of ZeRO-1 in buckets against stage 05's DDP and stage 06's flat ZeRO-1, tiny at 1 and
# 10 Gbit/s (all variants in one run, round by round), and small at 1 Gbit/s (one variant per group: small's
# replicas do not fit together here). About 10 minutes.
zero1_vs_ddp() {
  for rate in 1gbit 10gbit; do
    net $L --nproc 2 $(pin 2) --net $rate -- $B/ext06a_zero1_buckets $T --json $R/ext06a_tiny_$rate.json
  done
  net $L --nproc 2 $(pin 2) --net 1gbit -- $B/ext06a_zero1_buckets --bench --preset small --context 128 --warmup 1 --steps 6 \
      --json $R/ext06a_small_1gbit.json
}

for part in $parts; do
  case $part in
  allreduce)
    echo "== stage 01: all-reduce over loopback (2 and 4 ranks) and over simulated 1 and 10 Gbit/s links"
    files=()
    for n in 2 4; do
      $L --nproc $n -- $B/stage01_allreduce --bench --sizes 1MB,10MB,100MB --warmup 3 --iters 20 \
          --json $R/ar_lo_$n.json
      files+=($R/ar_lo_$n.json)
      for rate in 1gbit 10gbit; do
        if [ $net_ok = 1 ]; then
          $L --nproc $n --net $rate -- $B/stage01_allreduce --bench --sizes 1MB,10MB,32MB --warmup 2 --iters 8 \
              --json $R/ar_${rate}_$n.json
          files+=($R/ar_${rate}_$n.json)
        fi
      done
    done
    $PY scripts/pages/merge_results.py $R/allreduce.json "${files[@]}"
    rm -f "${files[@]}"
    # The rings written with sends and receives (exercises 01.1-01.4), each timed beside ring_seconds().
    files=()
    for n in 2 3 4; do
      if [ $net_ok = 1 ]; then
        $L --nproc $n --net 1gbit -- $B/stage01_allreduce --bench --rings --sizes 1MB,4MB,16MB --warmup 1 \
            --iters 5 --json $R/rings_$n.json
        files+=($R/rings_$n.json)
      fi
    done
    [ ${#files[@]} = 0 ] || $PY scripts/pages/merge_results.py $R/rings.json "${files[@]}"
    rm -f "${files[@]}" ;;
  ddp)
    echo "== stages 02-05, tiny Transformer: every variant in one run, per link"
    $L --nproc 2 $(pin 2) -- $B/stage05_bucketed $T --caps 1,10,100 --json $R/stage05_tiny.json
    net $L --nproc 2 $(pin 2) --net 1gbit -- $B/stage05_bucketed $T --caps 1,10,100 \
        --json $R/stage05_tiny_1gbit.json --trace $R/stage05_tiny_1gbit.trace.json
    net $L --nproc 2 $(pin 2) --net 10gbit -- $B/stage05_bucketed $T --caps 1,10,100 --json $R/stage05_tiny_10gbit.json
    net $L --nproc 4 $(pin 4) --net 1gbit -- $B/stage05_bucketed $T --caps 1,10,100 --json $R/stage05_tiny_1gbit_4r.json
    if [ -f $R/stage05_tiny_1gbit.trace.json ]; then
      # The pages' timelines: one step of stages 03, 04 and 05 on the same time axis.
      $PY scripts/trace/timeline.py $R/stage05_tiny_1gbit.trace.json --variant "flat (stage 03)" \
          --variant "overlap (stage 04)" --variant "bucketed 1 MB (stage 05)" -o $R/timeline_1gbit.png \
          --title "one step of the tiny Transformer, 2 ranks, simulated 1 Gbit/s link"
      gzip -9f $R/stage05_tiny_1gbit.trace.json  # Perfetto opens .json.gz as it is
    fi ;;
  features)
    echo "== stage 05's extensions on simulated 1 and 10 Gbit/s links: hook x bucket order x optimizer placement in one run"
    for rate in 1gbit 10gbit; do
      tr=(); [ $rate = 1gbit ] && tr=(--trace $R/stage05_features_1gbit.trace.json)
      net $L --nproc 2 $(pin 2) --net $rate -- $B/ext05d_feature_bench $T --caps 1,25 \
          --comm-hook allreduce,fp16 --bucket-order reverse,arrival --overlap-optimizer both --accumulate 4 \
          --json $R/stage05_features_$rate.json "${tr[@]}"
    done
    if [ -f $R/stage05_features_1gbit.trace.json ]; then
      $PY scripts/trace/timeline.py $R/stage05_features_1gbit.trace.json --variant "bucketed 1 MB, arrival order (stage 05)" \
          --variant "bucketed 1 MB, arrival order, optimizer overlapped (stage 05)" -o $R/timeline_optimizer_overlap.png \
          --title "tiny Transformer, 2 ranks, 1 Gbit/s: optimizer after the last bucket, and bucket by bucket"
      $PY scripts/trace/timeline.py $R/stage05_features_1gbit.trace.json --variant "bucketed 25 MB (stage 05)" \
          --variant "bucketed 25 MB, arrival order (stage 05)" -o $R/timeline_bucket_order.png \
          --title "tiny Transformer, 2 ranks, 1 Gbit/s, 25 MB buckets: reverse registration order, and arrival order"
      gzip -9f $R/stage05_features_1gbit.trace.json
    fi ;;
  torch)
    echo "== stage 05 against PyTorch's own DDP (scripts/peers/torch_ddp.py), launch by launch on the same simulated link"
    # Ours: 25 MiB buckets (PyTorch's default cap, in its unit) and 1 MB, each in reverse-registration and
    # arrival order, optimizer after finish and overlapped; both sides again with fp16 hooks. About 35 minutes.
    C=($PY scripts/bench/compare_torch_ddp.py --preset tiny --rounds 5 --steps 8)
    X=(--more-caps 1 "--our-extra=--bucket-order reverse,arrival --overlap-optimizer both")
    if [ $net_ok = 1 ]; then
      "${C[@]}" --net 1gbit --fp16 "${X[@]}" --json $R/torch_ddp_tiny_1gbit.json
      "${C[@]}" --net 1gbit --world 4 "${X[@]}" --json $R/torch_ddp_tiny_1gbit_4r.json
      "${C[@]}" --net 10gbit "${X[@]}" --json $R/torch_ddp_tiny_10gbit.json
      # small (128.6M parameters): one stage 05 row per launch (two would not fit in memory together, and
      # each would get its own baseline): the defaults, then arrival order with the optimizer overlapped.
      S=($PY scripts/bench/compare_torch_ddp.py --preset small --rounds 3 --warmup 1 --steps 3 --net 1gbit)
      "${S[@]}" --json $R/torch_ddp_small_1gbit.json
      "${S[@]}" "--our-extra=--bucket-order arrival --overlap-optimizer true" --json $R/torch_ddp_small_1gbit_best.json
      # PyTorch 2.x on both sides: our build against the pip wheel (scripts/setup/install_torch2.sh, cmake --preset torch2).
      if [ -x build-venv/torch2/bin/python ] && [ -x build-torch2/bin/ext05d_feature_bench ]; then
        "${C[@]}" --net 1gbit --fp16 "${X[@]}" --python build-venv/torch2/bin/python --our-bin build-torch2/bin \
            --json $R/torch_ddp_tiny_1gbit_torch2.json
      else
        echo "(skipped: PyTorch 2.x comparison: needs build-venv/torch2 and build-torch2/bin; see docs/building.md)"
      fi
    else
      echo "(skipped: the PyTorch comparison runs on simulated links: root and iproute2)"
    fi ;;
  small)
    echo "== stage 05, small Transformer (128.6M parameters) on the simulated 1 Gbit/s link"
    # A small step takes ~10 s here and every round runs 8 models: 5 timed steps keep this at ~15 minutes.
    net $L --nproc 2 $(pin 2) --net 1gbit -- $B/stage05_bucketed --bench --preset small --context 128 --warmup 1 \
        --steps 5 --caps 25,100 --json $R/stage05_small_1gbit.json ;;
  zero)
    echo "== stage 06: the all-to-all that ZeRO-1 is built on, Gloo's own against sends and receives"
    # Why common/ builds Gloo's all-to-all from sends and receives: Gloo's own, point to point and an
    # all-reduce, in PyTorch 2.x over the same Gloo (needs scripts/setup/install_torch2.sh's environment).
    if [ $net_ok = 1 ] && [ -x build-venv/torch2/bin/python ]; then
      rm -f $R/alltoall.json
      for rate in 1gbit 10gbit; do
        $L --nproc 2 --net $rate -- build-venv/torch2/bin/python scripts/peers/torch_alltoall.py --json $R/alltoall.json
      done
      $L --nproc 2 -- build-venv/torch2/bin/python scripts/peers/torch_alltoall.py --json $R/alltoall.json
    else
      echo "(skipped: the all-to-all comparison needs --net and build-venv/torch2; run scripts/setup/install_torch2.sh)"
    fi
    ;;
  ext06d)
    echo "== extension 06d: memory around the first optimizer step, AdamW and the ZeRO-1 designs (stage 06, extension 06b) one at a time"
    $L --nproc 2 -- $B/ext06d_memory_bench --preset small --context 128 --batch 4 --warmup 1 --steps 4 \
        --design cs336 --json $R/ext06d_cs336.json
    $L --nproc 2 -- $B/ext06d_memory_bench --preset small --context 128 --batch 4 --warmup 1 --steps 4 \
        --json $R/ext06d_designs.json
    net $L --nproc 2 --net 1gbit -- $B/ext06d_memory_bench --preset tiny --context 128 --batch 4 \
        --warmup 2 --steps 10 --json $R/ext06d_tiny_1gbit.json ;;
  ext07b)
    echo "== extension 07b: FSDP's sharded checkpoints, saved by 2 ranks and loaded by 3 (tiny, small; about 4 minutes)"
    files=()
    for preset in tiny small; do
      ck=$(mktemp -d /tmp/dp_ext07b.XXXXXX)
      $L --nproc 2 -- $B/ext07b_sharded_checkpoints --preset $preset --checkpoint $ck/ckpt --json $R/s7b_save_$preset.json
      $L --nproc 3 -- $B/ext07b_sharded_checkpoints --preset $preset --checkpoint $ck/ckpt --resume-only \
          --json $R/s7b_load_$preset.json
      rm -rf "$ck"
      files+=($R/s7b_save_$preset.json $R/s7b_load_$preset.json)
    done
    $PY scripts/pages/merge_results.py $R/ext07b.json "${files[@]}"
    rm -f "${files[@]}" ;;
  ext07a|ext07a-memory)
    echo "== extension 07a: FSDP's memory (one variant per process), speed against DDP on 1 Gbit/s, the large preset"
    S7="$L --nproc 2 -- $B/ext07a_fsdp_bench --context 128 --batch 4 --warmup 0 --steps 2"
    files=()
    for preset in small medium; do
      for v in "ddp" "zero1" "fsdp --reshard-after-forward true" "fsdp --reshard-after-forward false"; do
        f=$R/s7_mem_${preset}_${#files[@]}.json
        $S7 --preset $preset --variants $v --json $f
        files+=($f)
      done
    done
    $PY scripts/pages/merge_results.py $R/ext07a_memory.json "${files[@]}"
    rm -f "${files[@]}"
    if [ $part = ext07a-memory ]; then continue; fi  # the memory table alone (about 8 minutes)
    net $L --nproc 2 $(pin 2) --net 1gbit -- $B/ext07a_fsdp_bench --preset small --context 128 --warmup 1 --steps 6 \
        --variants ddp,zero1,fsdp --json $R/ext07a_small_1gbit.json --trace $R/ext07a_small_1gbit.trace.json
    net $L --nproc 2 $(pin 2) --net 1gbit -- $B/ext07a_fsdp_bench --preset small --context 128 --warmup 1 --steps 6 \
        --compute-dtype bf16 --json $R/ext07a_small_1gbit_bf16.json
    net $L --nproc 2 $(pin 2) --net 10gbit -- $B/ext07a_fsdp_bench --preset small --context 128 --warmup 1 --steps 6 \
        --variants ddp,zero1,fsdp --json $R/ext07a_small_10gbit.json --trace $R/ext07a_small_10gbit.trace.json
    # CS336 fsdp_accounting (b): did each gather finish before its unit's forward began? From the traces.
    files=()
    for rate in 1gbit 10gbit; do
      if [ -f $R/ext07a_small_$rate.trace.json ]; then
        $PY scripts/trace/gather_in_time.py $R/ext07a_small_$rate.trace.json $R/ext07a_small_$rate.json \
            --json $R/git_$rate.json
        files+=($R/git_$rate.json)
        gzip -9f $R/ext07a_small_$rate.trace.json
      fi
    done
    [ ${#files[@]} -gt 0 ] && $PY scripts/pages/merge_results.py $R/ext07a_gather_in_time.json "${files[@]}" && rm -f "${files[@]}"
    # 970 M parameters: DDP would need ~31 GB for 2 ranks here, FSDP ~8 GB per rank.
    $L --nproc 2 -- $B/ext07a_fsdp_bench --preset large --context 32 --batch 2 --warmup 0 --steps 2 \
        --variants fsdp --reshard-after-forward true --json $R/ext07a_large.json ;;
  ext06a) echo "== extension 06a: ZeRO-1 in buckets against DDP"; zero1_vs_ddp ;;
  lm|lm-speed)
    echo "== stage 08: loss curves on real text at 1, 2 and 4 ranks (loopback, 500 steps), then speed per --sync and link"
    runs=build/lm_runs; mkdir -p $runs
    if [ $part = lm ]; then  # lm-speed: the speed table alone (about 8 minutes)
      # One rank is the reference. One rank with --accumulate 2 sums the same gradients as two half-batch
      # means, the order 2 ranks use: what that order alone does to a curve, to compare with 2 and 4 ranks.
      files=()
      for n in 1 2 4; do
        $L --nproc $n -- $B/stage08_train_lm --steps 500 --eval-every 50 --curve $runs/lo_$n.json
        files+=($runs/lo_$n.json)
      done
      $L --nproc 1 -- $B/stage08_train_lm --steps 500 --eval-every 50 --sample 0 --accumulate 2 --curve $runs/lo_1_acc2.json
      files+=($runs/lo_1_acc2.json)
      $PY scripts/pages/lm_results.py $R/lm_curves.json "${files[@]}"
    fi
    files=()
    for link in loopback 1gbit; do
      [ $link = 1gbit ] && [ $net_ok = 0 ] && { echo "(skipped: the 1gbit speed runs)"; continue; }
      for n in 2 4; do
        for sync in ddp zero1 fsdp; do
          f=$runs/${link}_${sync}_$n.json
          if [ $link = loopback ]; then
            $L --nproc $n -- $B/stage08_train_lm --steps 60 --eval-every 60 --sample 0 --sync $sync --curve $f
          else
            $L --nproc $n --net $link -- $B/stage08_train_lm --steps 60 --eval-every 60 --sample 0 --sync $sync --curve $f
          fi
          files+=($f)
        done
      done
    done
    # DDP with 2 MB buckets: tiny's 17.3 MB of gradients fit one 25 MB bucket, launched only when backward ends.
    if [ $net_ok = 1 ]; then
      $L --nproc 2 --net 1gbit -- $B/stage08_train_lm --steps 60 --eval-every 60 --sample 0 --bucket-mb 2 \
          --curve $runs/1gbit_ddp_2_2mb.json
      files+=($runs/1gbit_ddp_2_2mb.json)
    fi
    $PY scripts/pages/lm_results.py $R/lm_speed.json "${files[@]}" ;;
  weak)
    echo "== stage 05, weak scaling: the same sequences per rank at 1 and 2 ranks, each on a core of its own, 1 Gbit/s (about 8 minutes)"
    if [ $net_ok = 1 ]; then $PY scripts/bench/weak_scaling.py --out $R/weak_scaling.json --rounds 5 --per-rank 2 \
        --ranks 1,2 --cpus-per-rank 1; else
      echo "(skipped: weak scaling runs on the simulated link: root and iproute2)"; fi ;;
  lowbyte)
    echo "== extension 05e: gradients in fewer bytes: each hook's step and bytes against the fp32 lower bound (tiny on"
    echo "   1 and 10 Gbit/s at 2 ranks, 1 Gbit/s at 4; small at 1 Gbit/s), the formats' error against the exact average"
    echo "   for 2-64 simulated ranks, 300 training steps of each hook (PowerSGD also started late, and under SGD), and"
    echo "   the capstone's run with int8 and bf16 gradients (extension 08a; about 40 minutes)"
    for rate in 1gbit 10gbit; do
      net $L --nproc 2 $(pin 2) --net $rate -- $B/ext05e_low_byte $T --json $R/ext05e_tiny_$rate.json
    done
    net $L --nproc 4 --net 1gbit -- $B/ext05e_low_byte $T --json $R/ext05e_tiny_1gbit_4r.json
    net $L --nproc 2 $(pin 2) --net 1gbit -- $B/ext05e_low_byte --bench --preset small --context 128 --warmup 1 \
        --steps 5 --hooks fp32,bf16,int8,powersgd --json $R/ext05e_small_1gbit.json
    $L --nproc 1 -- $B/ext05e_low_byte --errors --preset tiny --error-ranks 2,3,4,8,16,32,64 --seeds 3 --hooks bf16 \
        --json $R/ext05e_errors.json
    $L --nproc 2 -- $B/ext05e_low_byte --curve 300 --preset tiny --context 64 --batch 8 --json $R/ext05e_curves.json
    $L --nproc 2 -- $B/ext05e_low_byte --curve 300 --preset tiny --context 64 --batch 8 --hooks fp32,powersgd \
        --powersgd-rank 32 --json $R/ext05e_curves_r32.json
    # PowerSGD's loss gap taken apart: plain fp32 steps first (PyTorch's start_powerSGD_iter), and SGD with momentum
    # instead of AdamW (PowerSGD's own setting).
    $L --nproc 2 -- $B/ext05e_low_byte --curve 300 --preset tiny --context 64 --batch 8 --hooks fp32,powersgd \
        --powersgd-start 30 --json $R/ext05e_curves_start.json
    $L --nproc 2 -- $B/ext05e_low_byte --curve 300 --preset tiny --context 64 --batch 8 --hooks fp32,int8,powersgd \
        --curve-optimizer sgd --json $R/ext05e_curves_sgd.json
    # The capstone (stage 08) with int8 and bf16 gradients, through extension 08a.
    $L --nproc 2 -- $B/ext08a_low_byte_lm --steps 300 --json $R/ext08a_capstone.json ;;
  ext07c)
    echo "== extension 07c: FSDP's weights and gradients in fewer bytes: each variant's step and bytes against stage"
    echo "   07's (tiny on 1 and 10 Gbit/s at 2 ranks, 1 Gbit/s at 4; small at 1 Gbit/s), the reduce-scatter's error"
    echo "   for 2-32 simulated ranks, and 300 training steps of each variant (about 20 minutes)"
    for rate in 1gbit 10gbit; do
      net $L --nproc 2 $(pin 2) --net $rate -- $B/ext07c_low_byte $T --json $R/ext07c_tiny_$rate.json
    done
    net $L --nproc 4 --net 1gbit -- $B/ext07c_low_byte $T --json $R/ext07c_tiny_1gbit_4r.json
    net $L --nproc 2 $(pin 2) --net 1gbit -- $B/ext07c_low_byte --bench --preset small --context 128 --warmup 1 \
        --steps 5 --variants fp32/fp32,bf16/bf16,fp32/int8,int8/int8 --json $R/ext07c_small_1gbit.json
    $L --nproc 1 -- $B/ext07c_low_byte --errors --preset tiny --error-ranks 2,3,4,8,16,32 --seeds 3 \
        --variants fp32/fp32 --json $R/ext07c_errors.json
    $L --nproc 2 -- $B/ext07c_low_byte --curve 300 --preset tiny --context 64 --batch 8 --json $R/ext07c_curves.json
    # Stage 06's ZeRO-1 with its reduce-scatter in fewer bytes (its all-gather carries the fp32 master weights).
    net $L --nproc 2 $(pin 2) --net 1gbit -- $B/ext07c_low_byte $T --variants zero1/fp32,zero1/bf16,zero1/int8 \
        --json $R/ext07c_zero1_tiny_1gbit.json
    $L --nproc 2 -- $B/ext07c_low_byte --curve 300 --preset tiny --context 64 --batch 8 \
        --variants zero1/fp32,zero1/int8 --json $R/ext07c_zero1_curves.json ;;
  hierarchy)
    echo "== stage 10: 2 simulated nodes x 2 ranks, node links 10 Gbit/s, uplinks 1 Gbit/s (10:1) and 10 Gbit/s (1:1, the"
    echo "   control); flat and hierarchical DDP, flat FSDP and HSDP on tiny; then HSDP's accumulation flavours"
    echo "   (4 ranks share the 2 cores: not pinned; about 4 minutes)"
    # Not small (P = 129 M): beside each variant its 4 ranks hold a no-communication replica (2.1 GB each), and rank 0
    # the single process: with a DDP row about 19 GB before activations, and even with FSDP and HSDP alone
    # (--variants fsdp,hsdp) the kernel killed rank 0 in the second group on this 24 GB machine.
    H="--net 10gbit --net-nodes 2"
    # Stage 01's bus bandwidth on the two tiers: 2 nodes of 1 rank (every byte crosses the uplink) and of 2 (the
    # ring crosses each uplink once each way, so the uplink sets its pace).
    if [ $net_ok = 1 ]; then
      files=()
      for n in 2 4; do
        $L --nproc $n $H --net-uplink 1gbit -- $B/stage01_allreduce --bench --sizes 10MB,32MB --warmup 2 --iters 10 \
            --json $R/tiers_$n.json
        files+=($R/tiers_$n.json)
      done
      $PY scripts/pages/merge_results.py $R/stage01_tiers.json "${files[@]}"
      rm -f "${files[@]}"
    fi
    net $L --nproc 4 $H --net-uplink 1gbit -- $B/stage10_hierarchy $T --json $R/stage10_tiny_10to1.json
    # The same, traced, in a launch of its own (recording slows the steps timed above): each node's uplink bytes
    # per step, from the trace and by formula.
    net $L --nproc 4 $H --net-uplink 1gbit -- $B/stage10_hierarchy $T --json $R/stage10_tiny_10to1_traced.json \
        --trace $R/stage10_tiny_10to1_traced.trace.json
    if [ -f $R/stage10_tiny_10to1_traced.trace.json ]; then
      gzip -9f $R/stage10_tiny_10to1_traced.trace.json
      $PY scripts/trace/uplink_bytes.py
    fi
    net $L --nproc 4 $H --net-uplink 10gbit -- $B/stage10_hierarchy $T --json $R/stage10_tiny_1to1.json
    net $L --nproc 4 $H --net-uplink 1gbit -- $B/stage10_hierarchy $T --batch 16 --accumulate 4 \
        --json $R/stage10_accumulate_10to1.json ;;
  elastic)
    echo "== stage 09: a rank killed, survived in memory, restarted or fallen back to a checkpoint (about 7 minutes)"
    $PY scripts/bench/elastic_bench.py --out $R/elastic.json
    echo "== stage 09: recovery over 27 failures, then 40 runs under random kill -9s (about 25 minutes)"
    $PY scripts/bench/elastic_chaos.py recovery --out $R/elastic_recovery.json
    $PY scripts/bench/elastic_chaos.py chaos --runs 40 --seed 1 --out $R/elastic_chaos.json ;;
  *) echo "bench_docs.sh: unknown part '$part' (allreduce, ddp, weak, features, torch, small, zero, ext06a, ext06d, ext07a, ext07a-memory, lm, lm-speed, hierarchy, lowbyte, elastic)" >&2; exit 2 ;;
  esac
done

for f in $R/*.json; do
  case $f in *.trace.json|*/gpu_*.json|*/alltoall.json|*/torch_compare.json|*/torch_ddp_*.json|*/ext07a_gather_in_time.json|*/lm_speed.json|*/margins.json|*/margins_*.json|*/weak_scaling.json|*/trace_summary.json|*/elastic_recovery.json|*/elastic_chaos.json) continue ;; esac
  # No plot where it would repeat another picture: these runs measure speed, and their plot would draw only
  # the tensor bytes that ext06d_cs336.png and ext07a_memory.png already show (ext07a_large: one bar).
  case $f in */ext06d_designs.json|*/ext06d_tiny_1gbit.json|*/ext07a_large.json|*/ext07a_small_*.json) continue ;; esac
  case $f in */ext07b.json) continue ;; esac  # a save and a load, not variants: its table says it
  # Measured against a formula (rings) or by another program's rows (the Python package's): their tables say it.
  case $f in */rings.json|*/python_ddp_*.json) continue ;; esac
  case $f in */stage10_*.json|*/stage01_tiers.json) continue ;; esac  # stage 10's page reads the steps beside the uplink bytes, as a table
  case $f in */ext05e_*.json|*/ext07c_*.json) continue ;; esac  # 05e's and 07c's pictures: plot_low_byte.py, below
  $PY scripts/pages/plot.py "$f"
done
$PY scripts/pages/plot_low_byte.py  # each of 05e and 07c whose error study and curves are there
$PY scripts/pages/figures.py  # the pictures of the ideas: two of them drawn from the traces just recorded
$PY scripts/trace/trace_summary.py  # what the pages quote from the traces, as JSON for make_tables.py
$PY scripts/pages/make_tables.py
