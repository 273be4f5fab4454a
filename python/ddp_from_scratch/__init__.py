"""ddp_from_scratch from Python: the C++ stages' DDP and sharded optimizer under a PyTorch nn.Module.

The classes here are thin: the forward and backward stay PyTorch's, and the gradients are hooked, bucketed
and sent by the stages' own C++ classes (stage 04's OverlapDdp, stage 05's BucketedDdp, extension 06b's
ShardedOptimizer, stage 07's Fsdp) on the default process group that torch.distributed.init_process_group made.

    import torch.distributed as dist
    from ddp_from_scratch import DDPBucketed
    dist.init_process_group("gloo")
    model = DDPBucketed(MyModel(), bucket_size_mb=25)
    for x, y in batches:
        model.on_train_batch_start(); opt.zero_grad()
        loss_fn(model(x), y).backward()
        model.finish_gradient_synchronization(); opt.step()

The page is docs/python.md; CS336's adapter functions are in ddp_from_scratch.cs336_adapters.
"""
from ._loader import load_module as _load_module

_C = _load_module()

from .ddp import DDP, DDPBucketed, DDPIndividualParameters  # noqa: E402
from .fsdp import FSDP  # noqa: E402
from .optim import ShardedOptimizer  # noqa: E402

__all__ = ["DDP", "DDPBucketed", "DDPIndividualParameters", "FSDP", "ShardedOptimizer"]
