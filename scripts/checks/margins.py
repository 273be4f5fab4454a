#!/usr/bin/env python3
"""The margin of every numerical check: how far below its derived bound each one stays.

Every stage checks itself against single-process training before it times anything, and prints, per
check, the largest difference, the bound derived from the dtype's unit roundoff (common/measure/tolerance.hpp)
and their ratio. A bound tuned on one machine fails on the next; a derived one must hold anywhere, so
this script runs the checks over world sizes, seeds and ATen's CPU kernel paths (ATEN_CPU_CAPABILITY
picks the kernels another CPU would get; at `default`, OpenBLAS's oldest x86-64 kernels too) and reports
the worst ratio per check. It fails when a ratio exceeds --max-ratio (0.5: a bound that a new CPU could
cross by a factor of two is no bound).

    python3 scripts/checks/margins.py build/bin                      # everything: ~10 minutes on 2 cores
    python3 scripts/checks/margins.py build/bin --stages 07,07a --worlds 3 --seeds 0 --capabilities default,avx2

Correct output: one row per check with its worst ratio and where it happened, then
"margins: N checks, worst ratio R <= 0.5 over M runs" and exit 0. Exit 1: a ratio over the limit, a
FAIL line, or a run that printed no check; exit 2: bad arguments.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

# Stage -> (program, extra arguments, world sizes it accepts). The DDP checks split CS336's 20 rows and
# the toy MLP's 100 over the ranks: 3 ranks do not divide them (the programs refuse, exit 2).
STAGES = {
    "02": ("stage02_naive_ddp", [], {1, 2, 4}),
    "03": ("stage03_flat", [], {1, 2, 4}),
    "04": ("stage04_overlap", [], {1, 2, 4}),
    "05": ("stage05_bucketed", [], {1, 2, 4}),
    "07": ("stage07_fsdp", [], {1, 2, 3, 4}),
    "07a": ("ext07a_fsdp_bench", ["--preset", "nano", "--context", "16", "--batch", "12", "--warmup", "0", "--steps", "1",
                                  "--variants", "fsdp"], {1, 2, 3, 4}),  # its checks, then a one-step benchmark
    "08": ("stage08_train_lm", ["--steps", "2", "--warmup", "0", "--batch", "12", "--context", "32", "--eval-every", "100",
                                "--sample", "0", "--preset", "nano"], {1, 2, 3, 4}),  # the check has its own model
}
SYNCS_08 = ["ddp", "zero1", "fsdp"]
# An extension reruns its stage's checks first: the lines of its own checks count as its, the others as the
# stage's (the same function, run the same way), unless the stage's own program runs too.
OWN_CHECKS = {"07a": (re.compile(r"Transformer"), "07")}
# The checks' verdict lines: "PASS <what>: max |diff| D <= B (ratio R" (dp::report_margin(), common/harness/ddp_check.hpp)
# or stage 08's "... max |diff| D (ratio R" (a bound per entry).
LINE = re.compile(r"^(?:\[rank \d+/\d+\] )?(PASS|FAIL) (.*?)[:,]? max \|diff\| (\S+)(?: <= (\S+))? \(ratio ([0-9.einf]+)")


def machine():
    """The CPU and cores, as the other results name the machine they ran on, and whether the CPU has bf16 dot
    products (AVX512_BF16): there LibTorch's bf16 matmul runs in oneDNN, which ATEN_CPU_CAPABILITY does not
    steer, so the bf16 checks' differences are another CPU's whatever the kernel path."""
    model, bf16 = "unknown CPU", False
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                bf16 = bf16 or "avx512_bf16" in line.split()
    except OSError:
        pass
    return f"{model}{' with AVX512_BF16' if bf16 else ''}, {os.cpu_count()} cores"


def check_name(text):
    """The check's words with the run-specific numbers (ranks) taken out, so runs line up."""
    return re.sub(r", \d+ ranks?\b", "", text).strip()  # "3 SGD steps, 2 ranks" and "..., 1 rank" alike


