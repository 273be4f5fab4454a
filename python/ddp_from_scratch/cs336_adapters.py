"""CS336 Assignment 2's adapter functions, both editions, on this package's classes.

A student's tests/adapters.py becomes `from ddp_from_scratch.cs336_adapters import *`: the names and signatures
are those of tests/adapters.py in the spring 2025 edition (individual-parameter and bucketed DDP, the sharded
optimizer) and the 2026 edition (DDP, FSDP; the sharded optimizer is the same).
"""
from typing import Optional, Type

import torch
from torch import nn

from .ddp import DDP, DDPBucketed, DDPIndividualParameters
from .fsdp import FSDP
from .optim import ShardedOptimizer

# ----- spring 2025 -----


def get_ddp_individual_parameters(module: nn.Module) -> nn.Module:
    return DDPIndividualParameters(module)


def ddp_individual_parameters_on_after_backward(ddp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: nn.Module, bucket_size_mb: Optional[float]) -> nn.Module:
    return DDPBucketed(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.on_train_batch_start()


def get_sharded_optimizer(params, optimizer_cls: Type[torch.optim.Optimizer], **kwargs) -> torch.optim.Optimizer:
    return ShardedOptimizer(params, optimizer_cls, **kwargs)


# ----- 2026 -----


def get_ddp(module: nn.Module) -> nn.Module:
    return DDP(module)


def ddp_on_after_backward(ddp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def get_fsdp(module: nn.Module, compute_dtype: Optional[torch.dtype] = None) -> nn.Module:
    return FSDP(module, compute_dtype)


def fsdp_on_after_backward(fsdp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model: nn.Module) -> dict:
    return fsdp_model.gather_full_params()
