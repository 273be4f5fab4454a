#!/usr/bin/env python3
"""Merges stage 08 runs (each `--curve FILE`) into one results file for docs/08_train_lm.md.

    /usr/bin/python3 scripts/pages/lm_results.py OUT.json RUN.json...

One row per run: synchronization, ranks, link, steps; the step time (every step after the first 5, as
per-step samples: make_tables.py prints their median with a bootstrap interval), tokens per second at
the median, the median of each phase on rank 0 (data, forward, backward, exposed sync, optimizer),
the mean training loss of the last 20 steps and the last validation loss, and the largest difference
of its loss curve from the first one-rank run given with the same model, batch and data (when there is
one; the number of micro-batches may differ: a one-rank run with --accumulate 2 sums the same
gradients in the order 2 ranks do, and shows what that order alone does to a curve). The curves
themselves are kept in the rows for plot.py.
"""
import json
import sys


def main(out, paths):
    runs = [json.load(open(p)) for p in paths]
    key = lambda c: json.dumps({k: v for k, v in c["config"].items()
                                if k not in ("world_size", "sync", "accumulate", "eval_every", "checkpoint_every",
                                             "bucket_mb")},
                               sort_keys=True)
    one = {}  # per configuration, the first one-rank run given: the reference of the others
    for c in runs:
        if c["config"]["world_size"] == 1:
            one.setdefault(key(c), c)
    rows = []
    for c in runs:
        cfg, tr = c["config"], c["train"]
        secs = [x[2] for x in tr[5:]] or [x[2] for x in tr]
        med = sorted(secs)[len(secs) // 2]
        last = tr[-20:]
        row = {"sync": cfg["sync"] + (f", {cfg['bucket_mb']:g} MB buckets" if cfg["sync"] == "ddp" else ""),
               "world_size": cfg["world_size"], "threads": c.get("threads"),
               "accumulate": cfg["accumulate"],
               "link": c["link"], "preset": cfg["preset"], "steps": len(tr), "step_s": secs,
               "tokens_per_s": cfg["batch"] * cfg["context"] / med,
               **{f"{k}_s": v for k, v in c["phases"].items()},
               "loss_first": tr[0][1], "loss_last20": sum(x[1] for x in last) / len(last),
               "val_last": c["val"][-1][1] if c["val"] else None,
               "train": [[x[0], x[1]] for x in tr], "val": c["val"],
               "command": c["command"], "machine": c["machine"]}
        ref = one.get(key(c))
        if ref is not None and ref is not c:
            n = min(len(ref["train"]), len(tr))
            row["max_diff_vs_1"] = max(abs(a[1] - b[1]) for a, b in zip(ref["train"][:n], tr[:n]))
        if "sample" in c:
            row["sample"] = c["sample"]
        rows.append(row)
    doc = {"benchmark": "train_lm: stage 08 runs on real text", "machine": runs[0]["machine"],
           "command": runs[0]["command"], "rows": rows}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out}: {len(rows)} runs")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: lm_results.py OUT.json RUN.json...")
    main(sys.argv[1], sys.argv[2:])
