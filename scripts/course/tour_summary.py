#!/usr/bin/env python3
"""tour_summary.py DIR: the tour's closing table, from the JSON every stage wrote into DIR.

Overlap efficiency: the share of one flat all-reduce's time (or of backward, if shorter) that the
stage hid behind backward, measured in the same run; speedup: the single-process step (whole batch,
all cores, or one rank's cores where each rank has its own: ddp_launch --cpus-per-rank; same run) over the stage's step. Step times and exposed communication come from each stage's own run; "vs no-comm" compares a stage
with the no-communication step measured in the same run, "vs stage 02" compares across the tour's runs
(same model, batch and machine, a few minutes apart). Memory per rank counts the bytes of parameters,
gradients and AdamW state held by each rank, from its tensors (the common benchmark's Strategy::bytes()).
"""
import json, pathlib, sys

IDEAS = {"01": "all-reduce", "02": "naive DDP", "03": "one flat all-reduce", "04": "overlap with backward",
         "05": "buckets", "06": "ZeRO-1 sharded AdamW", "07": "FSDP (ZeRO-3)",
         "08": "capstone: real text", "09": "elastic: a rank dies, the run goes on",
         "10": "a cluster of nodes: HSDP"}

def load(d, n):
    p = d / f"stage{n}.json"
    return json.loads(p.read_text()) if p.exists() else None

def pick(doc, needle):
    rows = [r for r in doc["rows"] if needle in r.get("variant", "")]
    return min(rows, key=lambda r: r["step_s"]) if rows else None

def recovery_note(events):
    """Stage 09's recoveries (failure -> the redone step done): median and p95 (nearest rank: the largest of
    fewer than 20), and the steps lost (redone after a fallback to the checkpoint)."""
    rec = sorted(e["recovery_s"] for e in events if "recovery_s" in e)
    if not rec:
        return ""
    med = rec[(len(rec) - 1) // 2] if len(rec) % 2 else (rec[len(rec) // 2 - 1] + rec[len(rec) // 2]) / 2
    p95 = rec[max(0, -(-95 * len(rec) // 100) - 1)]
    lost = sum(e.get("redone", 0) for e in events)
    return (f"; failure -> next step done: median {med:.2f} s, p95 {p95:.2f} s over {len(rec)} failure"
            f"{'s' if len(rec) > 1 else ''}, {lost} steps lost")

def main(d):
    d = pathlib.Path(d)
    out = []
    s1 = load(d, "01")
    if s1:
        big = max(s1["rows"], key=lambda r: r["bytes"])
        out.append(["01", IDEAS["01"], "PASS", "-", "-", "-", "-", "-", "-",
                    f"busbw {big['busbw_GBps']:.2f} GB/s at {big['size']}"])
    base02 = None
    # Stages 02-07 all run the common benchmark: the same row format, each beside its no-communication row.
    for n, needle in [("02", "(stage 02)"), ("03", "(stage 03)"), ("04", "(stage 04)"), ("05", "(stage 05)"),
                      ("06", "ZeRO-1"), ("07", "FSDP")]:
        doc = load(d, n)
        if not doc:
            continue
        r = pick(doc, needle)
        if not r:
            continue
        if n == "02":
            base02 = r["step_s"]
        mem = f"{r['total_MB']:.0f} MB/rank" if "total_MB" in r else "-"
        if n in ("06", "07"):  # what sharding saves: beside the whole replica of the no-communication row
            whole = next((x for x in doc["rows"] if x["variant"] == "no communication"), None)
            note = f"{r['variant']}: {mem}" + (f" (whole replica {whole['total_MB']:.0f})" if whole and "total_MB" in whole else "")
        else:
            note = f"{mem}; " + (r["variant"] if n == "05" else f"{r['calls_per_step']} collectives/step")
        ov = r.get("overlap_efficiency")
        out.append([n, IDEAS[n], "PASS", f"{r['step_s']:.3f}", f"{r['ratio_to_no_comm']:.2f}",
                    f"{r['step_s'] / base02:.2f}" if base02 else "-", f"{r['exposed_comm_s']:+.3f}",
                    f"{ov:.2f}" if ov is not None else "-",
                    # one process's median step over this row's, as the pages' tables compute it
                    f"{r['single_process_step_s'] / r['step_s']:.2f}" if "single_process_step_s" in r else "-", note])
    s8 = load(d, "08")
    if s8:
        tr, val = s8["train"], s8["val"]
        secs = sorted(x[2] for x in tr[1:] or tr)
        med = secs[len(secs) // 2]
        tokens = s8["config"]["batch"] * s8["config"]["context"]
        out.append(["08", IDEAS["08"], "PASS", f"{med:.3f}", "-", "-", "-", "-", "-",
                    f"{s8['config']['sync']}: loss {tr[0][1]:.2f} -> {tr[-1][1]:.2f} nats/byte in {len(tr)} steps"
                    + (f" (validation {val[-1][1]:.2f})" if val else "") + f", {tokens / med:.0f} tokens/s"])
    s9 = load(d, "09")
    if s9:
        tr = s9["train"]
        secs = sorted(x[2] for x in tr)
        out.append(["09", IDEAS["09"], "PASS", f"{secs[len(secs) // 2]:.3f}", "-", "-", "-", "-", "-",
                    "members (slot.restart) " + " -> ".join(e["members"] for e in s9["events"])
                    + recovery_note(s9["events"]) + f"; loss {tr[0][1]:.2f} -> {tr[-1][1]:.2f}"])
    s10 = load(d, "10")
    if s10:  # HSDP against flat FSDP, both measured in this run, and what each sends over a node's uplink
        hsdp, fsdp = pick(s10, "HSDP"), pick(s10, "FSDP, flat")
        up = s10.get("uplink_bytes_per_step", {})
        mesh = s10.get("mesh", {})
        if hsdp and fsdp:
            out.append(["10", IDEAS["10"], "PASS", f"{hsdp['step_s']:.3f}", f"{hsdp['ratio_to_no_comm']:.2f}", "-",
                        f"{hsdp['exposed_comm_s']:+.3f}", "-", "-",
                        f"{mesh.get('nodes', '?')} nodes x {mesh.get('per_node', '?')}: HSDP step {hsdp['step_s'] / fsdp['step_s']:.2f}"
                        f" x flat FSDP's; uplink {up.get('HSDP', 0) / 1e6:.0f} MB/step vs {up.get('FSDP, flat', 0) / 1e6:.0f}"])
    head = ["stage", "idea", "check", "step (s)", "vs no-comm", "vs stage 02", "exposed comm (s)",
            "overlap efficiency", "speedup vs 1 process", "notes"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in out:
        print("| " + " | ".join(r) + " |")
    pinned = [(s, doc) for s, doc in ((s, load(d, s)) for s in ("02", "03", "04", "05")) if doc and doc.get("cpus_per_rank")]
    if pinned:
        doc = pinned[0][1]
        k, n = doc["cpus_per_rank"], doc["rows"][0].get("world_size", 2)
        print(f"\nspeedup vs 1 process: each rank ran on {k} core{'s' if k > 1 else ''} of its own (ddp_launch "
              f"--cpus-per-rank {k}), and so did the single process: the ceiling is {n}, the no-communication "
              f"step's speed-up; what communication costs is the rest.")
    else:
        print("\nspeedup vs 1 process: the ranks shared the machine's cores with each other and the single process "
              "had them all, so the ceiling is below the number of ranks (run with a core per rank for N).")

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/tour")
