#!/usr/bin/env python3
"""tour_summary.py DIR: the tour's closing table, from the JSON every stage wrote into DIR.

Overlap efficiency: the share of one flat all-reduce's time (or of backward, if shorter) that the
stage hid behind backward, measured in the same run; speedup: the single-process step (whole batch,
all cores, same run) over the stage's step. Step times and exposed communication come from each stage's own run; "vs no-comm" compares a stage
with the no-communication step measured in the same run, "vs stage 02" compares across the tour's runs
(same model, batch and machine, a few minutes apart). Memory per rank counts the bytes of parameters,
gradients and AdamW state held by each rank (stage 06 measures them from its tensors).
"""
import json, pathlib, sys

IDEAS = {"01": "all-reduce", "02": "naive DDP", "03": "one flat all-reduce", "04": "overlap with backward",
         "05": "buckets", "06": "ZeRO-1 sharded AdamW", "07": "FSDP (ZeRO-3)",
         "08": "capstone: real text"}

def load(d, n):
    p = d / f"stage{n}.json"
    return json.loads(p.read_text()) if p.exists() else None

def pick(doc, needle):
    rows = [r for r in doc["rows"] if needle in r.get("variant", "")]
    return min(rows, key=lambda r: r["step_s"]) if rows else None

def main(d):
    d = pathlib.Path(d)
    out = []
    s1 = load(d, "01")
    if s1:
        big = max(s1["rows"], key=lambda r: r["bytes"])
        out.append(["01", IDEAS["01"], "PASS", "-", "-", "-", "-", "-", "-",
                    f"busbw {big['busbw_GBps']:.2f} GB/s at {big['size']}"])
    s6 = load(d, "06")
    P = s6["rows"][0]["params"] if s6 else None
    base02 = None
    for n, needle in [("02", "(stage 02)"), ("03", "(stage 03)"), ("04", "(stage 04)"), ("05", "(stage 05)")]:
        doc = load(d, n)
        if not doc:
            continue
        r = pick(doc, needle)
        if n == "02":
            base02 = r["step_s"]
        mem = f"{16 * P / 1e6:.0f}" if P else "-"
        note = r["variant"] if n == "05" else f"{r['calls_per_step']} collectives/step"
        ov = r.get("overlap_efficiency")
        out.append([n, IDEAS[n], "PASS", f"{r['step_s']:.3f}", f"{r['ratio_to_no_comm']:.2f}",
                    f"{r['step_s'] / base02:.2f}" if base02 else "-", f"{r['exposed_comm_s']:+.3f}",
                    f"{ov:.2f}" if ov is not None else "-",
                    f"{r['speedup_vs_1proc']:.2f}" if "speedup_vs_1proc" in r else "-",
                    f"{mem} MB/rank; {note}"])
    if s6:
        rows = {r["optimizer"]: r for r in s6["rows"]}
        sh, full = rows.get("sharded AdamW"), rows.get("AdamW")
        if sh and full:
            mem = (sh["param_MB"] + sh["grad_MB"] + sh["state_MB_max_rank"])
            out.append(["06", IDEAS["06"], "PASS", f"{sh['step_median_s']:.3f}", "-",
                        f"{sh['step_median_s'] / base02:.2f}" if base02 else "-", "-", "-", "-",
                        f"{mem:.0f} MB/rank (AdamW: {full['param_MB'] + full['grad_MB'] + full['state_MB_max_rank']:.0f});"
                        f" step x{sh['step_median_s'] / full['step_median_s']:.2f} of unsharded"])
    s7 = load(d, "07")
    if s7:
        rows = {r["variant"]: r for r in s7["rows"]}
        f, ddp = rows.get("fsdp"), rows.get("ddp")
        if f:
            note = f"{f['total_MB']:.0f} MB/rank"
            if ddp:
                note += f" (DDP: {ddp['total_MB']:.0f}); step x{f['ratio_median']:.2f} of stage 05's DDP, same run"
            out.append(["07", IDEAS["07"], "PASS", f"{f['step_median_s']:.3f}", "-",
                        f"{f['step_median_s'] / base02:.2f}" if base02 else "-", "-", "-", "-", note])
    s8 = load(d, "08")
    if s8:
        tr, val = s8["train"], s8["val"]
        secs = sorted(x[2] for x in tr[1:] or tr)
        med = secs[len(secs) // 2]
        tokens = s8["config"]["batch"] * s8["config"]["context"]
        out.append(["08", IDEAS["08"], "PASS", f"{med:.3f}", "-", "-", "-", "-", "-",
                    f"{s8['config']['sync']}: loss {tr[0][1]:.2f} -> {tr[-1][1]:.2f} nats/byte in {len(tr)} steps"
                    + (f" (validation {val[-1][1]:.2f})" if val else "") + f", {tokens / med:.0f} tokens/s"])
    head = ["stage", "idea", "check", "step (s)", "vs no-comm", "vs stage 02", "exposed comm (s)",
            "overlap efficiency", "speedup vs 1 process", "notes"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in out:
        print("| " + " | ".join(r) + " |")

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/tour")
