"""DDP wrappers around a PyTorch nn.Module: stage 04's per-parameter overlap, stage 05's buckets.

Each is an nn.Module whose .module is the wrapped model (same parameters, same order) and whose forward runs it.
Construction broadcasts rank 0's parameters and buffers and hooks every trainable parameter's AccumulateGrad
node; after loss.backward(), finish_gradient_synchronization() leaves in each .grad the average over the ranks.
"""
import math
from typing import List, Optional

import torch
import torch.distributed as dist
from torch import nn

from . import _C
from ._group import process_group

# Gloo and NCCL sum these in every torch this package builds against (Gloo 1.13 has no bfloat16).
_SENDABLE = {"gloo": (torch.float32, torch.float64, torch.float16), "nccl": (torch.float32, torch.float64,
                                                                           torch.float16, torch.bfloat16)}


def _model_tensors(who: str, module: nn.Module, backend: str, one_dtype: bool = False):
    """The wrapped model as the C++ classes take it: names, parameters (tied weights once, frozen ones too) and
    buffers, checked for what the collectives cannot carry."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"{who}(module): module must be a torch.nn.Module, got {type(module).__name__}")
    named = list(module.named_parameters())  # nn.Module already lists a tied weight once
    if not named:
        raise ValueError(f"{who}: {type(module).__name__} has no parameters to synchronize")
    names = [n for n, _ in named]
    params = [p for _, p in named]
    first = params[0]
    for n, p in named:
        if p.device != first.device:
            raise ValueError(f"{who}: parameter {n} is on {p.device} but {names[0]} is on {first.device}; "
                             "move the whole model to one device (model.to(device)) before wrapping it")
        if p.requires_grad and p.dtype not in _SENDABLE[backend]:
            raise ValueError(f"{who}: parameter {n} is {p.dtype}, which {backend} cannot all-reduce here; "
                             f"use one of {', '.join(str(d) for d in _SENDABLE[backend])} (model.float())")
    trainable = [(n, p) for n, p in named if p.requires_grad]
    if one_dtype and len({p.dtype for _, p in trainable}) > 1:
        (n0, p0), (n1, p1) = trainable[0], next((n, p) for n, p in trainable if p.dtype != trainable[0][1].dtype)
        raise ValueError(f"{who}: {n0} is {p0.dtype} but {n1} is {p1.dtype}, and a bucket is one flat buffer of one "
                         "dtype; give the model one dtype (model.float()), or use DDPIndividualParameters")
    if backend == "nccl" and first.device.type != "cuda":
        raise ValueError(f"{who}: the nccl process group moves CUDA tensors only, and the model is on {first.device}; "
                         "model.cuda() first, or init_process_group('gloo')")
    return names, params, list(module.buffers())


class _Synchronized(nn.Module):
    """What the two wrappers share: .module, forward, and the checks around the engine's calls."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def on_train_batch_start(self) -> None:
        """Call at the very start of each step: raises RuntimeError when the last step was never finished."""
        self._engine.on_train_batch_start()

    def finish_gradient_synchronization(self) -> None:
        """Call after loss.backward() and before optimizer.step(): waits for the all-reduces still in flight and
        leaves the average over ranks in every trainable parameter's .grad."""
        if self._engine.launched_count == 0 and not self._backward_seen():
            raise RuntimeError(f"{type(self).__name__}.finish_gradient_synchronization() before any backward: "
                               "call loss.backward() on the wrapped model's output first")
        self._engine.finish_gradient_synchronization()

    def _backward_seen(self) -> bool:
        return any(p.grad is not None for p in self.module.parameters() if p.requires_grad)


class DDPIndividualParameters(_Synchronized):
    """Stage 04: one asynchronous all-reduce per parameter tensor, launched from its gradient hook while backward
    goes on (CS336 2025's DDPIndividualParameters)."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        pg = process_group()
        names, params, buffers = _model_tensors(type(self).__name__, module, dist.get_backend())
        self._engine = _C.OverlapDdp(pg, names, params, buffers)


class DDPBucketed(_Synchronized):
    """Stage 05: gradients gathered into buckets of at most bucket_size_mb megabytes (10^6 bytes), in reverse
    parameter order, each all-reduced as soon as it is full (CS336 2025's DDPBucketed). bucket_size_mb None is
    one bucket of unbounded size; a tensor larger than the cap gets a bucket of its own."""

    def __init__(self, module: nn.Module, bucket_size_mb: Optional[float] = 25.0):
        super().__init__(module)
        who = type(self).__name__
        if bucket_size_mb is not None and (isinstance(bucket_size_mb, bool) or
                                           not isinstance(bucket_size_mb, (int, float))):
            raise TypeError(f"{who}(bucket_size_mb={bucket_size_mb!r}): a number of megabytes, or None for one bucket")
        if bucket_size_mb is not None and not (bucket_size_mb > 0 and math.isfinite(bucket_size_mb)):
            raise ValueError(f"{who}(bucket_size_mb={bucket_size_mb!r}): must be a positive number of megabytes "
                             "(10^6 bytes; e.g. 25, PyTorch's default), or None for one bucket of unbounded size")
        pg = process_group()
        names, params, buffers = _model_tensors(who, module, dist.get_backend(), one_dtype=True)
        if bucket_size_mb is None:  # larger than the whole model: every trainable gradient in one bucket
            bucket_size_mb = sum(p.numel() * p.element_size() for p in params) / 1e6 + 1.0
        self._engine = _C.BucketedDdp(pg, names, params, buffers, float(bucket_size_mb))

    @property
    def buckets(self) -> List[List[str]]:
        """The parameter names in each bucket, bucket 0 (all-reduced first) first."""
        return self._engine.buckets

    def no_sync(self):
        """Like torch's DDP.no_sync(): backward passes inside only accumulate .grad locally."""
        return _NoSync(self._engine)


class DDP(DDPIndividualParameters):
    """CS336 2026's DDP: the overlapped DDP of one all-reduce per parameter tensor (stage 04)."""


class _NoSync:
    def __init__(self, engine):
        self._engine = engine

    def __enter__(self):
        self._before = self._engine.requires_gradient_sync
        self._engine.set_requires_gradient_sync(False)

    def __exit__(self, *exc):
        self._engine.set_requires_gradient_sync(self._before)

