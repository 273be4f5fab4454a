#!/usr/bin/env bash
# The GPU path, run for real: builds the CUDA configuration against the pip torch of this machine's Python
# and runs every stage on CUDA tensors, each with its own checks against single-process training.
#
#   bash scripts/machines/gpu_check.sh            # on a machine with an NVIDIA GPU, CUDA's nvcc, CMake and ninja
#   bash scripts/machines/gpu_check.sh --list     # prints the steps and their exact commands; needs no GPU
#
# What it needs and nothing more: a Python whose torch is a CUDA build (DP_TORCH_PYTHON, default python3:
# its LibTorch, NCCL included, is what we link), nvcc of the same CUDA major version, cmake, ninja, a C++20
# compiler. CLI11, nlohmann-json, {fmt} and GoogleTest come from the system or from third_party/
# (bash scripts/setup/vendor_deps.sh makes it on a Debian machine); nothing is downloaded.
#
# Steps, each under a time limit (one GPU: NCCL runs one rank per GPU, so world 1; several ranks share the
# GPU through Gloo with --device cuda, Gloo copying through host memory):
#   stage 01 on NCCL (world 1) and on Gloo with CUDA tensors (world 2), sizes up to 1 GB, CUDA-event
#   timing, bus bandwidth beside a device-to-device copy of the same buffer; stages 02-08 at world 1 over
#   NCCL and world 2 over Gloo on CUDA, every PASS line their own checks (stage 08 with each
#   synchronization, and a checkpoint saved at 1 rank and resumed at 2); stage 05's benchmark at world 1
#   (compute time per step on the GPU); extension 07a's FSDP with bf16 compute on the large and xl presets
#   (peak allocated from CUDA's caching allocator); the CUDA tests of the suite (ctest).
# It writes docs/results/gpu_check.json (device, driver, torch, every step's command, exit code, time and
# PASS lines) and docs/results/gpu_*.json (the programs' own results). Without a GPU it refuses with exit 2
# before building anything.
#
# Environment: DP_TORCH_PYTHON (python3), GPU_CHECK_BUILD (build-gpu), GPU_CHECK_OUT (docs/results),
# GPU_CHECK_DEADLINE (seconds from the start after which no new step starts; 0: none), GPU_CHECK_JOBS,
# GPU_CHECK_PARALLEL (checks at a time, 4), GPU_CHECK_ONLY (a regular expression: only matching steps run),
# GPU_CHECK_COMMIT (the commit the record names, for a copy of the tree whose .git is older than the tree).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
PY=${DP_TORCH_PYTHON:-python3}
build=${GPU_CHECK_BUILD:-build-gpu}
out=${GPU_CHECK_OUT:-docs/results}
deadline=${GPU_CHECK_DEADLINE:-0}
only=${GPU_CHECK_ONLY:-.}  # a regular expression: only the steps whose names match run
jobs=${GPU_CHECK_JOBS:-$(nproc)}
logs=$build/gpu_check
B=$build/bin
L="$B/ddp_launch"
t0=$(date +%s)

