#!/usr/bin/env python3
"""What each node's uplink carried per step in stage 10's benchmark, counted from its trace, beside the formula.

    /usr/bin/python3 scripts/trace/uplink_bytes.py [--check]

Reads docs/results/stage10_tiny_10to1_traced.trace.json.gz (stage10_hierarchy --bench --trace, 2 nodes x 2 ranks;
a launch of its own, since recording slows the steps the page times) and the run's JSON
(docs/results/stage10_tiny_10to1_traced.json: the mesh and common/measure/accounting.cpp's uplink_bytes_per_step()
per variant), and writes docs/results/stage10_uplink.json: per variant, the bytes one
node's uplink carries per step, each direction, median over the timed rounds, from the trace and from the
formula. The trace records every collective a rank launched with its bytes and label, not its group, so:

- where a variant's collectives say "across nodes" in their label (HSDP, the hierarchical all-reduce), only
  those cross, each an all-reduce over M nodes: 2(M-1)/M of its bytes per rank, summed over the node's L ranks;
- otherwise every collective is over all W = M L ranks: an all_reduce is a ring in rank order, whose node
  boundary carries one rank's whole 2(W-1)/W of it; an all_to_all sends (W-L)/W of every rank's buffer off
  its node (Gloo's all-gathers and reduce-scatters here are all-to-alls, common/comm/shard_comm.hpp).

--check: exit 1 when the JSON is not what the trace gives, or the trace and the formula disagree (expected_range():
1%, or for flat FSDP, which keeps its last unit gathered into backward, between 2/3 of the formula and it; ctest
docs_uplink_bytes); bench_docs.sh writes it after recording the trace.
"""
import json
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402
from dplib import trace as tl  # noqa: E402

RESULTS = str(dplib.RESULTS)
RUN = "stage10_tiny_10to1_traced"
OUT = os.path.join(RESULTS, "stage10_uplink.json")
TOLERANCE = 0.01  # the counted and the formula's bytes differ by the padding of a few shards at most


def expected_range(variant, formula):
    """The trace's bytes must lie in this range. The formula counts flat FSDP's three buffers per step, but FSDP
    keeps its last unit gathered from forward to backward (stage 07: it is never freed after forward), one gather
    of at most the whole model fewer: between 2/3 of the formula and the formula. The others: the formula, 1%."""
    if variant.startswith("FSDP"):
        return formula * 2 / 3, formula * (1 + TOLERANCE)
    return formula * (1 - TOLERANCE), formula * (1 + TOLERANCE)


def uplink_per_step(steps, nodes, per_node):
    """Bytes node 0's uplink carries in one round: `steps` maps rank -> that rank's Step of the round."""
    world = nodes * per_node
    comms = {r: s.comms for r, s in steps.items()}
    labelled = any("across nodes" in str(c.args.get("carries", "")) for cs in comms.values() for c in cs)
    total = 0.0
    for rank in range(per_node):  # node 0's ranks
        for c in comms.get(rank, []):
            op, size = c.args.get("op"), float(c.args.get("bytes", 0))
            if labelled:
                if "across nodes" in str(c.args.get("carries", "")):
                    total += 2 * (nodes - 1) / nodes * size
            elif op == "all_reduce" and rank == per_node - 1:  # the ring's hop out of the node
                total += 2 * (world - 1) / world * size
            elif op == "all_to_all":
                total += (world - per_node) / world * size
    return total


def measure():
    doc = dplib.results(RUN)
    mesh = doc["mesh"]
    t = tl.load(os.path.join(RESULTS, RUN + ".trace.json.gz"))
    out = {"trace": RUN + ".trace.json.gz", "mesh": mesh, "variants": {}}
    for variant, formula in doc["uplink_bytes_per_step"].items():
        rounds = {}
        for pid, steps in t.steps.items():
            rank = int(str(t.ranks.get(pid, pid)).split()[-1])
            for s in steps:
                if s.variant == variant:
                    rounds.setdefault(s.round, {})[rank] = s
        per_round = [uplink_per_step(r, mesh["nodes"], mesh["per_node"]) for r in rounds.values()]
        out["variants"][variant] = {"trace_bytes": statistics.median(per_round), "formula_bytes": formula,
                                    "rounds": len(per_round)}
    return out


def main():
    check = "--check" in sys.argv[1:]
    try:
        got = measure()
    except (tl.TraceError, OSError, KeyError) as e:
        print(f"uplink_bytes: {e}", file=sys.stderr)
        return 2
    bad = []
    for v, x in got["variants"].items():
        lo, hi = expected_range(v, x["formula_bytes"])
        if not lo <= x["trace_bytes"] <= hi:
            bad.append(f"{v}: trace {x['trace_bytes'] / 1e6:.2f} MB, outside [{lo / 1e6:.2f}, {hi / 1e6:.2f}] MB "
                       f"(formula {x['formula_bytes'] / 1e6:.2f} MB)")
    if check:
        stale = not os.path.exists(OUT) or json.load(open(OUT)) != json.loads(json.dumps(got))
        if stale:
            print(f"uplink_bytes --check: {OUT} is not what the trace gives; run scripts/trace/uplink_bytes.py")
        for b in bad:
            print(f"uplink_bytes --check: {b}")
        if stale or bad:
            return 1
        print(f"uplink_bytes --check: PASS: {len(got['variants'])} variants, the trace's bytes as the formula says "
              f"(within {TOLERANCE:.0%}; flat FSDP between 2/3 of it and it)")
        return 0
    with open(OUT, "w") as f:
        json.dump(got, f, indent=1)
    for v, x in got["variants"].items():
        print(f"{v}: {x['trace_bytes'] / 1e6:.2f} MB per step per node from the trace, "
              f"{x['formula_bytes'] / 1e6:.2f} MB by formula ({x['rounds']} rounds)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
