"""Python's default process group, handed to the C++ classes (dp::ProcessGroup::adopt)."""
import torch
import torch.distributed as dist

from . import _C

_adopted = None  # (the Python group object, its C++ wrapper): one wrapper per default group


def process_group() -> "_C.ProcessGroup":
    """The default group of torch.distributed as the C++ classes take it. Raises RuntimeError before any
    init_process_group, and for a backend other than gloo or nccl."""
    global _adopted
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ddp_from_scratch needs torch.distributed's default process group, and there is none: "
                           "call torch.distributed.init_process_group('gloo') first (or start under torchrun)")
    group = dist.distributed_c10d._get_default_group()
    if _adopted is not None and _adopted[0] is group:
        return _adopted[1]
    name = dist.get_backend()
    if name not in ("gloo", "nccl"):
        raise RuntimeError(f"backend {name!r}: ddp_from_scratch runs on gloo or nccl; "
                           "call init_process_group('gloo') (CPU) or init_process_group('nccl') (CUDA)")
    device = torch.device("cpu") if name == "gloo" else torch.device("cuda", torch.cuda.current_device())
    # LibTorch 2.x: the group dispatches to a Backend per device, the object that runs the collectives.
    # LibTorch 1.13: the default group is that object (a ProcessGroupGloo).
    backend = group._get_backend(device) if hasattr(group, "_get_backend") else group
    wrapper = _C.ProcessGroup(backend, dist.get_rank(), dist.get_world_size(), name, str(device))
    _adopted = (group, wrapper)
    return wrapper
