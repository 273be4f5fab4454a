#!/usr/bin/env python3
"""Stage 09 end to end: elastic runs with failures train the uninterrupted run's loss curve.

  elastic.py SCENARIO LAUNCH PROGRAM WORKDIR [REFERENCE]

Each scenario compares with the uninterrupted run (3 ranks): REFERENCE, the curve scenario `reference`
wrote (ctest runs it first, as a fixture), or else a run of its own. It trains the same run with faults injected
(DP_FAULT, stages/09_elastic/membership.hpp), and checks: the launcher's exit code, the lines that say
what happened, the loss curve (every step's loss within TOL of the uninterrupted run's: the same global
batch, split over other memberships, sums the same gradients in another order; TOL and its measurement
are tests/train_lm.py's), that the program's own check of bit-identical replicas passed at every step,
that every failure the curve records was seen after it (at least 0.1 ms), and that no process of the run is left.

  kill      3 ranks, rank 1 killed (SIGKILL) at step 4, a replacement joins (--max-restarts 1); the survivors
            pause 5 s at step 6 so that it arrives in time
  shrink    3 ranks, rank 2 killed at step 4, no replacement: the run ends on 2
  hang      3 ranks, rank 1 stopped (SIGSTOP) at step 4: left out after --timeout 5s, killed at the end
  slow      3 ranks, rank 1 killed at step 4; survivor 2 pauses 5 s before it leaves its group, at the default
            --settle 0.5: it is in the next round all the same (it claimed its slot as it saw the failure)
  twice     4 ranks, rank 1 killed at step 3 and rank 2 at step 6: 4 -> 3 -> 2
  quorum    4 ranks, rank 1 killed at step 3 and rank 2 in the round that follows, once it claimed its slot:
            the round leaves it out (marked dead by the launcher), or its group cannot form and the next round
            goes on without it
  heal      3 ranks, rank 1 killed at step 3 and replaced; the survivors pause 5 s at step 5 so the replacement
            arrives in time; the member sending the state to the replacement is killed as it starts; replaced in
            turn (--max-restarts 2)
  late      3 ranks, rank 1 killed before the last step; the survivors train it and pause (DP_FAULT pause,
            5 s) as they end, and the replacement, 4 s after the kill, finds the run over: it says so, exit 0
  allkill   3 ranks, every one killed as step 8 begins, --max-restarts 3, a checkpoint every 3 steps: the
            replacements find nobody holding the state, load step 6's checkpoint and redo step 7
  early     as allkill, every rank killed as step 3 begins, before the first checkpoint (every 5 steps): the
            replacements start again from step 0, which the seed rebuilds
  lastholder 2 ranks, rank 1 killed at step 3 and replaced; the last holder (rank 0) killed as it starts to
            heal the newcomer: the newcomers fall back to the last checkpoint (every 2 steps; --max-restarts 2)
  ckptkill  3 ranks, a checkpoint every 3 steps; the writer killed with step 6's half written, the two others as
            they leave their group: the replacements load step 3's checkpoint (the one before stays valid)
  nocheckpoint  as allkill without --checkpoint: every replacement says the run cannot go on and names the
            remedy (exit 3); the launcher starts no more replacements (2 of its 5 restarts are never used)
  reference the uninterrupted run alone (WORKDIR/uninterrupted.json)
  minimum   2 ranks, --min-nproc 2, rank 1 killed at step 4: the run stops (exit 1, the reason), with a
            checkpoint of step 4 that one rank then resumes to the uninterrupted run's last loss

Exit 0: pass; 1: fail; 77: skipped (Debian's fortunes, the corpus, is not installed).
"""
import json
import os
import shutil
import subprocess
import sys

CORPUS = "/usr/share/games/fortunes"
TOL = 1e-4  # tests/train_lm.py's envelope for curves of different world sizes
STEPS = 10
ARGS = ["--steps", str(STEPS), "--warmup", "2", "--batch", "12", "--context", "32"]


