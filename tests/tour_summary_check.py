#!/usr/bin/env python3
"""ctest tour_summary_table: the tour's closing table (scripts/course/tour_summary.py) says what the runs measured.

  tour_summary_check.py SUMMARY_SCRIPT E2E_DIR STAGE08_CURVE STAGE09_CURVE

E2E_DIR holds the JSON of the end-to-end runs of stages 01-07 and 10 (tests/stages/CMakeLists.txt: stage01_e2e_2ranks
writes stage01_2.json, stage02_e2e ... stage07_e2e and stage10_e2e write stageNN.json); STAGE08_CURVE is stage08_curves_match's
2-rank DDP curve and STAGE09_CURVE stage09_elastic_kill's curve (a rank killed, a replacement joined). They are
copied where the tour writes them (stageNN.json in one folder), the script runs on that folder, and every row
of its table is checked against values computed here from the same files: the step of each stage's best row,
its ratio to stage 02's, the exposed communication, the memory note, stage 08's median step and loss, stage
09's generations and its recovery.

Exit 0: every row as computed; 1: a row missing, in the wrong order or with another value; 77: skipped
(stage 08's and 09's runs need Debian's fortunes, and they were skipped without it).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

CORPUS = "/usr/share/games/fortunes"
# Stage -> the variant text that picks its rows (the lowest step among them), as the tour's table does.
NEEDLES = [("02", "(stage 02)"), ("03", "(stage 03)"), ("04", "(stage 04)"), ("05", "(stage 05)"),
           ("06", "ZeRO-1"), ("07", "FSDP")]


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def table(text):
    """The markdown table's body rows, as lists of cells."""
    rows = [line.strip().strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in r] for r in rows[1:]]  # without the header


