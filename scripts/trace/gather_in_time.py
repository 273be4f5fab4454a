#!/usr/bin/env python3
"""gather_in_time.py TRACE[.gz] [RESULTS.json --json OUT]: did each FSDP all-gather finish in time?

CS336 2026's fsdp_accounting (b) asks it of a profiler timeline; this answers it from a stage 07 trace
(`ext07a_fsdp_bench --trace FILE`). For every timed step of every FSDP variant, on every rank, each
"forward unit" span is matched with the gather of that unit launched last before the span began (the
collective labelled "gather unit U"). The unit waited for its weights by max(0, gather end - span start).

Prints one line per variant: units whose weights were there in time, the median and total wait per step,
the forward time per step, and the computing time per unit: on each rank in each step, its forward's time
less its waits, divided by the units that rank ran in that step (one rank's time by one rank's units). With
the run's RESULTS.json (for its machine, link and command) and --json OUT, writes the same numbers as a
results file for make_tables.py. --self-test checks the arithmetic on a made-up trace (ctest).
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
            rec = out.setdefault(variant, {"in_time": 0, "late": 0, "waits_ms": [], "step_wait_ms": [], "forward_ms": [],
                                           "unit_compute_ms": [], "units_per_step": []})
            wait_total = 0.0
            step_units = [x for x in units if t0 <= x["ts"] <= t1]
            for u in step_units:
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
            forward_ms = sum(f["dur"] / 1e3 for f in fwd if t0 <= f["ts"] <= t1)
            rec["forward_ms"].append(forward_ms)
            if step_units:  # this rank's forward, less its waits, over this rank's units
                rec["units_per_step"].append(len(step_units))
                rec["unit_compute_ms"].append((forward_ms - wait_total) / len(step_units))
    return out


def median_or_0(xs):
    return statistics.median(xs) if xs else 0.0


def self_test():
    """A made-up trace: 2 ranks, 1 step, 3 units each; rank 0's forward 300 ms with 60 ms of waiting (80 ms
    of computing per unit), rank 1's 240 ms with none (also 80). Dividing one rank's time by both ranks'
    units (the mistake this replaced) would give 40 ms."""
    ev = []
    for rank, (fwd_ms, first_wait_ms) in enumerate([(300, 60), (240, 0)]):
        ev.append({"ph": "X", "pid": rank, "tid": 0, "name": "step", "ts": 0, "dur": 1e6, "args": {"variant": "fsdp"}})
        ev.append({"ph": "X", "pid": rank, "tid": 0, "name": "forward", "ts": 1000, "dur": fwd_ms * 1e3, "args": {}})
        for u in range(3):
            start = 1000 + u * 80e3 + (first_wait_ms * 1e3 if u else 0)
            gather_end = start + (first_wait_ms * 1e3 if u == 0 else 0)
            ev.append({"ph": "X", "pid": rank, "tid": 1, "name": "all_gather", "ts": 500 + u, "dur": gather_end - 500 - u,
                       "args": {"carries": f"gather unit {u}"}})
            ev.append({"ph": "X", "pid": rank, "tid": 0, "name": "forward unit", "ts": start, "dur": 80e3,
                       "args": {"unit": u}})
    r = analyse(ev)["fsdp"]
    got = sorted(r["unit_compute_ms"])
    ok = len(got) == 2 and all(abs(g - 80.0) < 1e-6 for g in got) and r["units_per_step"] == [3, 3]
    print(f"gather_in_time --self-test: {'PASS' if ok else 'FAIL'}: computing per unit {got} ms (want 80, 80), "
          f"units per rank and step {r['units_per_step']} (want 3, 3)")
    return 0 if ok else 1


def main(argv):
    if argv and argv[0] == "--self-test":
        return self_test()
    path = argv[0]
    res = analyse(dplib.trace_events(path))
    summary = []
    for variant, r in sorted(res.items()):
        n = r["in_time"] + r["late"]
        row = {"variant": variant, "units_checked": n, "in_time": r["in_time"],
               "median_wait_ms": median_or_0(r["waits_ms"]),
               "wait_per_step_ms": median_or_0(r["step_wait_ms"]),
               "forward_per_step_ms": median_or_0(r["forward_ms"]),
               "units_per_rank_step": median_or_0(r["units_per_step"]),
               "compute_per_unit_ms": median_or_0(r["unit_compute_ms"]),
               "compute_per_unit_min_ms": min(r["unit_compute_ms"], default=0.0),
               "compute_per_unit_max_ms": max(r["unit_compute_ms"], default=0.0)}
        summary.append(row)
        print(f"{variant}: {row['in_time']} of {n} unit forwards found their weights gathered; median wait "
              f"{row['median_wait_ms']:.1f} ms; per step {row['wait_per_step_ms']:.0f} ms of waiting in a "
              f"{row['forward_per_step_ms']:.0f} ms forward; {row['compute_per_unit_ms']:.0f} ms of computing per "
              f"unit ({row['units_per_rank_step']:.0f} units per rank and step; medians over steps and ranks)")
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
    sys.exit(main(sys.argv[1:]))
