#!/usr/bin/env python3
"""Stage 05's bucketed DDP (C++, with its extensions) against PyTorch's own DistributedDataParallel, on the
same simulated network.

Each round launches our benchmark and PyTorch's, one after the other (ours first in odd rounds, PyTorch's
first in even ones, so neither side always runs on a machine just warmed or just loaded by the other),
with the same preset, global batch, context, warm-up and timed steps, ranks, link and launcher:

    ours:   <our-bin>/ddp_launch --nproc W [--net NET] -- <our-bin>/ext05d_feature_bench --bench --preset P
                --caps 26.2144[,MORE] --batch B --context C --warmup 2 --steps S
                [OUR-EXTRA] --json ours.json         (26.2144 MB = 25 MiB, PyTorch's unit; MORE, OUR-EXTRA: fp32 only)
    theirs: <our-bin>/ddp_launch --nproc W [--net NET] -- PYTHON scripts/peers/torch_ddp.py --preset P
                --batch B --context C --warmup 2 --steps S --bucket-cap-mb 25 --comm-hook none --json theirs.json

and with --fp16 the same two again with ours' --comm-hook fp16 and PyTorch's fp16_compress_hook.
(ext05d_feature_bench, extension 05d, times the no-communication baseline and the stage 05 rows only.)

    /usr/bin/python3 scripts/bench/compare_torch_ddp.py --preset tiny --net 1gbit --rounds 5 --steps 10 --json /tmp/cmp.json
    /usr/bin/python3 scripts/bench/compare_torch_ddp.py --preset tiny --net 1gbit --fp16 \\
        --python build-venv/torch2/bin/python --our-bin build-torch2/bin --json /tmp/cmp2.json   # 2.x both sides

Statistics. A round's figure for a side is the median of its timed steps (each step's time is the
slowest rank's). Per round, ratio = ours / PyTorch's; the result is the median ratio over the rounds with
a 95% percentile-bootstrap interval of that median (scipy, 9999 resamples, seed 0: the method of
scripts/pages/make_tables.py), given from 3 rounds on. The verdict says whether the interval excludes "ours is
slower" (its upper bound <= 1.0). Rounds are whole launches, so they are independent samples; steps
within a launch are not.

The lower bound, per round from our own JSON: forward + max(backward, communication) + optimizer, with
forward, backward and optimizer the no-communication baseline's medians and communication the median of
one flat all-reduce of all gradients (fp32), both measured in that same launch: a step that hid all its
communication behind backward and paid nothing else for it. Every row gets its ratio to it (fp16 rows put
half the bytes on the wire, so theirs may fall below 1).

What differs around the timed step (the steps themselves do the same work): each round of ours also
runs a no-communication step just before the stage 05 step, one flat all-reduce and a single-process step
on rank 0; PyTorch's peer runs only its DDP step, after a barrier.

Output: a table, one verdict line last, and with --json a file whose "rows" render as a table directly
(variant, median step, CI, ratio to PyTorch DDP with CI, ratio to the lower bound with CI), beside every
per-round sample, each launch's command and JSON, both sides' torch versions and the machine.
The driver itself runs under /usr/bin/python3 (numpy, scipy); --python picks the PyTorch of the peer.
Exit codes: 0 done, 1 a launch failed (its log's tail is printed, the logs are kept), 2 bad options.
"""
import argparse
import json
import os
import pathlib
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import numpy  # noqa: F401  (dplib.median_ci needs both)
    import scipy  # noqa: F401
except ImportError as e:  # another python3 first on PATH (a virtualenv, pyenv) without them
    sys.exit(f"error: {e}; run this with /usr/bin/python3 (Debian's python3-numpy and python3-scipy)")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402

ROOT = str(dplib.ROOT)
PEER = os.path.join(ROOT, "scripts", "peers", "torch_ddp.py")
OURS = "ext05d_feature_bench"  # extension 05d: stage 05 with every feature, our side of each launch
NETS = ("none", "1gbit", "10gbit")
PYTORCH_ROW = "PyTorch DDP"


