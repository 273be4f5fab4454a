"""Data-parallel training of a small Transformer, with ddp_from_scratch's bucketed DDP where PyTorch's would be.

    torchrun --standalone --nproc_per_node 2 python/examples/train.py             # ours (stage 05's C++ buckets)
    torchrun --standalone --nproc_per_node 2 python/examples/train.py --torch-ddp # PyTorch's, for comparison
    ./build/bin/ddp_launch --nproc 2 -- python3 python/examples/train.py          # this project's launcher

Both print the same losses (ctest python_example_train checks it): the same averaged gradients, summed by other code.
"""
import argparse
import gc

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_from_scratch import DDPBucketed

parser = argparse.ArgumentParser()
parser.add_argument("--torch-ddp", action="store_true", help="PyTorch's DistributedDataParallel instead of ours")
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
vocab, d, context, batch = 256, 64, 32, 8  # batch: the global batch, 8 sequences split over the ranks
layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, dropout=0.0, batch_first=True)
model = nn.Sequential(nn.Embedding(vocab, d), nn.TransformerEncoder(layer, num_layers=2), nn.Linear(d, vocab))
if args.torch_ddp:
    model = DistributedDataParallel(model, bucket_cap_mb=25)  # 25 MiB
else:
    model = DDPBucketed(model, bucket_size_mb=26.2144)  # the same 25 MiB: ours counts 10^6 bytes to the MB
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

data = torch.Generator().manual_seed(1)  # every rank draws the same global batch and takes its rows
for step in range(args.steps):
    tokens = torch.randint(vocab, (batch, context + 1), generator=data)
    mine = tokens[rank * batch // world:(rank + 1) * batch // world]
    if not args.torch_ddp:
        model.on_train_batch_start()
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(mine[:, :-1]).flatten(0, 1), mine[:, 1:].flatten())
    loss.backward()  # ours: each bucket's all-reduce starts from a C++ hook as soon as the bucket is full
    if not args.torch_ddp:
        model.finish_gradient_synchronization()  # waits for the last buckets; .grad is now the average
    opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)  # the loss over the global batch, for the log
    if rank == 0 and (step % 5 == 4 or step == args.steps - 1):
        print(f"step {step + 1}: loss {mean.item() / world:.6f}", flush=True)
# Free the wrapper before the group: PyTorch's DistributedDataParallel keeps the group alive from its C++ Reducer,
# and with torch 2.15 a Reducer freed at interpreter exit, after destroy_process_group, ended 10 of 102 runs (three at
# a time on two cores) in std::terminate (SIGABRT, no Python frame left); freed here first, 0 of 72.
del model, opt
gc.collect()  # now, even where reference cycles hold the wrapper
dist.destroy_process_group()
