"""A torch.distributed program started by ddp_launch: the launcher's environment is torchrun's.

Joins a Gloo process group with init_method env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
checks an all-reduce and an all-gather against their closed forms, and prints one PASS line on rank 0.
"""
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://", timeout=__import__("datetime").timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
assert int(os.environ["LOCAL_RANK"]) == rank, "one node: LOCAL_RANK equals RANK"
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
want = world * (world + 1) / 2  # 1 + 2 + ... + W
if not torch.all(t == want):
    sys.exit(f"[rank {rank}/{world}] all_reduce gave {t[0].item()}, expected {want}")
parts = [torch.empty(1) for _ in range(world)]
dist.all_gather(parts, torch.tensor([float(rank)]))
if [p.item() for p in parts] != [float(r) for r in range(world)]:
    sys.exit(f"[rank {rank}/{world}] all_gather gave {parts}")
dist.barrier()
if rank == 0:
    print(f"PASS: torch {torch.__version__} joined ddp_launch's group of {world}; all_reduce and all_gather exact")
dist.destroy_process_group()