def main():
    if len(sys.argv) != 5:
        print(__doc__.split("\n\n")[1])
        return 2
    script, e2e, curve08, curve09 = sys.argv[1:]
    have_lm = os.path.exists(curve08) and os.path.exists(curve09)
    if not have_lm and not os.path.exists(CORPUS):
        print(f"SKIP: stages 08 and 09 need Debian's fortunes ({CORPUS}): apt-get install fortunes")
        return 77
    with tempfile.TemporaryDirectory() as d:
        sources = {"01": os.path.join(e2e, "stage01_2.json"), "08": curve08, "09": curve09}
        sources.update({n: os.path.join(e2e, f"stage{n}.json") for n, _ in NEEDLES})
        sources["10"] = os.path.join(e2e, "stage10.json")
        docs = {}
        for n, src in sorted(sources.items()):
            if not os.path.exists(src):
                fail(f"stage {n}: {src} is missing (its end-to-end test writes it; run ctest -R tour_summary_table "
                     f"to run them first)")
            shutil.copy(src, os.path.join(d, f"stage{n}.json"))
            docs[n] = json.load(open(src))
        out = subprocess.run([sys.executable, script, d], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=30)
        # The same runs as if pinned (ddp_launch --cpus-per-rank 1): the closing line must then put the ceiling at
        # the number of ranks, and below it otherwise.
        pinned_doc = dict(docs["02"], cpus_per_rank=1)
        with open(os.path.join(d, "stage02.json"), "w") as f:
            json.dump(pinned_doc, f)
        pinned = subprocess.run([sys.executable, script, d], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=30)
    print(out.stdout)
    ranks = docs["02"]["rows"][0].get("world_size", 2)
    pinned_line = f"the ceiling is {ranks}, the no-communication step's speed-up"
    if any(docs[n].get("cpus_per_rank") for n in ("02", "03", "04", "05")):
        fail("the end-to-end runs were pinned; this check expects them unpinned (it pins a copy itself)")
    if "the ceiling is below the number of ranks" not in out.stdout or pinned_line in out.stdout:
        fail("unpinned runs: the closing line must say the ceiling is below the number of ranks")
    if pinned.returncode != 0 or pinned_line not in pinned.stdout:
        fail(f"pinned runs (cpus_per_rank 1): the closing line must say {pinned_line!r}; got:\n{pinned.stdout[-400:]}")
    if out.returncode != 0:
        fail(f"{script} exited {out.returncode}")
    rows = table(out.stdout)
    got = [r[0] for r in rows]
    want = ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10"]
    if got != want:
        fail(f"rows {got}, want one per stage in order {want}")
    for r in rows:
        if len(r) != 10 or r[2] != "PASS":
            fail(f"stage {r[0]}: {len(r)} cells (want 10) or check {r[2]!r} (want PASS): {r}")
    by = {r[0]: r for r in rows}

    big = max(docs["01"]["rows"], key=lambda x: x["bytes"])
    expect = f"busbw {big['busbw_GBps']:.2f} GB/s at {big['size']}"
    if by["01"][9] != expect:
        fail(f"stage 01: notes {by['01'][9]!r}, want {expect!r} (the largest size's bus bandwidth)")

    base = None
    for n, needle in NEEDLES:
        best = min((x for x in docs[n]["rows"] if needle in x.get("variant", "")), key=lambda x: x["step_s"])
        base = base or best["step_s"]
        want_cells = {3: f"{best['step_s']:.3f}", 4: f"{best['ratio_to_no_comm']:.2f}",
                      5: f"{best['step_s'] / base:.2f}", 6: f"{best['exposed_comm_s']:+.3f}"}
        for i, v in want_cells.items():
            if by[n][i] != v:
                fail(f"stage {n} ({best['variant']}): column {i + 1} is {by[n][i]!r}, want {v!r}")
        if "total_MB" in best and f"{best['total_MB']:.0f} MB/rank" not in by[n][9]:
            fail(f"stage {n}: notes {by[n][9]!r} lack its memory per rank {best['total_MB']:.0f} MB")
    for n in ("06", "07"):  # what sharding saves, beside the whole replica
        if "whole replica" not in by[n][9]:
            fail(f"stage {n}: notes {by[n][9]!r} do not compare with the whole replica")

    tr = docs["08"]["train"]
    secs = sorted(x[2] for x in tr[1:])
    if by["08"][3] != f"{secs[len(secs) // 2]:.3f}":
        fail(f"stage 08: step {by['08'][3]!r}, want the median step after the first, {secs[len(secs) // 2]:.3f}")
    if f"loss {tr[0][1]:.2f} -> {tr[-1][1]:.2f}" not in by["08"][9]:
        fail(f"stage 08: notes {by['08'][9]!r} lack the loss {tr[0][1]:.2f} -> {tr[-1][1]:.2f}")

    ev = docs["09"]["events"]
    members = " -> ".join(e["members"] for e in ev)
    if f"members (slot.restart) {members}" not in by["09"][9]:
        fail(f"stage 09: notes {by['09'][9]!r} lack the generations {members!r}")
    rec = sorted(e["recovery_s"] for e in ev if "recovery_s" in e)
    if not rec:
        fail("stage 09: the run recorded no recovery (a rank is killed in it)")
    else:  # computed here independently: numpy-free median, and p95 as the nearest rank (ceil(0.95 n)-th value)
        import math
        import statistics
        want = (f"failure -> next step done: median {statistics.median(rec):.2f} s, "
                f"p95 {rec[math.ceil(0.95 * len(rec)) - 1]:.2f} s over {len(rec)} failure")
        if want not in by["09"][9]:
            fail(f"stage 09: notes {by['09'][9]!r} lack the recoveries {want!r}")
    # Stage 10: HSDP's step, and beside it its ratio to flat FSDP's and both uplinks' bytes (the formula).
    hsdp = min((x for x in docs["10"]["rows"] if x["variant"] == "HSDP"), key=lambda x: x["step_s"])
    fsdp = min((x for x in docs["10"]["rows"] if x["variant"] == "FSDP, flat"), key=lambda x: x["step_s"])
    up = docs["10"]["uplink_bytes_per_step"]
    if by["10"][3] != f"{hsdp['step_s']:.3f}":
        fail(f"stage 10: step {by['10'][3]!r}, want HSDP's {hsdp['step_s']:.3f}")
    want = (f"HSDP step {hsdp['step_s'] / fsdp['step_s']:.2f} x flat FSDP's; uplink {up['HSDP'] / 1e6:.0f} MB/step "
            f"vs {up['FSDP, flat'] / 1e6:.0f}")
    if want not in by["10"][9]:
        fail(f"stage 10: notes {by['10'][9]!r} lack {want!r}")
    print("PASS tour summary: 10 rows, each as computed from its stage's run; the ceiling line follows the pinning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