def run(args, stage, world, seed, cap, extra):
    prog, stage_args, _ = STAGES[stage]
    cmd = [os.path.join(args.bin, "ddp_launch"), "--nproc", str(world), "--",
           os.path.join(args.bin, prog), "--seed", str(seed)] + stage_args + extra
    env = dict(os.environ)
    if cap == "native":
        env.pop("ATEN_CPU_CAPABILITY", None)
    else:
        env["ATEN_CPU_CAPABILITY"] = cap
    if cap == "default":  # a CPU without AVX2 gets OpenBLAS's SSE3 (Prescott) kernels too: so do these runs
        env.setdefault("OPENBLAS_CORETYPE", "Prescott")
    t = time.time()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=args.timeout)
    found, running = [], args.stages.split(",")
    for line in p.stdout.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        owner = stage
        if stage in OWN_CHECKS and not OWN_CHECKS[stage][0].search(m.group(2)):
            owner = OWN_CHECKS[stage][1]
            if owner in running:
                continue  # counted from the stage's own runs
        diff, ratio = float(m.group(3)), float(m.group(5))
        # The bound the line prints; a line without one gives diff / ratio (nothing when both are 0).
        bound = float(m.group(4)) if m.group(4) else (diff / ratio if ratio > 0 else float("nan"))
        found.append((m.group(1), check_name(m.group(2)), diff, ratio, bound, owner))
    return cmd, p, found, time.time() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bin", help="the build's bin folder (build/bin)")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated: " + ",".join(STAGES))
    ap.add_argument("--worlds", default="1,2,3,4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--capabilities", default="native,default,avx2",
                    help="ATEN_CPU_CAPABILITY values; native leaves it unset (the CPU's best); default also "
                         "runs OpenBLAS's Prescott kernels (OPENBLAS_CORETYPE), as a CPU without AVX2 would")
    ap.add_argument("--max-ratio", type=float, default=0.5)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run")
    ap.add_argument("--json", help="write the worst ratio per check here (docs/results/margins.json: the table of "
                                   "docs/tolerances.md, by scripts/pages/make_tables.py), every measured ratio besides")
    args = ap.parse_args()
    def ints(text, what):
        try:
            return [int(v) for v in text.split(",")]
        except ValueError:
            ap.error(f"--{what} {text!r}: use comma-separated integers, e.g. 1,2,3,4")
    worlds, seeds = ints(args.worlds, "worlds"), ints(args.seeds, "seeds")
    stages = args.stages.split(",")
    for s in stages:
        if s not in STAGES:
            ap.error(f"--stages: unknown stage {s!r}; use some of {','.join(STAGES)}")
    caps = args.capabilities.split(",")
    for c in caps:
        if c not in ("native", "default", "avx2", "avx512"):
            ap.error(f"--capabilities: {c!r} is not native, default, avx2 or avx512")
    if not os.path.exists(os.path.join(args.bin, "ddp_launch")):
        ap.error(f"{args.bin}/ddp_launch not found: build first (cmake --build --preset default)")

    worst = {}   # check -> (ratio, diff, bound, where)
    records, problems, runs = [], [], 0
    for stage in stages:
        extras = [["--sync", s] for s in SYNCS_08] if stage == "08" else [[]]
        for cap in caps:
            for world in worlds:
                if world not in STAGES[stage][2]:
                    continue
                for seed in seeds:
                    for extra in extras:
                        cmd, p, found, secs = run(args, stage, world, seed, cap, extra)
                        runs += 1
                        where = f"stage {stage} {' '.join(extra)} W={world} seed={seed} {cap}".replace("  ", " ")
                        print(f"margins: {where}: {len(found)} checks, {secs:.0f} s", flush=True)
                        if not found:
                            problems.append(f"{where}: no check line (exit {p.returncode}); "
                                            f"command: {' '.join(cmd)}\n{p.stdout[-2000:]}")
                        for verdict, name, diff, ratio, bound, owner in found:
                            name = f"{owner} {' '.join(extra)} {name}".replace("  ", " ")
                            records.append({"check": name, "stage": owner, "world": world, "seed": seed,
                                            "capability": cap, "diff": diff, "ratio": ratio})
                            if verdict == "FAIL":
                                problems.append(f"{where}: FAIL {name}")
                            if name not in worst or ratio > worst[name][0]:
                                worst[name] = (ratio, diff, bound, where)
    print()
    print(f"| check | worst diff / bound | diff | where |")
    print(f"|---|---|---|---|")
    for name, (ratio, diff, bound, where) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
        flag = " **over**" if ratio > args.max_ratio else ""
        print(f"| {name} | {ratio:.3f}{flag} | {diff:.3g} | {where} |")
    if args.json:
        rows = [{"check": name, "worst_ratio": ratio, "diff": diff, "bound": bound, "where": where,
                 "runs": sum(1 for r in records if r["check"] == name)}
                for name, (ratio, diff, bound, where) in sorted(worst.items(), key=lambda kv: -kv[1][0])]
        command = f"python3 scripts/checks/margins.py {args.bin} " + " ".join(
            f"--{k} {v}" for k, v in [("stages", args.stages), ("worlds", args.worlds), ("seeds", args.seeds),
                                      ("capabilities", args.capabilities)])
        with open(args.json, "w") as f:
            json.dump({"benchmark": "margins: worst difference / derived bound per check", "command": command,
                       "machine": machine(), "max_ratio": args.max_ratio, "rows": rows, "records": records}, f,
                      indent=1)
    over = [n for n, w in worst.items() if w[0] > args.max_ratio]
    for p in problems:
        print("margins: problem:", p, file=sys.stderr)
    top = max((w[0] for w in worst.values()), default=float("nan"))
    if over or problems or not worst:
        print(f"margins: FAIL: {len(over)} of {len(worst)} checks over {args.max_ratio}, {len(problems)} problems "
              f"({runs} runs)")
        return 1
    print(f"margins: {len(worst)} checks, worst ratio {top:.3f} <= {args.max_ratio} over {runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