# --- Statistics -----------------------------------------------------------------------------------------


def plural(n, word):
    return f"{n} {word}{'' if n == 1 else 's'}"


def fmt_ci(c, f="{:.3f}"):
    med, lo, hi = c
    return f.format(med) + ("" if lo is None else f" [{f.format(lo)}, {f.format(hi)}]")


def verdict(ours_name, ours_medians, theirs_name, theirs_medians):
    """Ours / theirs per round, its median and interval, and whether the interval excludes 'slower'."""
    ratios = [x / y for x, y in zip(ours_medians, theirs_medians)]
    med, lo, hi = dplib.median_ci(ratios)
    if lo is None:
        text = (f"{ours_name} / {theirs_name} = x{med:.3f} over {plural(len(ratios), 'round')}: no interval below 3 "
                f"rounds, so 'slower' is not excluded")
        not_slower = None
    elif hi <= 1.0:
        text = (f"{ours_name} / {theirs_name} = x{med:.3f} [{lo:.3f}, {hi:.3f}]: NOT SLOWER than PyTorch DDP "
                f"(the 95% interval lies at or below 1.0{'; faster' if hi < 1.0 else ''})")
        not_slower = True
    else:
        text = (f"{ours_name} / {theirs_name} = x{med:.3f} [{lo:.3f}, {hi:.3f}]: "
                + ("SLOWER than PyTorch DDP (the 95% interval lies above 1.0)" if lo > 1.0 else
                   "'slower' not excluded (the 95% interval reaches above 1.0)"))
        not_slower = False
    return {"ours": ours_name, "theirs": theirs_name, "ratio": med, "ci": [lo, hi], "rounds": len(ratios),
            "not_slower": not_slower, "text": text}


# --- Launching ------------------------------------------------------------------------------------------


def run_logged(cmd, log_path, timeout_s, our_bin, net):
    """Runs one launch with its output in log_path. Returns (exit code, seconds). On a timeout the launcher
    gets SIGTERM first, so it stops its ranks and removes its network namespaces itself; SIGKILL only if it
    does not stop, followed by `ddp_launch --net-cleanup` for what it could not remove."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            rc = proc.wait(timeout=timeout_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                if net != "none":
                    subprocess.run([os.path.join(our_bin, "ddp_launch"), "--net-cleanup"], stdout=log,
                                   stderr=subprocess.STDOUT)
            if isinstance(e, KeyboardInterrupt):
                raise
            log.write(f"\ncompare_torch_ddp: stopped after --timeout {timeout_s} s\n")
            rc = 124
    return rc, time.monotonic() - t0


def tail(path, n=30):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def probe(cmd):
    """stdout of a short command, or None if it cannot run."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def leftover_namespaces():
    """Network namespaces our launcher would have made (dpnet<pid>-...) that are still there."""
    out = probe(["ip", "netns", "list"]) or ""
    return [line.split()[0] for line in out.splitlines() if line.startswith("dpnet")]


# --- Reading each side's JSON ---------------------------------------------------------------------------


def our_rows(doc, cap):
    """(baseline row, {variant: row} of the stage 05 rows, primary variant) from stage05's JSON. Rows are
    found by name, so a binary that also times stages 02-04 (no --variants) works the same."""
    rows = doc["rows"]
    base = next((r for r in rows if r["variant"] == "no communication"), None)
    bucketed = {r["variant"]: r for r in rows if r["variant"].startswith("bucketed")}
    if base is None or not bucketed:
        raise ValueError("no 'no communication' row or no 'bucketed ...' row in our JSON: " +
                         ", ".join(r["variant"] for r in rows))
    hook = doc.get("comm_hook", "allreduce")
    plain = f"bucketed {cap:g} MB{'' if hook == 'allreduce' else ', ' + hook + ' hook'} (stage 05)"
    primary = plain if plain in bucketed else next(iter(bucketed))
    return base, bucketed, primary


