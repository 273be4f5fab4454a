#!/usr/bin/env python3
"""PyTorch's own all_reduce over the same Gloo, for comparison with stage01_allreduce.

Starts W processes itself (Debian's torchrun crashes at start), each with its share of the CPU threads,
times all_reduce of a float32 tensor exactly as stage 01 does (5 warm-up iterations, a barrier, then
timed iterations, the slowest rank per iteration, the median), and prints bus bandwidth.

    /usr/bin/python3 scripts/peers/torch_allreduce.py --size 100MB --world 2
Needs Debian's python3-torch (not installed by install_deps.sh; only this comparison uses it).
"""
import argparse, json, os, socket, statistics, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2**10, "mib": 2**20, "gib": 2**30}

def parse_size(text):
    num = text.rstrip("BbKkMmGgIi")
    return int(float(num) * UNITS[text[len(num):].lower() or "b"])

def worker(rank, world, port, nbytes, warmup, iters, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, os.cpu_count() // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.full((nbytes // 4,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == world * (world + 1) / 2), "wrong all_reduce result"
    t.zero_()
    for _ in range(warmup):
        dist.all_reduce(t)
    dist.barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    gathered = [None] * world
    dist.all_gather_object(gathered, times)
    if rank == 0:
        slowest = [max(ts[i] for ts in gathered) for i in range(iters)]
        out.put(statistics.median(slowest))
    dist.destroy_process_group()

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="100MB")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", help="append a row to this results file (benchmark 'allreduce')")
    a = ap.parse_args()
    nbytes = parse_size(a.size)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(worker, args=(a.world, port, nbytes, a.warmup, a.iters, out), nprocs=a.world)
    med = out.get()
    algbw = nbytes / med / 1e9
    busbw = algbw * 2 * (a.world - 1) / a.world
    print(f"pytorch {torch.__version__} gloo: {a.size} x {a.world} ranks: median {med*1e3:.3f} ms, "
          f"algbw {algbw:.2f} GB/s, busbw {busbw:.2f} GB/s")
    if a.json:
        doc = json.load(open(a.json)) if os.path.exists(a.json) else {"benchmark": "allreduce", "rows": []}
        doc["rows"].append({"backend": f"gloo (PyTorch {torch.__version__}, Python)", "device": "cpu",
                            "world_size": a.world, "size": a.size, "bytes": nbytes, "iters": a.iters,
                            "latency_median_s": med, "algbw_GBps": algbw, "busbw_GBps": busbw})
        doc["command"] = doc.get("command", "") + "; " + " ".join(["python3"] + sys.argv)
        json.dump(doc, open(a.json, "w"), indent=2)

if __name__ == "__main__":
    main()
