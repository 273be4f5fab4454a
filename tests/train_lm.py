#!/usr/bin/env python3
"""End-to-end tests of the capstone (stage 08) on real text.

  train_lm.py curves LAUNCH PROGRAM WORKDIR   1, 2 and 4 ranks, DDP, ZeRO-1 and FSDP (both with
                                              --accumulate 2): the same loss curves as one process
  train_lm.py resume LAUNCH PROGRAM WORKDIR   a run killed with SIGKILL after its step-20 checkpoint
                                              and resumed continues the uninterrupted curve bit for bit
                                              (same world size) or within the tolerance (1 rank DDP
                                              with --accumulate 2, 4 ranks ZeRO-1, 2 ranks FSDP); an
                                              FSDP checkpoint resumed by DDP; a torn temporary file is
                                              ignored, a truncated checkpoint refused with exit 2
  train_lm.py lostwork LAUNCH PROGRAM WORKDIR  --checkpoint without --checkpoint-every writes the
                                              checkpoint at the end, resumed again trains nothing,
                                              with fewer --steps is refused (exit 2); a run whose loss turns non-finite
                                              (--lr 1e30) stops at that step with the hint, exit 1, and
                                              writes no checkpoint after the last finite step; a sample
                                              longer than --timeout fails no peer; a checkpoint write
                                              that never ends stops the run after 10 x --timeout
  train_lm.py clip LAUNCH PROGRAM WORKDIR     --clip-grad-norm (every step clipped): DDP at 2 ranks and FSDP at 2
                                              ranks draw one process's clipped curve and norms; unclipped differs
  train_lm.py hsdp LAUNCH PROGRAM WORKDIR [clip]   extension 10a's --sync hsdp (clip: with --clip-grad-norm)
                                              at 1 rank (1 node), 2 ranks (2 nodes x 1) and 4 (2 nodes x 2,
                                              simulated by ddp_launch --net-nodes as root, else --nodes 2):
                                              one process's curve (and norms), each log naming its mesh

Exit 0: pass; 1: fail; 77: skipped (the corpus, Debian's fortunes package, is not installed).
TOL: curves of different world sizes sum the same gradients in another order. This one bound is an
envelope, not a derivation: over 30 AdamW steps a rounding difference is fed back through the loss's
curvature, which the first-order analysis of common/measure/tolerance.hpp does not bound (the program's own check,
2 steps against one process, carries the derived bound). Measured with the "nano" model: at most 8.3e-7
(LibTorch 1.13) and 7.2e-7 (2.11) over every comparison below, a ratio of 0.008 to TOL.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

CORPUS = "/usr/share/games/fortunes"
TOL = 1e-4
# 8 sequences of 32 bytes per step (a quarter of the default's tokens) through the "nano" model (164k
# parameters; tiny has 4.3M): equal curves and bit-identical resumes do not need size. The curves still fall
# by more than 2 in 30 steps (5.72 -> 3.35), and a 30-step run takes 1.5 s at 1 rank instead of 10.
STEPS = ["--steps", "30", "--eval-every", "10", "--sample", "0", "--batch", "8", "--context", "32", "--preset", "nano"]


def run(launch, prog, n, args, log, net=()):
    cmd = [launch, "--nproc", str(n), *net, "--", prog] + args
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=240, start_new_session=True)
    out = open(log).read()
    return r.returncode, out


def curve(path):
    c = json.load(open(path))
    return [x[1] for x in c["train"]], [x[1] for x in c["val"]]


def must(ok, msg):
    print(("ok: " if ok else "FAIL: ") + msg)
    return ok


def train(launch, prog, work, name, n, extra, steps=STEPS, net=(), expect=""):
    path = os.path.join(work, name + ".json")
    rc, out = run(launch, prog, n, steps + ["--curve", path] + extra, os.path.join(work, name + ".log"), net)
    if rc != 0 or "PASS stage 08" not in out or expect not in out:
        print(out[-3000:])
        raise SystemExit(f"FAIL: {name} ({n} ranks, {' '.join(extra)}) exited {rc}" +
                         (f"; its log must say '{expect}'" if expect and expect not in out else ""))
    return curve(path)


def compare(name, a, b, tol):
    d_train = max(abs(x - y) for x, y in zip(a[0], b[0]))
    d_val = max(abs(x - y) for x, y in zip(a[1], b[1]))
    same_len = len(a[0]) == len(b[0]) and len(a[1]) == len(b[1])
    return must(same_len and d_train <= tol and d_val <= tol,
                f"{name}: {len(b[0])} train and {len(b[1])} validation losses, max |diff| {d_train:.2e} (train), "
                f"{d_val:.2e} (validation), allowed {tol:g}")


def curves(launch, prog, work):
    ref = train(launch, prog, work, "one", 1, [])
    ok = True
    for name, n, extra in [("ddp2", 2, []), ("ddp4", 4, []), ("zero1_4_acc2", 4, ["--sync", "zero1", "--accumulate", "2"]),
                           ("fsdp2_acc2", 2, ["--sync", "fsdp", "--accumulate", "2"])]:
        ok = compare(f"{name} vs one process", ref, train(launch, prog, work, name, n, extra), TOL) and ok
    ok = must(ref[0][-1] < ref[0][0] - 2, f"the loss fell from {ref[0][0]:.3f} to {ref[0][-1]:.3f} (by more than 2)") and ok
    return ok


# Clipping and HSDP (issue 79): the tiny preset for 10 steps, every step clipped (0.5 is below the norm before
# clipping at every one of these steps: 1.76 to 3.91 at 1 rank). About 2 s a run at 1 rank, 3 s at 4.
SHORT = ["--steps", "10", "--warmup", "5", "--eval-every", "5", "--sample", "0", "--batch", "8", "--context", "32",
         "--preset", "tiny"]
CLIP = ["--clip-grad-norm", "0.5"]


def norms(work, name):
    """The norm before clipping at each step, from the curve (empty without --clip-grad-norm)."""
    return [x[1] for x in json.load(open(os.path.join(work, name + ".json"))).get("grad_norm", [])]


def compare_norms(name, a, b):
    """The norms of two runs: their relative difference within TOL (the norm is a sum of P squares, not a loss)."""
    d = max((abs(x - y) / y for x, y in zip(a, b)), default=float("inf"))
    return must(len(a) == len(b) > 0 and d <= TOL, f"{name}: {len(a)} norms before clipping, max relative |diff| "
                f"{d:.2e}, allowed {TOL:g}")


def clip(launch, prog, work):
    ref = train(launch, prog, work, "clip1", 1, CLIP, SHORT)
    ref_norms = norms(work, "clip1")
    ok = must(len(ref_norms) == 10 and min(ref_norms) > 0.5,
              f"one process: the norm before clipping at each of {len(ref_norms)} steps, "
              f"{min(ref_norms, default=0):.3f} to {max(ref_norms, default=0):.3f}, all above 0.5: every step clipped")
    for name, n, extra in [("clip_ddp2", 2, []), ("clip_fsdp2_acc2", 2, ["--sync", "fsdp", "--accumulate", "2"])]:
        ok = compare(f"{name} vs one process", ref, train(launch, prog, work, name, n, CLIP + extra, SHORT), TOL) and ok
        ok = compare_norms(f"{name} vs one process", norms(work, name), ref_norms) and ok
    plain = train(launch, prog, work, "noclip1", 1, [], SHORT)
    d = max(abs(x - y) for x, y in zip(plain[0], ref[0]))
    ok = must(d > 100 * TOL, f"the clipped curve differs from the unclipped one by {d:.2e} (> 100 x {TOL:g}): "
              "clipping changes training") and ok
    return ok


def can_simulate_nodes():
    """ddp_launch --net's needs, as tests/net_or_skip.sh checks them: root with CAP_NET_ADMIN (12) and CAP_SYS_ADMIN
    (21), and iproute2's ip and tc."""
    caps = int(next((l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff:")), "0"), 16)
    return os.geteuid() == 0 and caps >> 12 & 1 and caps >> 21 & 1 and shutil.which("ip") and shutil.which("tc")


def hsdp(launch, prog, work, extra):
    """extra: [] or CLIP. Each run's log must name its mesh: the node count HSDP was given."""
    four = (["--net", "10gbit", "--net-nodes", "2", "--net-uplink", "1gbit"], []) if can_simulate_nodes() else \
        ((), ["--nodes", "2"])
    ref = train(launch, prog, work, "hsdp1", 1, ["--sync", "hsdp"] + extra, SHORT, expect="HSDP on 1 node x 1 rank")
    ok = True
    for name, n, net, more, mesh in [("hsdp2_2x1", 2, (), ["--nodes", "2"], "2 nodes x 1 rank"),
                                     ("hsdp4_2x2", 4, four[0], four[1], "2 nodes x 2 ranks")]:
        got = train(launch, prog, work, name, n, ["--sync", "hsdp"] + extra + more, SHORT, net, "HSDP on " + mesh)
        ok = compare(f"{name} ({mesh}{', simulated by --net-nodes' if net else ''}) vs one process", ref, got, TOL) \
            and ok
        if extra:
            ok = compare_norms(f"{name} vs one process", norms(work, name), norms(work, "hsdp1")) and ok
    ok = must(ref[0][-1] < ref[0][0] - 1, f"the loss fell from {ref[0][0]:.3f} to {ref[0][-1]:.3f} (by more than 1)") \
        and ok
    return ok


def checkpoint_step(path):
    """The step a checkpoint was saved at: the length of the training curve in its JSON header; -1 if none."""
    try:
        data = open(path, "rb").read().decode("latin-1")
        start = data.index('{"format"')
        header, _ = json.JSONDecoder().raw_decode(data, start)
        return len(header["meta"]["curve"]["train"])
    except (OSError, ValueError, KeyError):
        return -1


def resume(launch, prog, work):
    ck = os.path.join(work, "lm.ckpt")
    full = train(launch, prog, work, "uninterrupted", 2, ["--checkpoint", os.path.join(work, "full.ckpt"),
                                                           "--checkpoint-every", "10"])
    # The run to kill: wait for its step-20 checkpoint, then SIGKILL every process of its session.
    for f in (ck, ck + ".tmp"):
        if os.path.exists(f):
            os.remove(f)
    # The last 10 steps take about half a second: a run that ended before the kill landed (a loaded machine
    # that did not schedule this script in time) is run again, up to three times.
    log = os.path.join(work, "killed.log")
    cmd = [launch, "--nproc", "2", "--", prog] + STEPS + ["--checkpoint", ck, "--checkpoint-every", "10"]
    for attempt in range(3):
        with open(log, "w") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 180
        while time.time() < deadline and "checkpoint step 20 written" not in open(log).read():
            if p.poll() is not None:
                break
            time.sleep(0.01)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        out = open(log).read()
        # The log alone can miss the end: lines still in the launcher's pipe die with it, while the ranks went
        # on to write step 30's checkpoint (seen under CI's load). The checkpoint says which step it holds.
        saved = checkpoint_step(ck)
        if "step    30/30" not in out and saved == 20:
            break
        print(f"note: the run to kill went on past step 20 before the kill (its checkpoint holds step {saved}; "
              f"attempt {attempt + 1} of 3)")
    ok = must("checkpoint step 20 written" in out and "step    30/30" not in out and saved == 20,
              f"killed with SIGKILL after the step-20 checkpoint, before the end (its checkpoint holds step {saved})")
    shutil.copy(ck, ck + ".saved")
    # A torn write: a crash while saving leaves a partial PATH.tmp; PATH itself is the last good file.
    with open(ck + ".tmp", "wb") as f:
        f.write(b"DPLMCKPT torn")
    resumed_path = os.path.join(work, "resumed.json")
    rc, out = run(launch, prog, 2, STEPS + ["--checkpoint", ck, "--checkpoint-every", "10", "--resume",
                                            "--curve", resumed_path], os.path.join(work, "resumed.log"))
    ok = must(rc == 0 and "resumed from" in out and "at step 20" in out, f"resumed at step 20 (exit {rc})") and ok
    if rc == 0:
        got = curve(resumed_path)
        ok = must(got == full, "2 ranks -> killed -> 2 ranks: the whole curve equals the uninterrupted one bit for bit"
                  if got == full else "the resumed curve differs from the uninterrupted one") and ok
    # One rank takes the two ranks' batch in two micro-batches (--accumulate 2): what one does to resume on fewer
    # devices with the memory of each unchanged.
    for n, sync, acc in [(1, "ddp", 2), (4, "zero1", 1), (2, "fsdp", 1)]:
        shutil.copy(ck + ".saved", ck)
        path = os.path.join(work, f"resumed_{n}.json")
        rc, out = run(launch, prog, n, STEPS + ["--checkpoint", ck, "--resume", "--sync", sync, "--accumulate", str(acc),
                                                "--curve", path], os.path.join(work, f"resumed_{n}.log"))
        ok = must(rc == 0, f"resumed with {n} rank(s), --sync {sync}, --accumulate {acc} (exit {rc})") and ok
        if rc == 0:
            ok = compare(f"2 ranks -> killed -> {n} rank(s) {sync}, --accumulate {acc}, vs uninterrupted", full,
                         curve(path), TOL) and ok
    # FSDP saves too: its shards gathered whole. Train 20 steps with FSDP at 2 ranks, go on with DDP alone.
    fck = os.path.join(work, "fsdp.ckpt")
    rc, out = run(launch, prog, 2, STEPS[:1] + ["20"] + STEPS[2:] + ["--sync", "fsdp", "--checkpoint", fck,
                                                                      "--checkpoint-every", "10"],
                  os.path.join(work, "fsdp_first20.log"))
    ok = must(rc == 0 and "checkpoint step 20 written" in out, f"FSDP, 2 ranks, 20 steps, checkpointed (exit {rc})") and ok
    path = os.path.join(work, "fsdp_then_ddp.json")
    rc, out = run(launch, prog, 1, STEPS + ["--checkpoint", fck, "--resume", "--curve", path],
                  os.path.join(work, "fsdp_then_ddp.log"))
    ok = must(rc == 0, f"the FSDP checkpoint resumed by one DDP process (exit {rc})") and ok
    if rc == 0:
        ok = compare("FSDP 2 ranks -> DDP 1 rank vs uninterrupted", full, curve(path), TOL) and ok
    # A truncated checkpoint is refused with exit 2, naming the file.
    data = open(ck + ".saved", "rb").read()
    with open(ck, "wb") as f:
        f.write(data[: len(data) // 2])
    rc, out = run(launch, prog, 2, STEPS + ["--checkpoint", ck, "--resume"], os.path.join(work, "truncated.log"))
    ok = must(rc == 2 and "damaged" in out, f"a truncated checkpoint: exit {rc} (want 2), 'damaged' in the message") and ok
    return ok


def lostwork(launch, prog, work):
    ck = os.path.join(work, "lm.ckpt")
    # "nano" where size does not matter; the sample past --timeout below needs the default model's seconds.
    short = ["--steps", "3", "--warmup", "0", "--eval-every", "10", "--sample", "0", "--batch", "8", "--context", "32",
             "--preset", "nano"]
    # Asked for, written: no --checkpoint-every, yet the run ends with the checkpoint on disk.
    rc, out = run(launch, prog, 2, short + ["--checkpoint", ck], os.path.join(work, "end.log"))
    ok = must(rc == 0 and os.path.exists(ck) and f"checkpoint step 3 written to {ck}" in out,
              f"--checkpoint alone: exit {rc}, the checkpoint of step 3 written at the end")
    if not ok:
        print(out[-3000:])
        return False
    # Resumed again once finished (a requeued job): it trains nothing and passes. Resumed with fewer --steps
    # than the checkpoint holds: refused, exit 2, naming both.
    rc, out = run(launch, prog, 2, short + ["--checkpoint", ck, "--resume"], os.path.join(work, "again.log"))
    ok = must(rc == 0 and "nothing left to train" in out, f"a finished run resumed: exit {rc}, nothing left to train") and ok
    rc, out = run(launch, prog, 2, ["--steps", "2"] + short[2:] + ["--checkpoint", ck, "--resume"],
                  os.path.join(work, "past.log"))
    ok = must(rc == 2 and "is at step 3, past --steps 2" in out, f"resumed with --steps 2 < 3: exit {rc} (want 2)") and ok
    # A learning rate that blows the weights up: the loss turns inf or nan within a step or two. The run
    # stops at that step with the hint, and the checkpoint of the step before is the last one written.
    ck2 = os.path.join(work, "diverge.ckpt")
    rc, out = run(launch, prog, 2, short[:1] + ["9"] + short[2:] + ["--checkpoint", ck2, "--checkpoint-every", "1",
                                                                  "--lr", "1e30"], os.path.join(work, "diverge.log"))
    m = re.search(r"the training loss is (nan|inf|-inf) at step (\d+)", out)
    written = [int(s) for s in re.findall(r"checkpoint step (\d+) written", out)]
    ok = must(rc == 1 and m is not None and "Lower --lr" in out,
              f"--lr 1e30: exit {rc} (want 1), {'stopped at step ' + m.group(2) if m else 'no non-finite-loss message'}") and ok
    if m:
        stop = int(m.group(2))
        ok = must(os.path.exists(ck2) and max(written, default=0) == stop - 1,
                  f"checkpoints written after steps {written}, none after the loss turned {m.group(1)} at step {stop}") and ok
    # Rank 0 samples alone after the run's last collective: however long that takes (1000 bytes, several
    # seconds), no peer waits in a collective past --timeout meanwhile. (The final barrier after the sample
    # failed this: "barrier failed ... Timed out waiting 3000ms".)
    at = short.index("--sample")
    no_sample = short[:at] + short[at + 2:-2]  # the default preset: sampling 1000 bytes outlasts --timeout 3s
    rc, out = run(launch, prog, 2, no_sample + ["--sample", "1000", "--timeout", "3s"], os.path.join(work, "sample.log"))
    ok = must(rc == 0 and "PASS stage 08" in out and "sampled from the model" in out,
              f"--sample 1000 at --timeout 3s: exit {rc}, the sample and PASS") and ok
    # A checkpoint whose write never ends (its temporary file a FIFO nobody reads: a stuck disk, in small) ends
    # the run after 10 x --timeout with the reason, exit 1, rather than hanging it.
    stuck = os.path.join(work, "stuck.ckpt")
    os.mkfifo(stuck + ".tmp")
    t0 = time.monotonic()
    rc, out = run(launch, prog, 2, short + ["--checkpoint", stuck, "--timeout", "2s"], os.path.join(work, "stuck.log"))
    secs = time.monotonic() - t0
    os.remove(stuck + ".tmp")
    ok = must(rc == 1 and "for more than 10 x --timeout (20 s) and did not finish" in out and secs < 80,
              f"a checkpoint write that never ends: exit {rc} (want 1) after {secs:.0f} s, the reason said") and ok
    if not ok:
        print(out[-3000:])
    return ok


def main():
    what, launch, prog, work = sys.argv[1:5]
    if not os.path.isdir(CORPUS):
        print(f"skipped: {CORPUS} is missing (apt-get install fortunes; scripts/setup/install_deps.sh installs it)")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if what == "hsdp":
        ok = hsdp(launch, prog, work, CLIP if sys.argv[5:] == ["clip"] else [])
    else:
        ok = {"curves": curves, "resume": resume, "lostwork": lostwork, "clip": clip}[what](launch, prog, work)
    print("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