def lower_bound(base):
    """forward + max(backward, one flat all-reduce) + optimizer, from the no-communication row's medians."""
    comm = base["flat_allreduce_s"]
    return {"forward_s": base["forward_s"], "backward_s": base["backward_s"], "optimizer_s": base["optimizer_s"],
            "comm_s": comm, "bound_s": base["forward_s"] + max(base["backward_s"], comm) + base["optimizer_s"]}


# --- Machine ------------------------------------------------------------------------------------------


def machine_info():
    info = {"platform": platform.platform(), "cpus": os.cpu_count(), "driver_python": sys.version.split()[0]}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), None)
        with open("/proc/meminfo") as f:
            kb = int(next(l for l in f if l.startswith("MemTotal")).split()[1])
            info["memory_gib"] = round(kb / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return info


# --- Main ---------------------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny",
                    help="Transformer size: " + ", ".join(dplib.PRESETS) + " (default tiny)")
    ap.add_argument("--world", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--net", default="1gbit", help="none (loopback), 1gbit or 10gbit: ddp_launch --net (root)")
    ap.add_argument("--rounds", type=int, default=5, help="launches of each side (default 5; 3+ for intervals)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per launch (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per launch (default 2)")
    ap.add_argument("--batch", type=int, default=4, help="global batch (default 4, as ours)")
    ap.add_argument("--context", type=int, default=128, help="tokens per sequence (default 128)")
    ap.add_argument("--cap", type=float, default=25.0,
                    help="bucket cap in MiB for both sides (default 25, PyTorch's default; PyTorch reads MiB, "
                         "ours MB = 10^6 B, so ours is given cap x 1.048576: the same bytes)")
    ap.add_argument("--more-caps", default="",
                    help="more caps for ours only, in MB, comma-separated (e.g. 1): extra rows in the fp32 launch")
    ap.add_argument("--fp16", action="store_true", help="also both sides with an fp16 communication hook")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="the Python whose PyTorch runs the peer (default /usr/bin/python3, Debian's 1.13; "
                         "build-venv/torch2/bin/python for 2.x)")
    ap.add_argument("--our-bin", default=os.path.join(ROOT, "build", "bin"),
                    help="folder with ddp_launch and ext05d_feature_bench (default build/bin; build-torch2/bin for 2.x)")
    ap.add_argument("--our-extra", default="",
                    help="more options for ext05d_feature_bench, given with '=': --our-extra='--overlap-optimizer both'")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one launch may take (default 1800)")
    ap.add_argument("--json", metavar="OUT", help="write every sample and the summary rows here")
    ap.add_argument("--keep-tmp", action="store_true", help="keep each launch's JSON and log (kept anyway on failure)")
    a = ap.parse_args(argv)
    dplib.check_preset_args(ap, a, ("world", "rounds", "steps", "batch", "context"))
    if a.net not in NETS:
        ap.error(f"unknown --net '{a.net}'; use one of: {', '.join(NETS)}")
    if a.warmup < 0 or a.cap <= 0 or a.timeout <= 0:
        ap.error("--warmup must be 0 or more; --cap and --timeout must be positive")
    if a.batch % a.world:
        ap.error(f"--batch {a.batch} cannot be split evenly over {a.world} ranks; use a multiple of {a.world}")
    a.our_bin = os.path.abspath(a.our_bin)
    for prog in ("ddp_launch", OURS):
        if not os.access(os.path.join(a.our_bin, prog), os.X_OK):
            ap.error(f"--our-bin {a.our_bin}: no executable {prog} there (build first, or point at a folder with it)")
    py = shutil.which(a.python) or (a.python if os.access(a.python, os.X_OK) else None)
    if py is None:
        ap.error(f"--python {a.python}: not an executable")
    a.python = os.path.abspath(py) if os.sep in py else py
    if a.net != "none" and os.geteuid() != 0:
        ap.error(f"--net {a.net} needs root (network namespaces); run as root or use --net none")
    if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        ap.error(f"--json {a.json}: its folder does not exist")
    return a