def run(launch, prog, work, name, nproc, launcher_args=(), args=(), fault=None):
    env = dict(os.environ)
    env.pop("DP_FAULT", None)
    if fault:
        env["DP_FAULT"] = fault
    curve = os.path.join(work, name + ".json")
    if "--timeout" not in args:
        args = [*args, "--timeout", "20s"]  # a hang shows as a failure long before ctest's own limit
    cmd = [launch, "--elastic", "--nproc", str(nproc), *launcher_args, "--", prog, *ARGS, "--curve", curve, *args]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=150, env=env,
                       start_new_session=True)
    with open(os.path.join(work, name + ".log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout)
    return r.returncode, r.stdout, curve


def left_running(work):
    """Processes whose command line names this test's folder (the runs' --curve): none may be left."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if work in cmd and int(pid) != os.getpid() and "elastic.py" not in cmd:
            left.append(f"{pid}: {cmd[:120]}")
    return left


class Check:
    def __init__(self):
        self.ok = True

    def __call__(self, cond, msg):
        print(("ok: " if cond else "FAIL: ") + msg)
        self.ok = self.ok and bool(cond)
        return cond


def losses(path):
    return [x[1] for x in json.load(open(path))["train"]]


def compare(check, name, ref, path, steps=STEPS):
    if not check(os.path.exists(path), f"{name}: the curve {path} was written"):
        return
    got = losses(path)
    d = max((abs(a - b) for a, b in zip(ref, got)), default=float("inf"))
    check(len(got) == steps and d <= TOL,
          f"{name}: {len(got)} losses (want {steps}), max |diff| to the uninterrupted run {d:.2e} (allowed {TOL:g})")


def seen_after_failure(check, name, path):
    """Every failure the curve records was seen some time after it: a killed peer's death (its exit, the kernel
    closing its sockets) reaches a survivor's collective in a fraction of a millisecond or more, never at the instant
    the survivor noticed it. The mistake this guards against, the survivor taking its own time for the failure's
    (a member slow to stamp its last step had stamped it after the fault fired), reads two clocks microseconds
    apart. So at least 0.1 ms: the fastest seen honestly was 0.5 ms (a rank dying as a quorum round began, CI
    2026-12-07), which the earlier 1 ms bound failed."""
    if not os.path.exists(path):
        return
    for ev in json.load(open(path))["events"]:
        if "seen_s" in ev:
            check(ev["seen_s"] >= 1e-4, f"{name}: the failure before round {ev['round']} was seen {ev['seen_s']:.5f} s "
                                        "after it (at least 0.1 ms: the fault's own time, not the survivor's)")


# The scenarios that assert an exact sequence of world sizes ("ranks 3 -> 2") give the round 2 s to settle
# instead of the default 0.5 s. A survivor claims its slot in the next round as soon as it sees the failure ("slow"
# checks that one slow to leave its group is in), but under ctest's parallel load (three elastic runs, about ten
# processes, on two cores) one can still see it late: descheduled, or told only when a peer closes its group. The
# round would then close without it and the run say "ranks 3 -> 1 -> 2" (docs/09_elastic.md's exercise 3), which is
# correct but not the sequence asserted. "late" starts its replacement 4 s after the death: it must arrive after the
# survivors' last step boundary, about the settle time after the death, and before their 5 s pause at "over" ends.
SETTLE = ["--settle", "2"]

SCENARIOS = {
    # name: (ranks, launcher args, program args, DP_FAULT, expected exit, lines that must appear; "!line": must not)
    # The survivors pause 5 s together at step 6 (neither waits on the other) so that a replacement slow to start
    # under CI's load still joins before the last step (CI once saw it arrive after it, and no " 1.1)" line).
    "kill": (3, ["--max-restarts", "1"], [], "die@1:step4,pause@0:step6,pause@2:step6", 0,
             ["rank 1 was killed by signal 9 (SIGKILL); elastic: 2 ranks go on, and a replacement starts",
              "after a failure at step 5", " 1.1)", "ranks 3 -> "]),
    # The survivors' lines carry the launcher's tags (slots 0 and 1), never their ranks in generation 0, which
    # follow arrival order: "[rank 2/3] generation 0 failed" would read as the killed process speaking.
    "shrink": (3, [], SETTLE, "die@2:step4", 0,
               ["rank 2 was killed by signal 9 (SIGKILL); elastic: 2 ranks go on", "generation 1: 2 ranks",
                "[rank 0/3] generation 0 failed at step 5", "[rank 1/3] generation 0 failed at step 5",
                "!" + "[rank 2/3] generation 0 failed", "ranks 3 -> 2"]),
    "hang": (3, [], ["--timeout", "5s", *SETTLE], "stop@1:step4", 0,
             ["Timed out waiting 5000ms", "generation 1: 2 ranks", "rank 1 is stopped (SIGSTOP) and the run is over "
              "without it: killing it", "ranks 3 -> 2"]),
    # A survivor slow to leave its failed generation (a 5 s pause before it copies its state and closes its group)
    # is in the next round all the same, at the default settle time: it claimed its slot as it saw the failure.
    "slow": (3, [], [], "die@1:step4,pause@2:leaving", 0,
             ["DP_FAULT: pause at leaving", "generation 1: 2 ranks", "ranks 3 -> 2"]),
    "twice": (4, [], SETTLE, "die@1:step3,die@2:step6", 0,
              ["generation 1: 3 ranks", "generation 2: 2 ranks", "ranks 4 -> 3 -> 2"]),
    # The two survivors of the group that never formed each time out 5 s after they began waiting for it, which
    # under load can be more than the default 0.5 s apart: the settle time keeps both in the next round.
    "quorum": (4, [], ["--timeout", "5s", *SETTLE], "die@1:step3,die@2:quorum1", 0,
               # Its close leaves the dead claimant out when the launcher has marked it dead by then (generation 1
               # forms at once); otherwise the group waits 5 s for it and generation 2 goes on without it.
               ["die at quorum1", ("did not form within 5 s", "generation 1: 2 ranks"), "2 ranks", "PASS stage 09"]),
    "late": (3, ["--max-restarts", "1", "--restart-delay", "4"], SETTLE,
             f"die@1:step{STEPS - 1},pause@0:over,pause@2:over",
             0, [f"[rank 1/3] the run is over: its last generation trained all {STEPS} steps; nothing is left for this "
                 "process to do", "DP_FAULT: pause at over", "ranks 3 -> 2"]),
    # Every holder dies at once: the replacements fall back to the run's last checkpoint (every 3 steps: step 6).
    "allkill": (3, ["--max-restarts", "3"], ["--checkpoint-every", "3"], "die@0:step7,die@1:step7,die@2:step7", 0,
                ["restart 3 of 3", "nobody held the state", "step 6, 1 step to redo"]),
    # Every holder dies before the first checkpoint: step 0, the model as --seed builds it, is the checkpoint.
    "early": (3, ["--max-restarts", "3"], ["--checkpoint-every", "5"], "die@0:step2,die@1:step2,die@2:step2", 0,
              ["nobody held the state: no checkpoint written yet, step 0", "2 steps to redo"]),
    # The newcomer is healed by the last holder, who dies as it starts: the newcomers alone load the last checkpoint.
    # The holder pauses 5 s at step 5 should the replacement be slow to start (as "heal" below).
    "lastholder": (2, ["--max-restarts", "2"], ["--checkpoint-every", "2"], "die@1:step3,pause@0:step5,die@*:heal", 0,
                   ["die at heal", "restart 2 of 2", "nobody held the state", " to redo"]),
    # The writer dies with step 6's checkpoint half written (PATH.tmp), the others as they leave: step 3's loads.
    "ckptkill": (3, ["--max-restarts", "3"], ["--checkpoint-every", "3"],
                 "die@*:checkpoint6,die@*:leaving,die@*:leaving", 0,
                 ["die at checkpoint6", "nobody held the state", "step 3, 3 steps to redo"]),
    "nocheckpoint": (3, ["--max-restarts", "5"], [], "die@0:step7,die@1:step7,die@2:step7", 3,
                     ["this run has no checkpoint to go back to; run it with --checkpoint FILE --checkpoint-every N",
                      "the run cannot go on (the rank says why above), so no replacement starts", "!restart 4 of 5"]),
    "heal": (3, ["--max-restarts", "2"], [], "die@1:step3,pause@0:step5,pause@2:step5,die@*:heal", 0,
             # The first replacement either waits for the 2-rank generation to notice it ("a newcomer waits") or
             # arrives before that generation's round closes and is in it: either way a source dies healing it.
             # The survivors pause together 5 s at step 5 (neither waits on the other), so that a replacement slow
             # to start (it joined at step 9 of 10 on an idle machine; under CI's load once after the last step,
             # which left nobody to heal) still finds the run going.
             ["die at heal", "restart 2 of 2", ("a newcomer waits", "before this newcomer had the state")]),
}


def scenario(name, launch, prog, work, reference=None):
    check = Check()
    if reference and os.path.exists(reference):
        ref_path = reference
        print(f"ok: the uninterrupted run's curve is {reference}")
    else:
        rc, out, ref_path = run(launch, prog, work, "uninterrupted", 3)
        if not check(rc == 0 and "PASS stage 09" in out, f"the uninterrupted run passed (exit {rc})"):
            print(out[-3000:])
            return False
        if name == "reference":
            return check.ok
    ref = losses(ref_path)
    if name == "minimum":
        ck = os.path.join(work, "min.ckpt")
        rc, out, path = run(launch, prog, work, name, 2, ["--min-nproc", "2"], ["--checkpoint", ck], "die@1:step4")
        check(rc == 1, f"below --min-nproc the run stops with exit 1 (exit {rc})")
        check("1 rank left, fewer than --min-ranks 2: the run stops at step 4; checkpoint of step 4 written" in out,
              "the reason, and the checkpoint, are said")
        check(os.path.exists(ck), "the checkpoint is there")
        # A checkpoint of another model is refused before any training (exit 2, what differs), at any world size.
        rc, out, _ = run(launch, prog, work, "othermodel", 1, [], ["--checkpoint", ck, "--resume", "--preset", "small"])
        check(rc == 2 and "preset" in out and "step  " not in out,
              f"a checkpoint of another preset is refused before any step (exit {rc})")
        rc, out, path = run(launch, prog, work, "resumed", 1, [], ["--checkpoint", ck, "--resume"])
        check(rc == 0 and "PASS stage 09" in out, f"one rank resumes it to the end (exit {rc})")
        compare(check, "resumed", ref, path)
    else:
        n, largs, args, fault, want, lines = SCENARIOS[name]
        if "--checkpoint-every" in args:
            args = [*args, "--checkpoint", os.path.join(work, name + ".ckpt")]
        rc, out, path = run(launch, prog, work, name, n, largs, args, fault)
        check(rc == want, f"{name}: the launcher exits {want} (exit {rc})")
        for line in lines:  # a tuple: any one of the lines (the run took one of several legitimate paths)
            if isinstance(line, str) and line.startswith("!"):
                check(line[1:] not in out, f"{name}: does not say '{line[1:]}'")
                continue
            alts = line if isinstance(line, tuple) else (line,)
            check(any(a in out for a in alts), f"{name}: says " + " or ".join(f"'{a}'" for a in alts))
        if want == 0:
            check("PASS replicas bit-identical going into every step" in out, f"{name}: replicas bit-identical")
            compare(check, name, ref, path)
            seen_after_failure(check, name, path)
    left = left_running(work)
    check(not left, "nothing of the runs is left running" + ("".join("\n  " + x for x in left)))
    if not check.ok:
        print(f"logs: {work}/*.log")
    return check.ok


def main():
    if len(sys.argv) not in (5, 6) or sys.argv[1] not in list(SCENARIOS) + ["minimum", "reference"]:
        print(__doc__)
        return 2
    name, launch, prog, work = sys.argv[1:5]
    reference = sys.argv[5] if len(sys.argv) == 6 and name != "reference" else None
    if not os.path.isdir(CORPUS):
        print(f"SKIP: the corpus {CORPUS} is not installed (apt-get install fortunes)")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ok = scenario(name, launch, prog, work, reference)
    print(("PASS" if ok else "FAIL") + f" elastic {name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
