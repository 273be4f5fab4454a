#!/usr/bin/env python3
"""What the pages quote from the recorded traces, written as JSON so that scripts/pages/make_tables.py can put
the numbers into the prose (docs/results/trace_summary.json; its markers read `d["VARIANT"]["FIELD"]`).

    /usr/bin/python3 scripts/trace/trace_summary.py [--check]

From docs/results/stage05_tiny_1gbit.trace.json.gz (stage 05's benchmark, tiny, 2 ranks, 1 Gbit/s), for every
variant that communicates, over every timed step of every rank (ms, median and range):
  first_launch_ms   the first collective's launch after backward began (when the link starts being used)
  link_busy_ms      the first launch to the last completion (the link is busy without a gap in between when
                    link_gap_ms, that span minus the union of the collectives' spans, is about 0)
  queued_ms         the last completion after backward ended: what is still to send when backward is done
  backward_ms, calls
and `figure`: the step drawn by scripts/pages/figures.py's buckets picture (rank 0, the median round of 1 MB
buckets): its backward, the buckets launched during it, the first bucket's launch and the hidden time.
--check: exit 1 when the JSON is not what the trace gives (ctest docs_trace_summary_current); bench_docs.sh
writes it after recording the traces.
"""
import json
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402
from dplib import trace as tl  # noqa: E402

ROOT = str(dplib.ROOT)
RESULTS = str(dplib.RESULTS)
TRACE = "stage05_tiny_1gbit.trace.json.gz"
FIGURE_VARIANT = "bucketed 1 MB (stage 05)"


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summary():
    t = tl.load(os.path.join(RESULTS, TRACE))
    out = {"source": f"docs/results/{TRACE}", "variants": {}}
    for v in tl.variants(t):
        per = {k: [] for k in ("first_launch_ms", "link_busy_ms", "link_gap_ms", "queued_ms", "backward_ms", "calls")}
        for s in tl.steps_of(t, v):
            bwd = tl.union([(p.ts, p.end) for p in s.phase("backward")])
            if not s.comms or not bwd:
                continue
            first, last = min(c.ts for c in s.comms), max(c.end for c in s.comms)
            per["first_launch_ms"].append((first - bwd[0][0]) / 1e3)
            per["link_busy_ms"].append((last - first) / 1e3)
            per["link_gap_ms"].append((last - first - tl.length([(c.ts, c.end) for c in s.comms])) / 1e3)
            per["queued_ms"].append((last - bwd[-1][1]) / 1e3)
            per["backward_ms"].append(tl.length(bwd) / 1e3)
            per["calls"].append(len(s.comms))
        if per["calls"]:
            out["variants"][v] = {k: stats(x) for k, x in per.items()}
    # The step the buckets picture draws (scripts/pages/figures.py: rank 0, the median round).
    rnd = tl.median_round(t, FIGURE_VARIANT)
    step = tl.steps_of(t, FIGURE_VARIANT, rank=min(t.steps), round_=rnd)[0]
    buckets = sorted((c for c in step.comms if c.args.get("carries", "").startswith("bucket ")),
                     key=lambda c: int(c.args["carries"].split()[1]))
    (b0, b1), = tl.union([(p.ts, p.end) for p in step.phase("backward")])
    comm, bwd, hidden = tl.overlap(step)
    out["figure"] = {"variant": FIGURE_VARIANT, "round": rnd, "buckets": len(buckets),
                     "launched_during_backward": sum(1 for c in buckets if b0 <= c.ts <= b1),
                     "first_bucket_launch_ms": (buckets[0].ts - b0) / 1e3 if buckets else None,
                     "first_bucket_MB": buckets[0].args.get("bytes", 0) / 1e6 if buckets else None,
                     "backward_ms": bwd / 1e3, "comm_ms": comm / 1e3, "hidden_ms": hidden / 1e3}
    return out


def main():
    path = os.path.join(RESULTS, "trace_summary.json")
    doc = summary()
    text = json.dumps(doc, indent=2) + "\n"
    if "--check" in sys.argv[1:]:
        if not os.path.exists(path) or open(path).read() != text:
            print(f"trace_summary --check: {path} is not what {TRACE} gives; run /usr/bin/python3 scripts/trace/trace_summary.py")
            return 1
        print("trace_summary --check: up to date")
        return 0
    open(path, "w").write(text)
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