# ---- the steps: name, kind, time limit (s), command ---------------------------------------------
# "timed" steps run alone; "check" steps (their own checks, nothing timed) run GPU_CHECK_PARALLEL at a time,
# sharing the GPU and the cores as the ranks of one machine would.
steps=()
step() { steps+=("$1|$2|$3|$4"); }
# Stage 01: the all-reduce itself. NCCL at world 1 is a device-local copy; Gloo's goes through host memory.
step stage01_nccl_w1 timed 60 "$L --nproc 1 -- $B/stage01_allreduce --backend nccl --bench --sizes 1MB,10MB,100MB,1GB --warmup 3 --iters 10 --json $out/gpu_stage01_nccl_w1.json"
step stage01_gloo_cuda_w2 timed 100 "$L --nproc 2 -- $B/stage01_allreduce --device cuda --bench --sizes 1MB,10MB,100MB,1GB --warmup 1 --iters 5 --budget 10s --json $out/gpu_stage01_gloo_cuda_w2.json"
# Stages 02-07: their own checks against single-process training, on the GPU.
for s in 02_naive_ddp 03_flat 04_overlap 05_bucketed 06_sharded_opt 07_fsdp; do
  prog=stage${s%%_*}_${s#*_}
  step "stage${s%%_*}_nccl_w1" check 150 "$L --nproc 1 -- $B/$prog --backend nccl"
  step "stage${s%%_*}_gloo_cuda_w2" check 150 "$L --nproc 2 -- $B/$prog --device cuda"
done
# The extensions' own checks on the GPU, each at 1 rank over NCCL and 2 over Gloo on CUDA: 05d every stage 05
# feature (communication hooks, buckets in arrival order, the optimizer overlapped), 06a ZeRO-1 in buckets,
# 06b CS336's sharded design; 06c a checkpoint of ZeRO-1 saved by one rank (NCCL) and loaded by two (Gloo on
# CUDA); 06d the optimizer's memory with CUDA's own peak allocated beside the tensors counted; 07b FSDP's
# sharded checkpoint saved by one rank (NCCL) and loaded by two (Gloo on CUDA), checked against its files.
for e in 05d_feature_bench 06a_zero1_buckets 06b_cs336_design; do
  step "ext${e%%_*}_nccl_w1" check 150 "$L --nproc 1 -- $B/ext$e --backend nccl"
  step "ext${e%%_*}_gloo_cuda_w2" check 150 "$L --nproc 2 -- $B/ext$e --device cuda"
done
step ext06c_save_w1_resume_w2 check 200 "rm -rf $build/gpu_ext06c && $L --nproc 1 -- $B/ext06c_checkpoints --backend nccl --checkpoint $build/gpu_ext06c && $L --nproc 2 -- $B/ext06c_checkpoints --device cuda --checkpoint $build/gpu_ext06c --resume-only"
step ext06d_gloo_cuda_w2 check 150 "$L --nproc 2 -- $B/ext06d_memory_bench --device cuda"
step ext07b_save_w1_resume_w2 check 200 "rm -rf $build/gpu_ext07b && $L --nproc 1 -- $B/ext07b_sharded_checkpoints --backend nccl --checkpoint $build/gpu_ext07b && $L --nproc 2 -- $B/ext07b_sharded_checkpoints --device cuda --checkpoint $build/gpu_ext07b --resume-only"
# Stage 08: the capstone on the GPU, a short run (its corpus: this repository's pages; no Debian fortunes there).
step stage08_ddp_nccl_w1 check 150 "$L --nproc 1 -- $B/stage08_train_lm --backend nccl --sync ddp --corpus docs --steps 40 --eval-every 20 --sample 0"
step stage08_fsdp_gloo_cuda_w2 check 150 "$L --nproc 2 -- $B/stage08_train_lm --device cuda --sync fsdp --corpus docs --steps 40 --eval-every 20 --sample 0"
step stage08_zero1_nccl_w1 check 150 "$L --nproc 1 -- $B/stage08_train_lm --backend nccl --sync zero1 --corpus docs --steps 40 --eval-every 20 --sample 0"
step stage08_zero1_gloo_cuda_w2 check 150 "$L --nproc 2 -- $B/stage08_train_lm --device cuda --sync zero1 --corpus docs --steps 40 --eval-every 20 --sample 0"
# Saved by one rank with ZeRO-1 over NCCL, resumed by two with FSDP over Gloo: the checkpoint goes through the
# host both ways, and the run continues where it stopped (its step and loss curve).
step stage08_resume_w1_to_w2 check 200 "rm -f $build/gpu_lm.ckpt && $L --nproc 1 -- $B/stage08_train_lm --backend nccl --sync zero1 --corpus docs --steps 20 --eval-every 10 --sample 0 --checkpoint $build/gpu_lm.ckpt --checkpoint-every 10 && $L --nproc 2 -- $B/stage08_train_lm --device cuda --sync fsdp --corpus docs --steps 40 --eval-every 10 --sample 0 --checkpoint $build/gpu_lm.ckpt --resume"
# The suite's CUDA tests (elsewhere they skip, saying why).
step ctest_cuda check 120 "ctest --test-dir $build -R '(^|:)(Backends|GlooOnCuda|Cli)\\.' --output-on-failure --timeout 120"
# Stage 05's benchmark: the Transformer's step on the GPU (compute) beside the overhead model's prediction.
step stage05_bench_nccl_w1 timed 120 "$L --nproc 1 -- $B/stage05_bucketed --backend nccl --bench --preset small --context 256 --batch 16 --warmup 2 --steps 10 --json $out/gpu_stage05_bench_nccl_w1.json"
step stage05_bench_gloo_cuda_w2 timed 120 "$L --nproc 2 -- $B/stage05_bucketed --device cuda --bench --preset small --context 256 --batch 16 --warmup 2 --steps 10 --json $out/gpu_stage05_bench_gloo_cuda_w2.json"
# The CPU page's own shape (docs/05_measured.md: small, context 128, global batch 4, caps 25 and 100 MB), for a
# like-for-like ratio of the GPU's step to the CPU's.
step stage05_bench_cpu_shape_gloo_cuda_w2 timed 120 "$L --nproc 2 -- $B/stage05_bucketed --device cuda --bench --preset small --context 128 --warmup 1 --steps 5 --caps 25,100 --json $out/gpu_stage05_cpu_shape_gloo_cuda_w2.json"
# Extension 07a: FSDP with bf16 compute on presets that the CPU machine here cannot train, in GPU memory.
step ext07a_large_bf16_nccl_w1 timed 120 "$L --nproc 1 -- $B/ext07a_fsdp_bench --backend nccl --preset large --context 256 --batch 8 --warmup 1 --steps 3 --variants fsdp --reshard-after-forward true --compute-dtype bf16 --json $out/gpu_ext07a_large_bf16.json"
step ext07a_xl_bf16_nccl_w1 timed 120 "$L --nproc 1 -- $B/ext07a_fsdp_bench --backend nccl --preset xl --context 256 --batch 8 --warmup 1 --steps 3 --variants fsdp --reshard-after-forward true --compute-dtype bf16 --json $out/gpu_ext07a_xl_bf16.json"

if [ "${1:-}" = "--list" ]; then
  for s in "${steps[@]}"; do IFS='|' read -r name kind limit cmd <<< "$s"; printf '%-28s %-5s %4ss  %s\n' "$name" "$kind" "$limit" "$cmd"; done
  exit 0
elif [ $# -gt 0 ]; then
  echo "gpu_check: unknown argument '$1'; use no argument to run, or --list to print the steps" >&2; exit 2
fi

# ---- refuse early: no long work on a machine that cannot run it ---------------------------------
if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "gpu_check: $PY cannot import torch. Point DP_TORCH_PYTHON at a Python whose torch is a CUDA build" \
       "(e.g. DP_TORCH_PYTHON=build-venv/torch2/bin/python after bash scripts/setup/install_torch2.sh)" >&2
  exit 2
fi
probe=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda or "none", torch.cuda.device_count() if torch.version.cuda else 0)' 2>/dev/null)
read -r tv tcuda ngpu <<< "$probe"
if [ "$tcuda" = none ]; then
  echo "gpu_check: the torch of $PY ($tv) is a CPU-only build; it needs a CUDA build of torch" >&2; exit 2
fi
if [ "${ngpu:-0}" -lt 1 ]; then
  echo "gpu_check: no GPU is visible here (torch $tv, built for CUDA $tcuda, counts 0 devices;" \
       "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}). It runs the stages on a GPU: run it on a machine" \
       "with an NVIDIA GPU and its driver. Here, run the suite on the CPU: bash scripts/test.sh" >&2
  exit 2
fi
command -v nvcc > /dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH=$PATH:/usr/local/cuda/bin
for tool in cmake ninja nvcc; do
  command -v "$tool" > /dev/null || { echo "gpu_check: '$tool' is not on the PATH; it is needed to build" >&2; exit 2; }
done

# ---- build: only what the steps run, with every core --------------------------------------------
mkdir -p "$logs" "$out"
rm -f "$logs"/*.json "$logs"/*.log
echo "[gpu_check] torch $tv (CUDA $tcuda), $ngpu GPU(s); building $build with $jobs jobs"
tb=$(date +%s)
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDP_TORCH_PIP=ON -DDP_CUDA=ON \
      -DDP_TORCH_PYTHON="$(command -v "$PY")" -DDP_BUILD_DOCS=OFF -DTORCH_CUDA_ARCH_LIST="9.0" \
      > "$logs/configure.log" 2>&1; then
  tail -40 "$logs/configure.log"; echo "[gpu_check] FAIL configure"; exit 1
fi
grep -E "LibTorch|CUDA LibTorch|NCCL backend|From " "$logs/configure.log" | sed 's/^-- */[gpu_check] /'
# The programs the steps name, and the test executables behind ctest_cuda's tests.
targets="$(printf '%s\n' "${steps[@]}" | grep -o "$B/[a-z0-9_]*" | sed "s|$B/||" | sort -u | tr '\n' ' ')test_dist test_cli"
if ! cmake --build "$build" -j "$jobs" --target $targets > "$logs/build.log" 2>&1; then
  grep -E "error|FAILED" "$logs/build.log" | head -40; echo "[gpu_check] FAIL build"; exit 1
fi
build_s=$(( $(date +%s) - tb ))
echo "[gpu_check] built in ${build_s} s"

# ---- run every step, whatever the earlier ones did ----------------------------------------------
run_step() {  # name kind limit cmd: runs it, prints its verdict and PASS lines, records it in $logs/NAME.json
  local name=$1 kind=$2 limit=$3 cmd=$4 ts rc ms
  [[ $name =~ $only ]] || return 0
  if [ "$deadline" -gt 0 ] && [ $(( $(date +%s) - t0 )) -ge "$deadline" ]; then
    echo "[gpu_check] SKIP $name (GPU_CHECK_DEADLINE of $deadline s reached)"
    "$PY" -c 'import json,sys; print(json.dumps({"name":sys.argv[1],"command":sys.argv[2],"rc":None,"skipped":"deadline"}))' \
      "$name" "$cmd" > "$logs/$name.json"
    return
  fi
  ts=$(date +%s%N)
  timeout -k 10 "$limit" bash -c "$cmd" > "$logs/$name.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - ts) / 1000000 ))
  "$PY" - "$name" "$kind" "$cmd" "$rc" "$ms" "$logs/$name.log" "$limit" > "$logs/$name.json" <<'PYEOF'
import json, re, sys
name, kind, cmd, rc, ms, log, limit = sys.argv[1:]
text = open(log, errors="replace").read()
lines = [l for l in text.splitlines() if re.search(r"\bPASS\b|: error|FAIL|MISMATCH", l)]
verdict = "PASS" if rc == "0" else f"FAIL (exit {rc}{', over its ' + limit + ' s' if rc in ('124', '137') else ''})"
print(f"[gpu_check] {verdict} {name} in {int(ms) / 1000:.1f} s", file=sys.stderr)
passes = [l for l in lines if "PASS" in l]
if len(passes) > 3:
    print(f"    ({len(passes) - 3} more PASS lines in {log})", file=sys.stderr)
for l in (passes[-3:] + [l for l in lines if "PASS" not in l][:5]):
    print("    " + (l if len(l) < 240 else l[:237] + "..."), file=sys.stderr)
if rc != "0":
    for l in text.splitlines()[-8:]:
        print("    | " + l, file=sys.stderr)
print(json.dumps({"name": name, "kind": kind, "command": cmd, "rc": int(rc), "seconds": int(ms) / 1000,
                  "limit_s": int(limit), "pass_lines": lines[:40], "log_tail": text.splitlines()[-15:]}))
PYEOF
}
par=${GPU_CHECK_PARALLEL:-4}
for s in "${steps[@]}"; do  # the timed steps of stage 01 first, alone
  IFS='|' read -r name kind limit cmd <<< "$s"
  [[ $kind == timed && $name == stage01* ]] && run_step "$name" "$kind" "$limit" "$cmd"
done
running=0
for s in "${steps[@]}"; do  # the checks, $par at a time
  IFS='|' read -r name kind limit cmd <<< "$s"
  [ "$kind" = check ] || continue
  run_step "$name" "$kind" "$limit" "$cmd" &
  running=$((running + 1))
  if [ $running -ge "$par" ]; then wait -n; running=$((running - 1)); fi
done
wait
for s in "${steps[@]}"; do  # the other timed steps, alone
  IFS='|' read -r name kind limit cmd <<< "$s"
  [[ $kind == timed && $name != stage01* ]] && run_step "$name" "$kind" "$limit" "$cmd"
done
for s in "${steps[@]}"; do IFS='|' read -r name _ <<< "$s"; [ ! -f "$logs/$name.json" ] || cat "$logs/$name.json"; done > "$logs/steps.jsonl"
failed=$(grep -c '"rc": [1-9]' "$logs/steps.jsonl")

# ---- the record ----------------------------------------------------------------------------------
"$PY" - "$logs/steps.jsonl" "$out/gpu_check.json" "$build_s" "$root" <<'PYEOF'
import datetime, json, os, platform, subprocess, sys
steps_file, dest, build_s, root = sys.argv[1:]
import torch
def smi(q):
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
    except Exception as e:
        return f"unknown ({e})"
try:
    p = torch.cuda.get_device_properties(0)
    gpu = {"device": torch.cuda.get_device_name(0), "device_memory_GiB": round(p.total_memory / 2**30, 1),
           "multiprocessors": p.multi_processor_count, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
except Exception as e:  # the steps' record matters more than these figures
    gpu = {"device": f"unknown ({e})", "device_memory_GiB": 0, "multiprocessors": 0, "nccl": "unknown"}
commit = os.environ.get("GPU_CHECK_COMMIT", "")  # the tree's commit, where the copy's .git is not the tree's
if not commit:
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results"],
                             capture_output=True, text=True).stdout.strip()
    if commit and changed:
        commit += " with uncommitted changes"
only = os.environ.get("GPU_CHECK_ONLY", "")
rec = {"benchmark": "gpu_check",
       "command": (f"GPU_CHECK_ONLY='{only}' " if only else "") + "bash scripts/machines/gpu_check.sh",
       "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
       "commit": commit or "unknown", "script": "bash scripts/machines/gpu_check.sh",
       **gpu, "driver": smi("driver_version"), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
       "cpu_cores": os.cpu_count(),
       "host": platform.platform(), "build_s": int(build_s),
       "rows": [json.loads(l) for l in open(steps_file) if l.strip()]}
rec["machine"] = (f"{rec['device']} ({rec['device_memory_GiB']} GiB, driver {rec['driver']}), "
                  f"{rec['cpu_cores']} CPU cores, torch {rec['torch']}")
rec["passed"] = sum(1 for s in rec["rows"] if s.get("rc") == 0)
rec["failed"] = sum(1 for s in rec["rows"] if s.get("rc") not in (0, None))
rec["skipped"] = sum(1 for s in rec["rows"] if s.get("rc") is None)
json.dump(rec, open(dest, "w"), indent=1)
print(f"[gpu_check] {rec['device']} (driver {rec['driver']}), torch {rec['torch']}: {rec['passed']} steps passed, "
      f"{rec['failed']} failed, {rec['skipped']} skipped; {dest}")
PYEOF
[ $failed -eq 0 ] && echo "PASS gpu_check: every step passed on the GPU" || echo "FAIL gpu_check: $failed step(s) failed"
[ $failed -eq 0 ]
