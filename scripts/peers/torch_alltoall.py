#!/usr/bin/env python3
"""Why common/ builds Gloo's all-to-all from sends and receives: Gloo's own alltoall, timed beside the same
exchange done point to point and beside an all-reduce of the same buffer, in PyTorch over the same Gloo.

Run it through the launcher, on a simulated link, with the pip LibTorch 2.x environment's Python
(scripts/setup/install_torch2.sh makes it):

    ./build/bin/ddp_launch --nproc 2 --net 1gbit -- build-venv/torch2/bin/python scripts/peers/torch_alltoall.py
        [--json docs/results/alltoall.json]    (appends its rows; scripts/pages/make_tables.py shows them)

Each rank holds S bytes (default 37.3 MB: the tiny Transformer's fp32 gradients) cut into N chunks; every
way of exchanging them is first checked against the closed form (rank r ends with chunk r of every
rank), then timed: a barrier, one exchange, the slowest rank, the median over the iterations. An
all-to-all and the point-to-point exchange both send (N-1)/N x S per rank; the all-reduce sends twice that.
"""
import argparse, json, os, statistics, time
import torch, torch.distributed as dist


def machine():
    """As common/measure/results.cpp writes it: CPU model, cores, RAM, and here the PyTorch that ran."""
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, PyTorch {torch.__version__} (Python)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=int, default=37_266_432, help="S, bytes per rank (a multiple of 4 x N)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json", help="append the rows to this results file (benchmark 'alltoall')")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // n))
    if a.bytes % (4 * n):
        raise SystemExit(f"--bytes {a.bytes}: give a multiple of 4 x {n}")
    c = a.bytes // 4 // n  # floats per chunk
    x = torch.arange(n * c, dtype=torch.float32) + r * n * c  # chunk j of rank r: values r*n*c + j*c + k
    y = torch.empty_like(x)

    def p2p():  # every receive posted, then every send, as common/dist/dist.cpp does
        reqs = [dist.irecv(y[p * c:(p + 1) * c], p, tag=1) for p in range(n) if p != r]
        reqs += [dist.isend(x[p * c:(p + 1) * c], p, tag=1) for p in range(n) if p != r]
        y[r * c:(r + 1) * c].copy_(x[r * c:(r + 1) * c])
        for q in reqs:
            q.wait()

    ways = {"all_to_all_single (Gloo's)": lambda: dist.all_to_all_single(y, x), "isend/irecv, all posted": p2p}
    want = torch.cat([torch.arange(c, dtype=torch.float32) + i * n * c + r * c for i in range(n)])
    for name, f in ways.items():
        y.zero_()
        f()
        if not torch.equal(y, want):
            raise SystemExit(f"rank {r}: {name} gave a wrong result")
    ways["all_reduce (twice the bytes)"] = lambda: dist.all_reduce(y)
    rows = []
    for name, f in ways.items():
        f()  # warm-up
        times = []
        for _ in range(a.iters):
            dist.barrier()
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        every = [None] * n
        dist.all_gather_object(every, times)
        rows.append((name, statistics.median(max(ts[i] for ts in every) for i in range(a.iters))))
    if r == 0:
        sent = (n - 1) / n * a.bytes
        link = f"simulated {os.environ['DP_NET']} link per rank" if os.environ.get("DP_NET") else "loopback"
        print(f"PyTorch {torch.__version__}, Gloo, {n} ranks, {a.bytes / 1e6:.1f} MB per rank, {link}; "
              f"median of {a.iters}, slowest rank")
        print("| exchange | time (ms) | MB sent per rank | MB/s per rank |\n|---|---|---|---|")
        out = []
        for name, s in rows:
            mb = (2 if name.startswith("all_reduce") else 1) * sent / 1e6
            print(f"| {name} | {s * 1e3:.0f} | {mb:.1f} | {mb / s:.0f} |")
            out.append({"exchange": name, "link": link, "world_size": n, "bytes_per_rank": a.bytes, "iters": a.iters,
                        "time_median_s": s, "sent_MB": mb, "rate_MBps": mb / s,
                        "command": os.environ.get("DP_LAUNCH_COMMAND") or "python3 scripts/peers/torch_alltoall.py",
                        "machine": machine()})
        if a.json:
            doc = json.load(open(a.json)) if os.path.exists(a.json) else {"benchmark": "alltoall", "rows": []}
            doc["rows"] += out
            doc["command"], doc["machine"] = out[0]["command"], out[0]["machine"]
            json.dump(doc, open(a.json, "w"), indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
