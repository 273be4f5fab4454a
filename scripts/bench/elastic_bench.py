#!/usr/bin/env python3
"""Stage 09 measured: a rank killed mid-run, survived in memory (stage 09) or restarted from a checkpoint
(stage 08), against the uninterrupted run; over loopback and a simulated 1 Gbit/s link.

    python3 scripts/bench/elastic_bench.py [--out docs/results/elastic.json] [--links loopback,1gbit]

Per link, three runs of the same training (tiny Transformer, 3 ranks, global batch 12 x 64 bytes, 60 steps;
stage 09's defaults, which stage 08 is given too):
  uninterrupted  stage 09, nothing fails
  elastic        stage 09, rank 1 killed (SIGKILL, DP_FAULT=die@1:step20) as step 21 begins; the survivors redo
                 step 21 on 2 ranks; a replacement starts 3 s later (--max-restarts 1 --restart-delay 3) and joins
                 at the next step boundary (at step 29-34 of 60 on 2 cores). Loopback only: --trace, the timeline
                 the page draws.
  restart        stage 08 with a checkpoint every 10 steps; rank 1 killed (SIGKILL, by this script) right after
                 rank 0 prints step 24; ddp_launch stops the others; the same command with --resume starts again
                 from the step-20 checkpoint and redoes steps 21-24.
  fallback       stage 09 with a checkpoint every 10 steps; every rank killed as step 36 begins (DP_FAULT), three
                 replacements (--max-restarts 3) find nobody holding the state, load the step-30 checkpoint and
                 redo steps 31-35. Loopback only: --trace, the second timeline the page draws.
What each row says: from the failure to the first step that had not been done before it, done again
("failure -> next new step"), and the parts of it: for stage 09 the failure seen by the survivors, the
round, the new group, the heal and the redone step; for stage 08 the restart (from the kill to the resumed
run's first step) and the steps lost since the checkpoint. The loss curves are compared with the
uninterrupted run's step by step. --net needs root and iproute2; without them only loopback runs.
About 6 minutes on 2 cores.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402

ROOT = str(dplib.ROOT)
B = os.path.join("build", "bin")
L = os.path.join(B, "ddp_launch")
COMMON = ["--steps", "60"]            # stage 09's defaults: tiny, context 64, batch 12, warm-up 10, lr 2e-3
STAGE08 = ["--context", "64", "--batch", "12", "--warmup", "10", "--eval-every", "60", "--sample", "0"]
KILL_STEP = 20                        # elastic: DP_FAULT before step KILL_STEP + 1
RESTART_DELAY_S = 3                   # elastic: the replacement starts this long after the kill
RESTART_KILL_AFTER = 24               # stage 08: killed once step 24 is done (rank 0 prints every 3rd step)
FALLBACK_KILL_STEP = 35               # fallback: every rank dies before step FALLBACK_KILL_STEP + 1


def launch_cmd(link, extra_launcher, program, args):
    net = ["--net", link] if link != "loopback" else []
    return [L, *net, *extra_launcher, "--", os.path.join(B, program), *args]


def run(cmd, env=None, log=None):
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=900)
    if log:
        open(log, "w").write(" ".join(cmd) + "\n" + r.stdout)
    if r.returncode != 0:
        print(r.stdout[-3000:])
        raise SystemExit(f"elastic_bench: {' '.join(cmd)} exited {r.returncode}")
    return r.stdout, time.time() - t0


def losses(path):
    return [x[1] for x in dplib.load_json(path)["train"]]


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")


def rank_pid(needle, rank):
    """The process of rank `rank` whose command line contains `needle` (a path unique to this run)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if needle in cmd and "stage08_train_lm" in cmd and f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def restart_run(link, work):
    """Stage 08 killed after step RESTART_KILL_AFTER, resumed from its last checkpoint; the timings."""
    ck, curve = os.path.join(work, f"restart_{link}.ckpt"), os.path.join(work, f"restart_{link}.json")
    args = [*COMMON, *STAGE08, "--checkpoint", ck, "--checkpoint-every", "10"]
    cmd = launch_cmd(link, ["--nproc", "3"], "stage08_train_lm", args)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t_kill = None
    for line in p.stdout:
        if re.search(rf"step\s+{RESTART_KILL_AFTER}/60", line):
            pid = rank_pid(ck, 1)
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            break
    p.stdout.read()
    rc = p.wait()
    if t_kill is None or rc != 137:
        raise SystemExit(f"elastic_bench: the stage 08 run to kill did not reach step {RESTART_KILL_AFTER} (exit {rc})")
    resumed = launch_cmd(link, ["--nproc", "3"], "stage08_train_lm", [*args, "--resume", "--curve", curve])
    q = subprocess.Popen(resumed, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t_first, start = None, None
    for line in q.stdout:
        m = re.search(r"resumed from .* at step (\d+)", line)
        if m:
            start = int(m.group(1))
        if start is not None and t_first is None and re.search(rf"step\s+{start + 1}/60", line):
            t_first = time.time()
    if q.wait() != 0 or t_first is None:
        raise SystemExit("elastic_bench: the resumed stage 08 run failed")
    steps = {int(x[0]): x[2] for x in dplib.load_json(curve)["train"]}
    # From the kill to the resumed run's first step done, less that step: the restart itself. The steps after
    # it (durations from the curve) bring the run back past the step in flight at the kill.
    back = t_first + sum(steps[s] for s in range(start + 1, RESTART_KILL_AFTER + 1))
    return {"restart_s": t_first - steps[start] - t_kill, "lost_steps": RESTART_KILL_AFTER - start,
            "recovery_s": back - t_kill, "failed_step": RESTART_KILL_AFTER + 1,
            "command": " ".join(cmd) + "  (rank 1 killed after step 24), then with --resume"}, curve


def fallback_run(work, trace):
    """Stage 09, every rank killed at once; the replacements fall back to the checkpoint. The parts of the recovery
    from the run's --trace (one clock for every process): the kill, the new processes' round, their group (the
    checkpoint read included), the state check, and the steps redone until the first new step is done."""
    path, ck = os.path.join(work, "fallback_loopback.json"), os.path.join(work, "fallback_loopback.ckpt")
    cmd = launch_cmd("loopback", ["--elastic", "--nproc", "3", "--max-restarts", "3"], "stage09_elastic",
                     [*COMMON, "--checkpoint", ck, "--checkpoint-every", "10", "--curve", path, "--trace", trace])
    fault = ",".join(f"die@{r}:step{FALLBACK_KILL_STEP}" for r in range(3))
    run(cmd, env=dict(os.environ, DP_FAULT=fault), log=path + ".log")
    c = dplib.load_json(path)
    fb = next(e for e in c["events"] if "redone" in e)
    ev = dplib.trace_events(trace)
    t_kill = min(e["ts"] for e in ev if e["ph"] == "i" and e["name"].startswith("DP_FAULT")) / 1e6
    rnd = [e for e in ev if e["ph"] == "X" and e["name"] == f"round {fb['round']}"]
    t_round = min(e["ts"] for e in rnd) / 1e6
    t_new = max(e["ts"] + e["dur"] for e in ev if e["ph"] == "X" and e["name"] == f"step {FALLBACK_KILL_STEP + 1}") / 1e6
    return {"scenario": f"fallback (stage 09): every rank killed at step {FALLBACK_KILL_STEP + 1}, the replacements "
            f"load the step-{fb['step']} checkpoint", "link": "loopback",
            "ranks": " -> ".join(str(e["ranks"]) for e in c["events"]), "failed_step": FALLBACK_KILL_STEP + 1,
            "restart_s": t_round - t_kill, "round_s": fb["quorum_s"], "group_s": fb["group_s"], "heal_s": fb["heal_s"],
            "lost_steps": fb["redone"], "recovery_s": t_new - t_kill, "command": f"DP_FAULT={fault} " + " ".join(cmd)}, path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join("docs", "results", "elastic.json"))
    ap.add_argument("--links", default="loopback,1gbit")
    o = ap.parse_args()
    os.chdir(ROOT)
    links = o.links.split(",")
    if "1gbit" in links and (os.geteuid() != 0 or not shutil.which("tc")):
        print("elastic_bench: no --net runs (they need root and iproute2); loopback only")
        links = [l for l in links if l == "loopback"]
    work = os.path.join("build", "elastic_bench")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    trace = os.path.join("docs", "results", "elastic_timeline.trace.json")
    fallback_trace = os.path.join("docs", "results", "elastic_fallback.trace.json")
    rows = []
    for link in links:
        ref_path = os.path.join(work, f"uninterrupted_{link}.json")
        cmd = launch_cmd(link, ["--elastic", "--nproc", "3"], "stage09_elastic", [*COMMON, "--curve", ref_path])
        run(cmd, log=ref_path + ".log")
        ref = losses(ref_path)
        rows.append({"scenario": "uninterrupted (stage 09)", "link": link, "ranks": "3", "final_loss": ref[-1],
                     "train": ref, "command": " ".join(cmd)})
        print(f"{link}: uninterrupted, loss {ref[0]:.3f} -> {ref[-1]:.4f}")

        path = os.path.join(work, f"elastic_{link}.json")
        args = [*COMMON, "--curve", path] + (["--trace", trace] if link == "loopback" else [])
        cmd = launch_cmd(link, ["--elastic", "--nproc", "3", "--max-restarts", "1", "--restart-delay",
                                    str(RESTART_DELAY_S)],
                         "stage09_elastic", args)
        env = dict(os.environ, DP_FAULT=f"die@1:step{KILL_STEP}")
        run(cmd, env=env, log=path + ".log")
        c = dplib.load_json(path)
        fail = next(e for e in c["events"] if "recovery_s" in e)
        join = next((e for e in c["events"] if e["why"] == "a newcomer waits"), None)
        if join is None:  # the run ended before the replacement got in: this row would measure nothing
            raise SystemExit(f"elastic_bench: {link}: the replacement did not join before step {len(c['train'])} "
                             f"(it starts {RESTART_DELAY_S} s after the kill): lower RESTART_DELAY_S; log {path}.log")
        got = losses(path)
        rows.append({"scenario": f"elastic (stage 09): rank 1 killed at step {KILL_STEP + 1}, replaced",
                     "link": link, "ranks": " -> ".join(str(e["ranks"]) for e in c["events"]),
                     "failed_step": KILL_STEP + 1, "seen_s": fail["seen_s"], "round_s": fail["quorum_s"],
                     "group_s": fail["group_s"], "heal_s": fail["heal_s"], "redone_step_s": fail["redone_step_s"],
                     "recovery_s": fail["recovery_s"], "lost_steps": 0, "joined_at_step": join["step"] + 1,
                     "join_heal_MB": join["heal_bytes"] / 1e6, "join_s": join["quorum_s"] + join["group_s"] + join["heal_s"],
                     "final_loss": got[-1], "max_diff": max_diff(ref, got), "train": got, "events": c["events"],
                     "command": "DP_FAULT=die@1:step20 " + " ".join(cmd)})
        print(f"{link}: elastic, failure -> step {KILL_STEP + 1} done in {fail['recovery_s']:.2f} s, joined at step "
              f"{join['step'] + 1}, max |diff| {rows[-1]['max_diff']:.2e}")

        r, path = restart_run(link, work)
        got = losses(path)  # the checkpoint carried the curve of steps 1-20
        machine = dplib.load_json(path)["machine"]  # the programs' own description (CPU, cores, RAM, LibTorch)
        rows.append({"scenario": f"restart (stage 08): rank 1 killed at step {RESTART_KILL_AFTER + 1}, resumed from "
                     f"the step-20 checkpoint", "link": link, "ranks": "3, then 3", **r, "final_loss": got[-1],
                     "max_diff": max_diff(ref, got), "train": got})
        print(f"{link}: restart, failure -> step {RESTART_KILL_AFTER + 1} done in {r['recovery_s']:.2f} s "
              f"(restart {r['restart_s']:.2f} s, {r['lost_steps']} steps lost)")
        if link == "loopback":
            r, path = fallback_run(work, fallback_trace)
            got = losses(path)
            rows.append({**r, "final_loss": got[-1], "max_diff": max_diff(ref, got), "train": got})
            print(f"{link}: fallback, failure -> step {r['failed_step']} done in {r['recovery_s']:.2f} s "
                  f"({r['lost_steps']} steps redone), max |diff| {rows[-1]['max_diff']:.2e}")
    doc = {"benchmark": "elastic: a rank killed, survived in memory (stage 09) or restarted from a checkpoint "
                        "(stage 08)", "machine": machine, "command": rows[0]["command"], "trace": os.path.basename(trace),
           "trace_fallback": os.path.basename(fallback_trace),
           "rows": rows}
    with open(o.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {o.out}")


if __name__ == "__main__":
    main()
