#!/usr/bin/env python3
"""Regenerates every results table in README.md and docs/*.md from docs/results/*.json.

A table lives between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; NAME is a JSON file in
docs/results/ (without .json). The block is replaced by a Markdown table, the command that produced the
numbers and the machine they came from. Tables are never edited by hand.
    python3 scripts/make_tables.py
"""
import json, pathlib, re

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"

# Which columns each benchmark shows: (json key, header, format).
COLUMNS = {
    "allreduce": [("backend", "backend", "{}"), ("world_size", "ranks", "{}"), ("size", "size", "{}"),
                  ("iters", "iterations", "{}"), ("latency_median_s", "median latency (ms)", "ms"),
                  ("algbw_GBps", "algbw (GB/s)", "{:.2f}"), ("busbw_GBps", "busbw (GB/s)", "{:.2f}")],
    "ddp": [("variant", "variant", "{}"), ("group", "group", "{}"), ("calls_per_step", "collectives / step", "{}"),
            ("step_s", "step (s)", "{:.3f}"), ("comm_s", "waiting in sync (s)", "{:.3f}"),
            ("exposed_comm_s", "exposed comm (s)", "{:+.3f}"), ("ratio_to_no_comm", "step / no-comm", "{:.3f}")],
    "sharded_optimizer": [("optimizer", "optimizer", "{}"), ("world_size", "ranks", "{}"),
               ("param_MB", "params (MB)", "{:.1f}"), ("grad_MB", "grads (MB)", "{:.1f}"),
               ("state_MB_max_rank", "optimizer state, max rank (MB)", "{:.1f}"),
               ("expected_MB", "4P+4P+8P/N (MB)", "{:.1f}"), ("peak_rss_start_MB", "peak RSS at start (MB)", "{:.0f}"),
               ("peak_rss_before_step_MB", "before step (MB)", "{:.0f}"),
               ("peak_rss_after_step_MB", "after step (MB)", "{:.0f}"), ("step_median_s", "step (s)", "{:.3f}")],
    "tour": [("stage", "stage", "{}"), ("idea", "idea", "{}"), ("check", "check", "{}"),
             ("step_s", "step (s)", "{:.3f}"), ("ratio_to_stage02", "vs stage 02", "{:.2f}"),
             ("exposed_comm_s", "exposed comm (s)", "{:+.3f}"), ("memory_MB", "memory / rank (MB)", "{:.0f}")],
}

def cell(row, key, fmt):
    v = row.get(key)
    if v is None:
        return "-"
    if fmt == "ms":
        return f"{v * 1e3:.3f}"
    return fmt.format(v)

def table(name):
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    kind = doc["benchmark"].split(":")[0]
    cols = COLUMNS.get(kind, COLUMNS["ddp"])
    present = [c for c in cols if any(c[0] in r for r in doc["rows"])]
    lines = ["| " + " | ".join(h for _, h, _ in present) + " |", "|" + "---|" * len(present)]
    for r in doc["rows"]:
        lines.append("| " + " | ".join(cell(r, k, f) for k, _, f in present) + " |")
    # The programs record their own argv; they ran under the launcher with this many ranks.
    world = doc["rows"][0].get("world_size", 1)
    cmds = [c.strip() for c in doc["command"].split(";") if c.strip()]
    cmds = [f"./build/bin/ddp_launch --nproc {world} -- {c}" if c.startswith("./build/bin/stage") else c
            for c in cmds]
    lines += ["", f"Measured on: {doc['machine']}.  ", "Command: " + "; ".join(f"`{c}`" for c in cmds)]
    if kind == "ddp" and any(r.get("group", 0) for r in doc["rows"]):
        lines += ["", "Variants that did not fit in memory together ran in groups, each with its own "
                  "no-communication baseline; \"exposed comm\" and \"step / no-comm\" refer to the baseline of "
                  "the same group."]
    return "\n".join(lines)

def main():
    pattern = re.compile(r"(<!-- table:([\w.-]+) -->\n).*?(<!-- /table:\2 -->)", re.S)
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = md.read_text()
        def repl(m):
            name = m.group(2)
            if not (RESULTS / f"{name}.json").exists():
                return m.group(0)
            return m.group(1) + table(name) + "\n" + m.group(3)
        new = pattern.sub(repl, text)
        if new != text:
            md.write_text(new)
            print(f"updated {md.relative_to(ROOT)}")

if __name__ == "__main__":
    main()
