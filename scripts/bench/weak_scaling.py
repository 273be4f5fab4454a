#!/usr/bin/env python3
"""Weak scaling on the simulated link: the same sequences per rank at 1, 2 and 4 ranks, in tokens/s.

    /usr/bin/python3 scripts/bench/weak_scaling.py [--out docs/results/weak_scaling.json] [--rounds 3] [--ranks 1,2,4]
                                                   [--cpus-per-rank K]

Strong scaling (the stage tables) splits one global batch over more ranks; weak scaling gives every rank the
same work (--per-rank sequences) and asks how many more tokens per second N ranks train. Each launch is
stage 05's benchmark with two rows, no communication and buckets of --cap MB, each rank behind its own
simulated --net link. A round runs one launch per world size (the order rotates round by round, so a slow
spell of the shared machine does not always land on one size); every ratio is taken within a round.

What the columns mean: tokens/s = ranks x per-rank x context / median step (the row's); efficiency =
tokens/s at N / (N x tokens/s at 1 rank, same round): 1.0 is perfect scaling. The no-communication row's
efficiency is the ceiling: with --cpus-per-rank K every launch, the 1-rank one included, gives each rank K
cores of its own (ddp_launch --cpus-per-rank), as each rank owns a GPU on a cluster, and it stays near 1;
without it N ranks share the machine's cores and it falls like 1/N whatever the network. Either way only the
bucketed row's distance below it is the communication's cost. Every N x K must fit the machine's cores.
About 4 minutes on 2 cores (3 rounds). --net needs root and iproute2.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402

ROOT = str(dplib.ROOT)
L, B = "./build/bin/ddp_launch", "./build/bin/stage05_bucketed"
BUCKETED = "bucketed {:g} MB (stage 05)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/results/weak_scaling.json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--per-rank", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--net", default="1gbit")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--cap", type=float, default=1.0, help="bucket cap in MB")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--cpus-per-rank", type=int, default=0, help="cores of its own per rank (0: share them)")
    a = ap.parse_args()
    os.chdir(ROOT)
    ranks = [int(x) for x in a.ranks.split(",")]
    if a.rounds < 1 or a.per_rank < 1 or any(n < 1 for n in ranks) or ranks[0] != 1:
        print(f"weak_scaling: --rounds {a.rounds}, --per-rank {a.per_rank}, --ranks {a.ranks}: want positive "
              f"values and --ranks starting at 1 (efficiency is against 1 rank)", file=sys.stderr)
        return 2
    cores = len(os.sched_getaffinity(0))
    if a.cpus_per_rank < 0 or max(ranks) * a.cpus_per_rank > cores:
        print(f"weak_scaling: --cpus-per-rank {a.cpus_per_rank} at {max(ranks)} ranks needs "
              f"{max(ranks) * a.cpus_per_rank} cores, and this process may use {cores}: lower --ranks or "
              f"--cpus-per-rank (0 shares the cores)", file=sys.stderr)
        return 2
    pin = ["--cpus-per-rank", str(a.cpus_per_rank)] if a.cpus_per_rank else []
    bucketed = BUCKETED.format(a.cap)
    cmds, samples, machine = {}, {n: [] for n in ranks}, None
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(a.rounds):
            order = ranks[rnd % len(ranks):] + ranks[:rnd % len(ranks)]
            for n in order:
                out = os.path.join(tmp, f"w{n}.json")
                cmd = [L, "--nproc", str(n), *pin, "--net", a.net, "--", B, "--bench", "--preset", a.preset,
                       "--context", str(a.context), "--batch", str(a.per_rank * n), "--warmup", "2",
                       "--steps", str(a.steps), "--variants", "bucketed", "--caps", f"{a.cap:g}", "--json", out]
                print(f"round {rnd + 1}/{a.rounds}, {n} rank(s): {' '.join(cmd)}", flush=True)
                r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
                if r.returncode != 0:
                    print(r.stdout[-3000:])
                    print(f"weak_scaling: {n} rank(s) exited {r.returncode}", file=sys.stderr)
                    return 1
                doc = dplib.load_json(out)
                machine = doc["machine"]
                rows = {x["variant"]: x for x in doc["rows"]}
                tokens = a.per_rank * n * a.context
                samples[n].append({v: tokens / rows[k]["step_s"] for v, k in
                                   (("no_comm", "no communication"), ("bucketed", bucketed))})
                cmds[n] = " ".join(cmd[:-2] + ["--json", f"w{n}.json"])
    result = {"benchmark": "weak_scaling", "machine": machine, "command": f"/usr/bin/python3 scripts/bench/weak_scaling.py "
              f"--rounds {a.rounds} --ranks {a.ranks} --per-rank {a.per_rank} --net {a.net} --preset {a.preset} "
              f"--context {a.context} --cap {a.cap:g} --steps {a.steps}" +
              (f" --cpus-per-rank {a.cpus_per_rank}" if a.cpus_per_rank else ""), "rows": []}
    if a.cpus_per_rank:
        result["cpus_per_rank"] = a.cpus_per_rank
    for n in ranks:
        row = {"world_size": n, "per_rank": a.per_rank, "global_batch": a.per_rank * n, "preset": a.preset,
               "context": a.context, "link": f"simulated {a.net} link per rank", "launch": cmds[n], "bucket_cap_MB": a.cap}
        for v in ("no_comm", "bucketed"):
            tok = [s[v] for s in samples[n]]
            eff = [s[v] / (n * one[v]) for s, one in zip(samples[n], samples[1])]  # against 1 rank, same round
            row[f"tokens_per_s_{v}"] = float(np.median(tok))
            row[f"tokens_per_s_{v}_samples"] = tok
            row[f"efficiency_{v}"] = float(np.median(eff))
            row[f"efficiency_{v}_samples"] = eff
        result["rows"].append(row)
        print(f"{n} rank(s): tokens/s no communication {row['tokens_per_s_no_comm']:.0f} (efficiency "
              f"{row['efficiency_no_comm']:.2f}), buckets {row['tokens_per_s_bucketed']:.0f} "
              f"(efficiency {row['efficiency_bucketed']:.2f})")
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
