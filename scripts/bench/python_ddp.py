#!/usr/bin/env python3
"""The same Python Transformer stepping with PyTorch's DistributedDataParallel and with ddp_from_scratch's
DDPBucketed (stage 05's C++ buckets), alternated step by step in one launch: the page's table (docs/python.md).

One rank of a launch, like scripts/peers/torch_ddp.py (whose model, data, loss and timing it reuses):

    ./build/bin/ddp_launch --nproc 2 --net 1gbit -- /usr/bin/python3 scripts/bench/python_ddp.py \\
        --preset tiny --batch 4 --context 128 --warmup 2 --steps 20 --caps-mib 25,1 \
        --json docs/results/python_ddp_tiny_1gbit.json

Per bucket cap, two replicas of the model, seeded alike: one wrapped in torch.nn.parallel.DistributedDataParallel
(the cap in MiB), one in ddp_from_scratch.DDPBucketed (the same bytes in MB: 25 MiB = 26.2144 MB), each with its own
AdamW (lr 1e-4). PyTorch's DDP also gives the first gradients (the last layers') a bucket of 1 MiB of their own
(dist._DEFAULT_FIRST_BUCKET_BYTES), so that their all-reduce starts early; stage 05 has no such bucket, and with a
1 MiB cap the two bucket the same way. Each step trains every replica on the same rows, the order rotating step by
step, a barrier before each; a step's time is the slowest rank's,
from zero_grad to optimizer.step (ours includes finish_gradient_synchronization, PyTorch's waits inside backward).
The check comes first: after the first step both replicas must hold the same parameters within 1e-6 (both average
the same gradients, PyTorch dividing before its sum and ours after, which is exact for 2 ranks: x/2 + y/2 = (x+y)/2
in binary; one AdamW step of lr 1e-4 then differs by at most a few ulps of the weights, < 1e-7). Exit 1 otherwise.

Rank 0 writes {"benchmark": "python_ddp", rows: [{variant, step_samples_s, ...}], ...}: per-step paired samples,
so the page's ratio is the median of per-step ratios with its bootstrap interval (scripts/pages/make_tables.py).
Exit codes: 0 done, 1 the check failed, 2 bad input.
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "peers"))
import torch_ddp as peer  # noqa: E402  (the Transformer, data, loss and process setup of PyTorch's peer)

from ddp_from_scratch import DDPBucketed  # noqa: E402

MIB_IN_MB = 2**20 / 1e6  # PyTorch's bucket cap is in MiB, ours in MB (10^6 bytes)
THEIRS, OURS = "PyTorch DDP", "ddp_from_scratch DDPBucketed"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny", help="Transformer size: " + ", ".join(peer.PRESETS))
    ap.add_argument("--batch", type=int, default=4, help="global batch, sequences per step split over the ranks")
    ap.add_argument("--context", type=int, default=128, help="tokens per sequence")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps (the first one is the check)")
    ap.add_argument("--steps", type=int, default=16, help="timed steps of each variant")
    ap.add_argument("--caps-mib", default="25,1", help="bucket caps, MiB, comma-separated (default 25,1)")
    ap.add_argument("--json", metavar="FILE", help="rank 0 writes the results here")
    a = ap.parse_args(argv)
    peer.dplib.check_preset_args(ap, a, ("batch", "context", "steps"))
    if a.warmup < 1:
        ap.error(f"--warmup must be at least 1 (the first step is the check), got {a.warmup}")
    try:
        a.caps = [float(c) for c in a.caps_mib.split(",")]
    except ValueError:
        ap.error(f"--caps-mib {a.caps_mib}: give numbers of MiB separated by commas, such as 25,1")
    if not a.caps or min(a.caps) <= 0:
        ap.error(f"--caps-mib {a.caps_mib}: every cap must be positive")
    return a


def main(argv):
    a = parse_args(argv)
    threads = peer.configure_cpu_threads()
    rank, world = peer.init_process_group()
    if a.batch % world:
        print(f"[rank {rank}/{world}] error: --batch {a.batch} cannot be split over {world} ranks", file=sys.stderr)
        return 2
    wrapped, replicas, params = {}, {}, 0  # variant name -> wrapped model; -> the bare model inside
    for cap in a.caps:
        for side in (THEIRS, OURS):
            model, params, problem = peer.build_model(a)  # seed 0 each time: the same weights
            if problem:
                print(f"[rank {rank}/{world}] error: {problem}", file=sys.stderr)
                return 1
            name = f"{side}, {cap:g} MiB buckets"
            replicas[name] = model
            wrapped[name] = (DistributedDataParallel(model, bucket_cap_mb=cap) if side == THEIRS else
                             DDPBucketed(model, bucket_size_mb=cap * MIB_IN_MB))
    variants = list(wrapped)
    opts = {v: torch.optim.AdamW(m.parameters(), lr=1e-4) for v, m in wrapped.items()}
    times = {v: [] for v in variants}
    per_rank = a.batch // world
    for i in range(a.warmup + a.steps):
        gx, gy = peer.token_batch(a.batch, a.context, peer.VOCAB, peer.DATA_SEED, i)
        x, y = gx[rank * per_rank:(rank + 1) * per_rank], gy[rank * per_rank:(rank + 1) * per_rank]
        order = variants[i % len(variants):] + variants[:i % len(variants)]  # none always first, or last
        for v in order:
            model, opt, ours = wrapped[v], opts[v], v.startswith(OURS)
            dist.barrier()
            t0 = time.perf_counter()
            if ours:
                model.on_train_batch_start()
            opt.zero_grad()
            peer.lm_loss(model(x), y).backward()
            if ours:
                model.finish_gradient_synchronization()
            opt.step()
            if i >= a.warmup:
                times[v].append(time.perf_counter() - t0)
        if i == 0:  # the check, before anything is timed: every replica holds PyTorch's first replica's weights
            first = replicas[variants[0]]
            diff = max((p - q).abs().max().item() for v in variants[1:]
                       for p, q in zip(first.parameters(), replicas[v].parameters()))
            if diff > 1e-6:
                print(f"[rank {rank}/{world}] FAIL: after one step the replicas differ by {diff:.3g} (> 1e-6)",
                      file=sys.stderr, flush=True)
                return 1
            if rank == 0:
                print(f"check: after one step PyTorch's DDP and ours agree within {diff:.3g} (<= 1e-6): PASS",
                      flush=True)
    slowest = {v: peer.slowest_per_step(times[v], world) for v in variants}
    if rank == 0:
        for v in variants:
            print(f"{v}: step {statistics.median(slowest[v]):.3f} s (median of {a.steps}, slowest rank)", flush=True)
        for cap in a.caps:
            ours, theirs = slowest[f"{OURS}, {cap:g} MiB buckets"], slowest[f"{THEIRS}, {cap:g} MiB buckets"]
            ratios = [o / t for o, t in zip(ours, theirs)]
            print(f"{cap:g} MiB: ours / PyTorch's, per step: median x{statistics.median(ratios):.3f} "
                  f"[{min(ratios):.3f}-{max(ratios):.3f}]", flush=True)
        if a.json:
            machine = f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, {threads} thread(s) per rank"
            # The package as this run imported it: an installed one, or the build's (PYTHONPATH=build/python).
            where = f"PYTHONPATH={os.environ['PYTHONPATH']} " if os.environ.get("PYTHONPATH") else ""
            rows = [{"variant": v, "group": 0, "cap_mib": float(v.split(", ")[1].split()[0]), "ours": v.startswith(OURS),
                     "step_s": statistics.median(slowest[v]), "step_samples_s": slowest[v],
                     "tokens_per_s": a.batch * a.context / statistics.median(slowest[v])} for v in variants]
            doc = {"benchmark": "python_ddp", "machine": machine,
                   "command": where + (os.environ.get("DP_LAUNCH_COMMAND") or " ".join([sys.executable] + sys.argv)),
                   "torch_version": torch.__version__, "world": world, "preset": a.preset, "params": params,
                   "global_batch": a.batch, "context": a.context, "warmup": a.warmup, "steps": a.steps,
                   "link": peer.link_description(), "caps_mib": a.caps, "rows": rows}
            with open(a.json + ".tmp", "w") as f:
                json.dump(doc, f, indent=2)
            os.replace(a.json + ".tmp", a.json)
    dist.barrier()
    return 0


if __name__ == "__main__":
    try:
        rc = main(sys.argv[1:])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception as e:
        print(f"[rank {os.environ.get('RANK', 0)}/{os.environ.get('WORLD_SIZE', 1)}] error: {type(e).__name__}: {e}",
              file=sys.stderr)
        rc = 1
    peer.leave(rc)
