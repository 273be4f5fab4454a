#!/usr/bin/env python3
"""gather_in_time.py TRACE[.gz] [RESULTS.json --json OUT]: did each FSDP all-gather finish in time?

CS336 2026's fsdp_accounting (b) asks it of a profiler timeline; this answers it from a stage 07 trace
(`ext07a_fsdp_bench --trace FILE`). For every timed step of every FSDP variant, on every rank, each
"forward unit" span is matched with the gather of that unit launched last before the span began (the
collective labelled "gather unit U"). The unit waited for its weights by max(0, gather end - span start).

Prints one line per variant: units whose weights were there in time, the median and total wait per step,
and the forward time per step. With the run's RESULTS.json (for its machine, link and command) and
--json OUT, writes the same numbers as a results file for make_tables.py.
"""
import json, pathlib, re, statistics, sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402


def analyse(events):
    by_rank = {}
    for e in events:
        if e.get("ph") in ("X", "i"):
            by_rank.setdefault(e["pid"], []).append(e)
    out = {}
    for rank, evs in by_rank.items():
        steps = [e for e in evs if e["name"] == "step" and e.get("ph") == "X"]
        gathers = [e for e in evs if e.get("tid", 0) != 0 and re.fullmatch(r"gather unit \d+", e.get("args", {}).get("carries", ""))]
        units = [e for e in evs if e["name"] == "forward unit"]
        fwd = [e for e in evs if e["name"] == "forward"]
        for s in steps:
            variant = s["args"].get("variant", "")
            if not variant.startswith("fsdp"):
                continue
            t0, t1 = s["ts"], s["ts"] + s["dur"]
            rec = out.setdefault(variant, {"in_time": 0, "late": 0, "waits_ms": [], "step_wait_ms": [], "forward_ms": []})
            wait_total = 0.0
            for u in (x for x in units if t0 <= x["ts"] <= t1):
                label = f"gather unit {u['args']['unit']}"
                before = [g for g in gathers if g["args"]["carries"] == label and t0 <= g["ts"] <= u["ts"]]
                if not before:
                    continue
                g = max(before, key=lambda g: g["ts"])
                wait = max(0.0, g["ts"] + g["dur"] - u["ts"]) / 1e3
                rec["in_time" if wait == 0 else "late"] += 1
                rec["waits_ms"].append(wait)
                wait_total += wait
            rec["step_wait_ms"].append(wait_total)
            rec["forward_ms"] += [f["dur"] / 1e3 for f in fwd if t0 <= f["ts"] <= t1]
    return out


def main(argv):
    path = argv[0]
    res = analyse(dplib.trace_events(path))
    summary = []
    for variant, r in sorted(res.items()):
        n = r["in_time"] + r["late"]
        row = {"variant": variant, "units_checked": n, "in_time": r["in_time"],
               "median_wait_ms": statistics.median(r["waits_ms"]) if r["waits_ms"] else 0.0,
               "wait_per_step_ms": statistics.median(r["step_wait_ms"]) if r["step_wait_ms"] else 0.0,
               "forward_per_step_ms": statistics.median(r["forward_ms"]) if r["forward_ms"] else 0.0}
        summary.append(row)
        print(f"{variant}: {row['in_time']} of {n} unit forwards found their weights gathered; median wait "
              f"{row['median_wait_ms']:.1f} ms; per step {row['wait_per_step_ms']:.0f} ms of waiting in a "
              f"{row['forward_per_step_ms']:.0f} ms forward (medians over steps and ranks)")
    if "--json" in argv:
        run = dplib.load_json(argv[1])
        first = run["rows"][0]
        cmd = first.get("command", run["command"]) + "\npython3 scripts/trace/gather_in_time.py " + " ".join(argv[:2])
        for row in summary:
            row.update({"link": first.get("link", run.get("link", "")), "preset": first["preset"],
                        "world_size": first["world_size"], "command": cmd})
        out = {"benchmark": "gather_in_time", "machine": run["machine"], "command": cmd, "rows": summary}
        pathlib.Path(argv[argv.index("--json") + 1]).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
