"""ShardedOptimizer from Python: extension 06b's C++ partition and broadcast around a Python torch.optim class.

Every rank trains the same model on the same data (seeded alike), once with the optimizer class itself and once
sharded. The local optimizer steps the owned tensors with Python's own arithmetic, and a broadcast copies bits,
so after 10 steps every parameter must be bit-identical (CS336's bound, rtol 1e-7 with atol 0, is below fp32's
epsilon: it asks for the same bits). The owned tensors' optimizer state is all a rank keeps.
"""
import copy

import pytest
import torch
import torch.distributed as dist

from conftest import run_ranks
from models import MODELS

import ddp_from_scratch as dfs
from ddp_from_scratch import cs336_adapters as adapters

OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, dict(lr=0.1, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
}


def train_both(rank, world, opt_name, make=None):
    cls, kwargs = OPTIMIZERS[opt_name]
    make = make or (lambda params: adapters.get_sharded_optimizer(params, cls, **kwargs))
    for name, model_cls in MODELS.items():
        torch.manual_seed(42)  # the same model and data on every rank: no DDP involved
        model = model_cls()
        sharded_model = copy.deepcopy(model)
        plain = cls(model.parameters(), **kwargs)
        sharded = make(p for p in sharded_model.parameters())  # a generator, as CS336's test passes it
        assert isinstance(sharded, torch.optim.Optimizer)
        for _ in range(10):
            x, y = torch.rand(32, 10), torch.rand(32, 5)
            for m, opt in ((model, plain), (sharded_model, sharded)):
                opt.zero_grad()
                ((y - m(x)) ** 2).sum().backward()
                opt.step()
        for (n, a), b in zip(model.named_parameters(), sharded_model.parameters()):
            assert torch.equal(a, b), f"{name}, {opt_name}, rank {rank}: {n} differs by {(a - b).abs().max():.3g}"
        # This rank's optimizer holds the state of the tensors it owns, and only those.
        if isinstance(sharded, dfs.ShardedOptimizer) and opt_name == "adamw":
            owned = sum(p.numel() for p in sharded_model.parameters() if p.grad is not None and
                        sharded._engine.owner_of(p) == rank)  # AdamW keeps no state for a tensor without a gradient
            kept = sum(s["exp_avg"].numel() for s in sharded._local.state.values()) if sharded._local else 0
            total = sum(p.numel() for p in sharded_model.parameters() if p.requires_grad)
            assert kept == owned < total, f"{name}: rank {rank} keeps state for {kept} of {total} elements"


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_bit_identical_to_the_unsharded_optimizer(opt_name):
    run_ranks(train_both, 2, opt_name)


def check_lr_schedule(rank, world):
    """A scheduler writes the wrapper's param_groups; the local optimizer must follow."""
    torch.manual_seed(0)
    model = MODELS["toy"]()
    twin = copy.deepcopy(model)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    sharded = dfs.ShardedOptimizer(twin.parameters(), torch.optim.SGD, lr=0.1)
    schedules = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (plain, sharded)]
    for _ in range(3):
        x = torch.rand(8, 10)
        for m, o in ((model, plain), (twin, sharded)):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
        for s in schedules:
            s.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_learning_rate_schedule_reaches_the_owners():
    run_ranks(check_lr_schedule, 2)


class NoBroadcast(dfs.ShardedOptimizer):
    """Steps the owned tensors and never sends them: the other rank's copies go stale."""

    def step(self, closure=None):
        self._sync_options()
        if self._local is not None:
            self._local.step()


class NotSharded(dfs.ShardedOptimizer):
    """Every rank steps every tensor: the results are right, the memory is not (only the state check sees it)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        params = list(params)
        super().__init__(params, optimizer_cls, **kwargs)
        self._local = optimizer_cls(params, **kwargs)
        self._local_groups = [0]


PLANTED = {"no_broadcast": NoBroadcast, "not_sharded": NotSharded}


def planted(rank, world, which):
    cls, kwargs = OPTIMIZERS["adamw"]
    train_both(rank, world, "adamw", lambda params: PLANTED[which](params, cls, **kwargs))


@pytest.mark.parametrize("which", sorted(PLANTED))
def test_planted_mistakes_are_caught(which):
    with pytest.raises(Exception, match="AssertionError"):
        run_ranks(planted, 2, which)


# LibTorch's C++ AdamW and Python's torch.optim.AdamW: the same bits on torch 1.13 (both update the first moment with
# mul_ and add_); on 2.x Python's uses lerp_, so the two may part in the last bit of a weight. Each step then
# differs by at most a few roundings of the weights (|w| < 1 here: 2^-23 each), and 10 steps add them up:
# 10 x 4 x 2^-23 = 4.8e-6. Only the Python-stepping ShardedOptimizer is bit-exact on every torch (above).
CPP_ADAMW_BOUND = 10 * 4 * 2.0**-23


def cpp_adamw_against_python(rank, world):
    """LibTorch's C++ AdamW stepping the owned tensors (extension 06b's own step) against Python's AdamW."""
    cls, kwargs = OPTIMIZERS["adamw"]
    for name, model_cls in MODELS.items():
        torch.manual_seed(42)
        model = model_cls()
        twin = copy.deepcopy(model)
        plain = cls(model.parameters(), **kwargs)
        engine = dfs._C.ShardedOptimizer.with_cpp_adamw(dfs._group.process_group(), kwargs["lr"], *kwargs["betas"],
                                                        kwargs["eps"], kwargs["weight_decay"])
        engine.add_param_group(list(twin.parameters()))
        for _ in range(10):
            x, y = torch.rand(32, 10), torch.rand(32, 5)
            plain.zero_grad()
            for p in twin.parameters():
                p.grad = None
            ((y - model(x)) ** 2).sum().backward()
            ((y - twin(x)) ** 2).sum().backward()
            plain.step()
            engine.step()
        for (n, a), b in zip(model.named_parameters(), twin.parameters()):
            diff = (a - b).abs().max().item()
            if int(torch.__version__.split(".")[0]) < 2:
                assert diff == 0, f"{name}: {n}: C++ AdamW differs from Python's by {diff:.3g} on torch 1.13"
            assert diff <= CPP_ADAMW_BOUND, f"{name}: {n}: C++ AdamW differs from Python's by {diff:.3g}"


def test_cpp_adamw_against_pythons():
    run_ranks(cpp_adamw_against_python, 2)
