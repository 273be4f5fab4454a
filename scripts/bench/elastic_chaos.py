#!/usr/bin/env python3
"""Stage 09 under many failures: how long recovery takes, and whether random kill -9s ever end a run.

    python3 scripts/bench/elastic_chaos.py recovery [--runs 3] [--out docs/results/elastic_recovery.json]
    python3 scripts/bench/elastic_chaos.py chaos [--runs 10] [--kills 6] [--seed 1] [--out docs/results/elastic_chaos.json]

recovery: RUNS runs of stage 09's defaults (tiny Transformer, 3 ranks, global batch 12 x 64 bytes, 60 steps), each
with a rank killed (DP_FAULT=die@*:stepK: whichever process reaches step boundary K first, SIGKILL) at every 6th
step boundary and replaced (--max-restarts 9). Recovery is what the stage measures: from the failure (the fault's
own time, stored by the dying process) to the end of the redone step. Prints and records its median and p95
beside the median step time of the same runs (3 ranks), and the parts of each recovery (failure seen, round,
group, state check, redone step).

chaos: RUNS runs in which this script kills (SIGKILL) a random live process of the run at random moments (every
0.3-2.5 s, KILLS times, whatever the process is doing: a step, a round, a heal, a checkpoint write), and one time
in four every live process at once, with --checkpoint-every 5, --max-restarts 3 x KILLS, --restart-delay 0.5. Every run must exit 0, train every step, end
with the uninterrupted run's curve (each loss within TOL, tests/elastic.py's) and leave no process behind. Reports
per run the kills, the fallbacks to the checkpoint and the steps they redid.

Exit 0: every run passed (chaos) or the recovery goal held (p95 <= median step + 0.5 s); 1 otherwise.
"""
import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402

ROOT = str(dplib.ROOT)
LAUNCH = os.path.join("build", "bin", "ddp_launch")  # relative: the commands the pages print (run from ROOT)
PROG = os.path.join("build", "bin", "stage09_elastic")
STEPS = 60
TOL = 1e-4  # tests/elastic.py's: the same global batch over other memberships sums in another order
GOAL_S = 0.5  # issue 82: p95 recovery <= the step time + 0.5 s


def quantile(xs, q):
    """The q-quantile by linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    i = q * (len(s) - 1)
    lo = int(i)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (i - lo)


def launch(work, name, launcher_args, args, env=None):
    curve = os.path.join(work, name + ".json")
    cmd = [LAUNCH, "--elastic", "--nproc", "3", *launcher_args, "--", PROG, "--steps", str(STEPS), "--curve", curve,
           *args]
    return cmd, curve


def losses(path):
    return [x[1] for x in json.load(open(path))["train"]]


def processes_of(needle):
    """Live stage 09 processes whose command line contains `needle` (this run's curve path)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmd and "stage09_elastic" in cmd and "ddp_launch" not in cmd and state not in "ZX":
            out.append(int(pid))
    return out


def recovery(o, work):
    kills = ",".join(f"die@*:step{k}" for k in range(8, STEPS - 1, 6))
    rec, steps, parts, commands = [], [], [], []
    for i in range(o.runs):
        cmd, curve = launch(work, f"recovery{i}", ["--max-restarts", "9"], [])
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                           env=dict(os.environ, DP_FAULT=kills))
        open(curve + ".log", "w").write(r.stdout)
        if r.returncode != 0:
            print(r.stdout[-3000:])
            raise SystemExit(f"elastic_chaos: recovery run {i} exited {r.returncode}")
        c = json.load(open(curve))
        steps += [x[2] for x in c["train"]]
        for e in c["events"]:
            if "recovery_s" in e:
                rec.append(e["recovery_s"])
                parts.append({k: e[k] for k in ("seen_s", "quorum_s", "group_s", "heal_s", "redone_step_s")})
        commands.append(f"DP_FAULT={kills} " + " ".join(cmd))
    step = statistics.median(steps)
    med, p95 = statistics.median(rec), quantile(rec, 0.95)
    part_medians = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
    print(f"recovery over {len(rec)} failures ({o.runs} runs): median {med:.3f} s, p95 {p95:.3f} s, max "
          f"{max(rec):.3f} s; the step (median over the same runs) {step:.3f} s")
    print("  parts (medians): " + ", ".join(f"{k[:-2]} {v:.3f} s" for k, v in part_medians.items()))
    ok = p95 <= step + GOAL_S
    print(f"{'PASS' if ok else 'FAIL'} p95 {p95:.3f} s {'<=' if ok else '>'} the step + {GOAL_S} s = "
          f"{step + GOAL_S:.3f} s")
    def row(part, xs):
        return {"part": part, "median_s": statistics.median(xs), "p95_s": quantile(xs, 0.95), "max_s": max(xs),
                "samples": len(xs)}
    names = {"seen_s": "failure seen by the survivors", "quorum_s": "round", "group_s": "new group",
             "heal_s": "heal, or state check (survivors at one step)", "redone_step_s": "the redone step"}
    rows = [row("recovery: failure -> the redone step done", rec)]
    rows += [row(f"  of it: {names[k]}", [p[k] for p in parts]) for k in names]
    rows.append(row("a step, every step of the same runs", steps))
    doc = {"benchmark": "elastic_recovery: stage 09, a rank killed at every 6th step boundary and replaced",
           "failures": len(rec), "runs": o.runs, "recovery_median_s": med, "recovery_p95_s": p95,
           "recovery_max_s": max(rec), "step_median_s": step, "goal_s": step + GOAL_S, "rows": rows,
           "command": commands[0], "machine": c.get("machine", "")}
    return ok, doc


