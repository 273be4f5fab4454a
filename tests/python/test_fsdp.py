"""FSDP from Python: stage 07's C++ class under a Python model equals one process, in float32 and mixed precision.

Two ranks train TokenModel for 3 SGD steps, each on its 10 of 20 rows, and compare gather_full_params() after each
step with one process training on all 20 rows (in the compute dtype where the reference mimics it: weights cast
before the forward, gradients cast back to float32). The module holds shards: each sharded parameter's .grad after
finish is float32 and the shard's shape; the replicated (norm) gradients agree bit for bit across ranks.
"""
import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conftest import run_ranks
from models import TokenModel, tokens

import ddp_from_scratch as dfs
from ddp_from_scratch.fsdp import cpu_computes_float16
from ddp_from_scratch import cs336_adapters as adapters

STEPS, LR = 3, 0.01
# float32: the runs differ only in how gradients are summed (20 rows at once against 10 + 10 and a
# reduce-scatter), a few roundings of 2^-24 relative in gradients of size < 1; SGD at lr 0.01 turns that into
# differences below 1e-8 per step. 1e-6 absolute leaves a factor 30 for the three steps.
# Low precision: both runs compute in the compute dtype, but the reference's 20-row matrix products round
# differently from two 10-row ones: a few units of the format's epsilon (bf16 7.8e-3, fp16 9.8e-4) in
# gradients of size < 1, times lr 0.01 and 3 steps: 3 x 0.01 x 4 eps.
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 3 * LR * 4 * 7.8e-3, torch.float16: 3 * LR * 4 * 9.8e-4}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MixedPrecisionReference:
    """One process computing as FSDP does: sharded modules' weights cast to the compute dtype for forward and
    backward, the gradient cast back to float32 for the float32 master weight the optimizer steps."""

    def __init__(self, model, dtype):
        self.model, self.dtype = model, dtype
        self.casts = []
        for mod in model.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                for attr, p in mod._parameters.items():
                    if p is not None:
                        self.casts.append((mod, attr, p))

    def loss(self, x, y):
        if self.dtype == torch.float32:
            return nn.functional.cross_entropy(self.model(x)[:, -1, :].float(), y)
        self.low = []
        for mod, attr, master in self.casts:
            low = master.detach().to(self.dtype).requires_grad_()
            mod._parameters[attr] = low
            self.low.append((master, low))
        try:
            return nn.functional.cross_entropy(self.model(x)[:, -1, :].float(), y)
        finally:
            for mod, attr, master in self.casts:
                mod._parameters[attr] = master

    def after_backward(self):
        if self.dtype != torch.float32:
            for master, low in self.low:
                master.grad = low.grad.float()


def train_and_compare(rank, world, dtype_name):
    dtype = DTYPES[dtype_name]
    torch.manual_seed(42)
    model = TokenModel()
    reference = MixedPrecisionReference(copy.deepcopy(model), dtype)
    fsdp = adapters.get_fsdp(model, compute_dtype=None if dtype == torch.float32 else dtype)
    assert isinstance(fsdp, nn.Module) and fsdp.module is model
    opt_one = torch.optim.SGD(reference.model.parameters(), lr=LR)
    opt = torch.optim.SGD(fsdp.parameters(), lr=LR)
    x, y = tokens()
    rows = x.shape[0] // world
    mine = slice(rank * rows, (rank + 1) * rows)
    for step in range(STEPS):
        opt_one.zero_grad()
        reference.loss(x, y).backward()
        reference.after_backward()
        opt_one.step()
        opt.zero_grad()
        nn.functional.cross_entropy(fsdp(x[mine])[:, -1, :].float(), y[mine]).backward()
        adapters.fsdp_on_after_backward(fsdp, opt)
        for n, p in fsdp.module.named_parameters():
            assert p.grad is not None and p.grad.dtype == torch.float32 and p.grad.shape == p.shape, \
                f"{n}: grad {None if p.grad is None else (p.grad.dtype, tuple(p.grad.shape))}, parameter {tuple(p.shape)}"
        opt.step()
        full = adapters.fsdp_gather_full_params(fsdp)
        assert list(full) == [n for n, _ in reference.model.named_parameters()], list(full)
        for n, p in reference.model.named_parameters():
            diff = (full[n] - p).abs().max().item()
            assert full[n].shape == p.shape and diff <= TOLERANCE[dtype], \
                f"{dtype_name}, step {step}, rank {rank}: {n} differs from one process by {diff:.3g}"
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(42 + step))
        x, y = x[perm], y[perm]
    # The norms' gradients (replicated) are the same bits on every rank.
    for n, p in fsdp.module.named_parameters():
        if "norm" in n:
            copies = [torch.empty_like(p.grad) for _ in range(world)]
            dist.all_gather(copies, p.grad)
            assert torch.equal(copies[0], copies[1]), n


# float16 where this torch multiplies float16 matrices on the CPU (torch 2.x; 1.13 cannot, and FSDP refuses it
# there: test_refuses_float16_without_cpu_support).
CASES = ["float32", "bfloat16"] + (["float16"] if cpu_computes_float16() else [])


@pytest.mark.parametrize("dtype_name", CASES)
def test_equals_one_process(dtype_name):
    run_ranks(train_and_compare, 2, dtype_name)


def float16_where_the_cpu_computes_it(rank, world):
    if cpu_computes_float16():
        assert dfs.FSDP(TokenModel(), torch.float16).compute_dtype == torch.float16
    else:
        with pytest.raises(ValueError, match="no float16 matrix product on the CPU; use torch.bfloat16 or None"):
            dfs.FSDP(TokenModel(), torch.float16)


def test_float16_refused_only_where_the_cpu_cannot_compute_it():
    run_ranks(float16_where_the_cpu_computes_it, 1)


# ----- planted mistakes -----


class NoReduceScatterWait(dfs.FSDP):
    """Never finishes the gradients: the shards keep no gradient (or a stale one)."""

    def finish_gradient_synchronization(self):
        pass


class ShardNotGathered(dfs.FSDP):
    """Reports this rank's own shards as the full parameters: a shard not gathered."""

    def gather_full_params(self):
        full = super().gather_full_params()
        return {n: (t * 0 if t.numel() > 128 else t) for n, t in full.items()}


PLANTED = {"no_finish": NoReduceScatterWait, "shard_not_gathered": ShardNotGathered}


def planted(rank, world, which):
    adapters.get_fsdp = lambda module, compute_dtype=None: PLANTED[which](module, compute_dtype)
    train_and_compare(rank, world, "float32")


@pytest.mark.parametrize("which", sorted(PLANTED))
def test_planted_mistakes_are_caught(which):
    with pytest.raises(Exception, match="AssertionError"):
        run_ranks(planted, 2, which)
