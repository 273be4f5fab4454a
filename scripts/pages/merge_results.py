#!/usr/bin/env python3
"""merge_results.py OUT.json IN1.json IN2.json ...: one results file from several runs of one benchmark
(the rows concatenated, each run's command kept)."""
import json, sys
out, ins = sys.argv[1], sys.argv[2:]
docs = [json.load(open(p)) for p in ins]
for d in docs:  # every row keeps the exact command that produced it
    for r in d["rows"]:
        r.setdefault("command", d["command"])
merged = {"benchmark": docs[0]["benchmark"], "machine": docs[0]["machine"],
          "command": "; ".join(d["command"] for d in docs), "rows": [r for d in docs for r in d["rows"]]}
json.dump(merged, open(out, "w"), indent=2)
print(f"wrote {out} ({len(merged['rows'])} rows)")