def chaos(o, work):
    rng = random.Random(o.seed)
    cmd, ref_path = launch(work, "uninterrupted", [], [])
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout[-3000:])
        raise SystemExit(f"elastic_chaos: the uninterrupted run exited {r.returncode}")
    ref = losses(ref_path)
    rows, ok = [], True
    for i in range(o.runs):
        name = f"chaos{i}"
        ckpt = os.path.join(work, name + ".ckpt")
        cmd, curve = launch(work, name, ["--max-restarts", str(3 * o.kills), "--restart-delay", "0.5"],
                            ["--checkpoint", ckpt, "--checkpoint-every", "5", "--timeout", "10s"])
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        out = []
        reader = threading.Thread(target=lambda: out.extend(p.stdout), daemon=True)
        reader.start()
        killed = 0
        time.sleep(1.5)  # the first generation forms
        while killed < o.kills and p.poll() is None:
            time.sleep(rng.uniform(0.3, 2.5))
            live = processes_of(curve)
            victims = live if rng.random() < 0.25 else live[:1] if not live else [rng.choice(live)]
            if victims and p.poll() is None:
                for pid in victims:
                    os.kill(pid, signal.SIGKILL)
                killed += 1
        # A process still there 5 s after the run passed is stuck: its threads' stacks (gdb, when installed) go to
        # RUN.stacks before the launcher stops it (30 s after the end).
        t_end = time.time() + 300
        while p.poll() is None and time.time() < t_end and not any("PASS stage 09" in x for x in out):
            time.sleep(0.2)
        time.sleep(5)
        stuck = processes_of(curve) if p.poll() is None else []
        if stuck:
            with open(curve + ".stuck", "w") as f:  # what each thread does, read from /proc (gdb would stop it)
                for pid in stuck:
                    for again in range(2):
                        for tid in sorted(os.listdir(f"/proc/{pid}/task")):
                            t = f"/proc/{pid}/task/{tid}/"
                            try:
                                st = open(t + "stat").read().rsplit(")", 1)[1].split()
                                f.write(f"{pid}/{tid} sample {again}: state {st[0]} utime {st[11]} stime {st[12]} "
                                        f"wchan {open(t + 'wchan').read()} syscall {open(t + 'syscall').read().strip()}\n")
                            except OSError as e:
                                f.write(f"{pid}/{tid}: {e}\n")
                        time.sleep(1)
                    try:
                        env = dict(x.split("=", 1) for x in open(f"/proc/{pid}/environ").read().split("\0") if "=" in x)
                        shutil.copy(env["DP_ELASTIC_STORE"], curve + ".store")
                    except (OSError, KeyError) as e:
                        f.write(f"store: {e}\n")
            print(f"  processes stuck after the run passed: /proc in {curve}.stuck, the store in {curve}.store")
        if stuck and shutil.which("gdb"):
            with open(curve + ".stacks", "w") as f:
                for pid in stuck:
                    g = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
                    f.write(f"== process {pid}\n{g.stdout}\n")
            print(f"  processes stuck after the run passed: stacks in {curve}.stacks")
        try:
            rc = p.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
        reader.join(timeout=10)
        log = "".join(out)
        open(curve + ".log", "w").write(" ".join(cmd) + "\n" + log)
        left = processes_of(curve)
        got = losses(curve) if os.path.exists(curve) else []
        d = max((abs(a - b) for a, b in zip(ref, got)), default=float("inf"))
        events = json.load(open(curve))["events"] if os.path.exists(curve) else []
        fallbacks = [e for e in events if "redone" in e]
        row = {"run": i, "exit": rc, "kill_times": killed, "steps": len(got), "max_diff": d, "left": len(left),
               "fallbacks": len(fallbacks), "redone": sum(e["redone"] for e in fallbacks),
               "sizes": " -> ".join(str(e["ranks"]) for e in events)}
        good = rc == 0 and len(got) == STEPS and d <= TOL and not left
        row["passed"] = good
        ok = ok and good
        rows.append(row)
        print(f"{'ok' if good else 'FAIL'} run {i}: exit {rc}, {killed} kill times, {len(got)} steps, max |diff| {d:.1e}, "
              f"{len(fallbacks)} fallbacks ({row['redone']} steps redone), {len(left)} left; ranks {row['sizes']}")
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    print(f"{'PASS' if ok else 'FAIL'} chaos: {sum(r['passed'] for r in rows)} of {len(rows)} runs finished "
          f"with the uninterrupted curve; {sum(r['kill_times'] for r in rows)} kill times, "
          f"{sum(r['fallbacks'] for r in rows)} fallbacks")
    return ok, {"benchmark": "elastic_chaos: stage 09 under random kill -9s", "seed": o.seed, "rows": rows,
                "runs": len(rows), "passed": sum(r["passed"] for r in rows), "command": " ".join(cmd),
                "machine": json.load(open(ref_path)).get("machine", "")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["recovery", "chaos"])
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    o = ap.parse_args()
    o.runs = o.runs or (3 if o.mode == "recovery" else 10)
    os.chdir(ROOT)
    work = os.path.join("build", "elastic_chaos")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ok, doc = recovery(o, work) if o.mode == "recovery" else chaos(o, work)
    out = o.out or os.path.join(ROOT, "docs", "results", f"elastic_{o.mode}.json")
    if out:
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