def main(argv):
    a = parse_args(argv)
    command = " ".join(shlex.quote(c) for c in [sys.executable, os.path.relpath(__file__, ROOT)] + argv)

    # What each side is: ours' LibTorch comes with its JSON ("machine"), theirs' from the peer's Python.
    theirs_version = (probe([a.python, "-c", "import torch; print(torch.__version__)"]) or "").strip()
    if not theirs_version:
        print(f"error: --python {a.python} cannot import torch", file=sys.stderr)
        return 2

    tmp = tempfile.mkdtemp(prefix="compare_torch_ddp.")
    launch = [os.path.join(a.our_bin, "ddp_launch"), "--nproc", str(a.world)] + \
             ([] if a.net == "none" else ["--net", a.net]) + ["--"]
    common = ["--preset", a.preset, "--batch", str(a.batch), "--context", str(a.context),
              "--warmup", str(a.warmup), "--steps", str(a.steps)]

    our_cap = a.cap * 2**20 / 1e6  # MiB -> MB: the same bucket bytes as PyTorch's bucket_cap_mb

    def ours_cmd(hook, out):
        return launch + [os.path.join(a.our_bin, OURS), "--bench"] + common + \
               ["--caps", ",".join([f"{our_cap:g}"] + ([c for c in a.more_caps.split(",") if c] if hook == "allreduce" else []))] + \
               (["--comm-hook", hook] if hook != "allreduce" else []) + \
               (shlex.split(a.our_extra) if hook == "allreduce" else []) + ["--json", out]  # extras: fp32 launch only

    def theirs_cmd(hook, out):
        return launch + [a.python, PEER] + common + ["--bucket-cap-mb", f"{a.cap:g}", "--comm-hook", hook,
                                                     "--json", out]

    # (side, ours' hook name / PyTorch's hook name) in the order of an odd round; even rounds reverse each pair.
    pairs = [(("ours", "allreduce"), ("theirs", "none"))]
    if a.fp16:
        pairs.append((("ours", "fp16"), ("theirs", "fp16")))

    print(f"comparing {OURS} ({a.our_bin}) with PyTorch {theirs_version} DDP ({a.python}): "
          f"{a.preset}, {a.world} ranks, {'loopback' if a.net == 'none' else a.net + ' link per rank'}, "
          f"batch {a.batch}, context {a.context}, {plural(a.rounds, 'round')} of {a.warmup} + {a.steps} steps, "
          f"cap {a.cap:g}{', fp16 hooks too' if a.fp16 else ''}; logs in {tmp}", flush=True)

    rounds = []
    for r in range(1, a.rounds + 1):
        rec = {"round": r, "launches": []}
        for pair in pairs:
            for side, hook in (pair if r % 2 else reversed(pair)):
                name = f"r{r}_{side}_{hook}"
                out, log = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".log")
                cmd = ours_cmd(hook, out) if side == "ours" else theirs_cmd(hook, out)
                rc, secs = run_logged(cmd, log, a.timeout, a.our_bin, a.net)
                if rc != 0 or not os.path.exists(out):
                    print(f"error: round {r}, {side} ({hook}) exited with code {rc}; last lines of {log}:\n"
                          f"{tail(log)}", file=sys.stderr)
                    print(f"logs and JSON kept in {tmp}", file=sys.stderr)
                    return 1
                with open(out) as f:
                    doc = json.load(f)
                rec["launches"].append({"side": side, "hook": hook, "command": " ".join(shlex.quote(c) for c in cmd),
                                        "seconds": secs, "json": doc})
                if side == "ours":
                    base, bucketed, primary = our_rows(doc, our_cap)
                    lb = lower_bound(base)
                    print(f"round {r}/{a.rounds} ours   ({hook}): {primary} {bucketed[primary]['step_s']:.3f} s; "
                          f"no communication {base['step_s']:.3f} s, flat all-reduce {lb['comm_s']:.3f} s, "
                          f"bound {lb['bound_s']:.3f} s  [{secs:.0f} s]", flush=True)
                else:
                    print(f"round {r}/{a.rounds} theirs ({hook}): PyTorch DDP {doc['median']:.3f} s  [{secs:.0f} s]",
                          flush=True)
        rounds.append(rec)

    leftovers = leftover_namespaces() if a.net != "none" else []
    if leftovers:
        print(f"warning: network namespaces left behind: {', '.join(leftovers)} "
              f"(remove them with {os.path.join(a.our_bin, 'ddp_launch')} --net-cleanup)", file=sys.stderr)

    # --- Per-round samples of every row ---
    series = {}  # row name -> {"side", "hook", "round_medians", "samples", "forward", "backward", "optimizer"}

    def add(name, side, hook, med, samples, fwd=None, bwd=None, opt=None):
        s = series.setdefault(name, {"side": side, "hook": hook, "round_medians": [], "samples": [],
                                     "forward": [], "backward": [], "optimizer": []})
        s["round_medians"].append(med), s["samples"].append(samples)
        for key, v in (("forward", fwd), ("backward", bwd), ("optimizer", opt)):
            if v is not None:
                s[key].append(v)

    bounds, primary_name, primary_fp16, ours_libtorch, ours_machine = [], None, None, None, None
    for rec in rounds:
        for l in rec["launches"]:
            doc = l["json"]
            if l["side"] == "ours":
                base, bucketed, primary = our_rows(doc, our_cap)
                ours_machine = doc.get("machine", "")
                m = re.search(r"LibTorch ([0-9][^\s,]*)", ours_machine)
                ours_libtorch = m.group(1) if m else None
                if l["hook"] == "allreduce":
                    primary_name = "ours: " + primary
                    bounds.append(lower_bound(base))  # fp32 communication: the bound of the default runs
                    add("ours: no communication (compute only)", "ours", "-", base["step_s"],
                        base["step_samples_s"], base["forward_s"], base["backward_s"], base["optimizer_s"])
                else:
                    primary_fp16 = "ours: " + primary
                for v, row in bucketed.items():
                    add("ours: " + v, "ours", l["hook"], row["step_s"], row["step_samples_s"], row["forward_s"],
                        row["backward_s"], row["optimizer_s"])
            else:
                name = PYTORCH_ROW + ("" if l["hook"] == "none" else ", fp16 hook")
                add(name, "pytorch", l["hook"], doc["median"], doc["step_s"], doc.get("forward_s"),
                    doc.get("backward_s"), doc.get("optimizer_s"))
    bound_s = [b["bound_s"] for b in bounds]
    series["lower bound: forward + max(backward, flat all-reduce) + optimizer"] = {
        "side": "bound", "hook": "allreduce", "round_medians": bound_s, "samples": [[b] for b in bound_s],
        "forward": [b["forward_s"] for b in bounds], "backward": [b["backward_s"] for b in bounds],
        "optimizer": [b["optimizer_s"] for b in bounds]}
    theirs_default = series[PYTORCH_ROW]["round_medians"]

    rows = []
    for name, s in series.items():
        med = s["round_medians"]
        vs_pt = [x / y for x, y in zip(med, theirs_default)]
        vs_lb = [x / y for x, y in zip(med, bound_s)]
        step, rp, rl = dplib.median_ci(med), dplib.median_ci(vs_pt), dplib.median_ci(vs_lb)
        rows.append({
            "variant": name, "side": s["side"], "hook": s["hook"],
            "step_s": step[0], "step_ci": [step[1], step[2]],
            "ratio_to_pytorch_ddp": rp[0], "ratio_to_pytorch_ddp_ci": [rp[1], rp[2]],
            "ratio_to_lower_bound": rl[0], "ratio_to_lower_bound_ci": [rl[1], rl[2]],
            "forward_s": statistics.median(s["forward"]) if s["forward"] else None,
            "backward_s": statistics.median(s["backward"]) if s["backward"] else None,
            "optimizer_s": statistics.median(s["optimizer"]) if s["optimizer"] else None,
            "round_medians_s": med, "ratio_to_pytorch_ddp_samples": vs_pt, "ratio_to_lower_bound_samples": vs_lb,
            "step_samples_s": s["samples"],
        })

    main_verdict = verdict(primary_name, series[primary_name]["round_medians"], PYTORCH_ROW, theirs_default)
    fp16_verdict = verdict(primary_fp16, series[primary_fp16]["round_medians"], PYTORCH_ROW + ", fp16 hook",
                           series[PYTORCH_ROW + ", fp16 hook"]["round_medians"]) if a.fp16 else None
    ours_only = [r for r in rows if r["side"] == "ours" and not r["variant"].startswith("ours: no communication")]
    best = min(ours_only, key=lambda r: r["step_s"])
    fwd_check = dplib.median_ci([x / y for x, y in zip(series[primary_name]["forward"], series[PYTORCH_ROW]["forward"])])

    # --- Table ---
    w = max(len(r["variant"]) for r in rows)
    print(f"\n{'variant':<{w}}  {'step (s) [95% CI]':<24}  {'x PyTorch DDP [95% CI]':<24}  x lower bound [95% CI]")
    for r in rows:
        print(f"{r['variant']:<{w}}  {fmt_ci((r['step_s'], *r['step_ci'])):<24}  "
              f"{fmt_ci((r['ratio_to_pytorch_ddp'], *r['ratio_to_pytorch_ddp_ci'])):<24}  "
              f"{fmt_ci((r['ratio_to_lower_bound'], *r['ratio_to_lower_bound_ci']))}")
    lb = {k: statistics.median(b[k] for b in bounds) for k in bounds[0]}
    print(f"\nlower bound (medians over rounds): forward {lb['forward_s']:.3f} + max(backward {lb['backward_s']:.3f}, "
          f"flat all-reduce {lb['comm_s']:.3f}) + optimizer {lb['optimizer_s']:.3f} = {lb['bound_s']:.3f} s "
          f"(ours' no-communication row and flat all-reduce, fp32)")
    print(f"forward pass, ours / PyTorch (same model, no communication in either): x{fmt_ci(fwd_check)}")
    best_lb = fmt_ci((best["ratio_to_lower_bound"], *best["ratio_to_lower_bound_ci"]))
    print(f"our best row: {best['variant']}, x{best_lb} of the lower bound")
    print(f"ours: LibTorch {ours_libtorch}; theirs: PyTorch {theirs_version}; {plural(a.rounds, 'round')}; "
          f"{ours_machine}")
    if fp16_verdict:
        print("fp16 hooks: " + fp16_verdict["text"])
    print("verdict: " + main_verdict["text"], flush=True)

    if a.json:
        doc = {
            "benchmark": "compare_torch_ddp", "command": command, "machine": machine_info(),
            "ours": {"bin": a.our_bin, "program": OURS, "libtorch": ours_libtorch, "machine": ours_machine},
            "theirs": {"python": a.python, "torch_version": theirs_version},
            "config": {"preset": a.preset, "world": a.world, "net": a.net, "rounds": a.rounds, "steps": a.steps,
                       "warmup": a.warmup, "global_batch": a.batch, "context": a.context, "cap": a.cap,
                       "cap_units": {"ours": "MB (10^6 B)", "pytorch": "MiB (2^20 B)"}, "fp16": a.fp16,
                       "our_extra": a.our_extra},
            "statistics": "per round: median of the timed steps (slowest rank per step); over rounds: median and "
                          "95% percentile bootstrap of the median (9999 resamples, seed 0), none below 3 rounds",
            "rows": rows,
            "lower_bound": {"per_round": bounds, "median": lb},
            "best_ours": {"variant": best["variant"], "ratio_to_lower_bound": best["ratio_to_lower_bound"],
                          "ratio_to_lower_bound_ci": best["ratio_to_lower_bound_ci"]},
            "forward_ratio_ours_to_pytorch": {"ratio": fwd_check[0], "ci": [fwd_check[1], fwd_check[2]]},
            "verdict": main_verdict, "verdict_fp16": fp16_verdict,
            "netns_left_behind": leftovers,
            "rounds": rounds,
        }
        tmp_out = a.json + ".tmp"
        with open(tmp_out, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp_out, a.json)
        print(f"wrote {a.json}")
    if not a.keep_tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
