"""DDP from Python: stage 04's and stage 05's C++ classes under a Python model equal single-process training.

Each case trains the three toy models for 5 SGD steps on 2 ranks, every rank on its half of a batch of 20 rows,
and compares every parameter after every step with one process training on all 20 rows. The ranks start from
different weights (seeded by rank): the wrapper must broadcast rank 0's, frozen and buffers included.
Planted mistakes (test_planted_mistakes_are_caught) prove the checks can fail.
"""
import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conftest import run_ranks
from models import MODELS, data

import ddp_from_scratch as dfs
from ddp_from_scratch import cs336_adapters as adapters

STEPS = 5
# The two runs differ only in how each gradient is summed: 20 rows at once against 10 + 10 rows and an
# all-reduce. Each gradient element is a sum of 20 products, so the two orders differ by at most about
# log2(20) + 2 ~ 6 roundings of fp32 (2^-24 relative each): ~4e-7 relative. Five SGD steps of lr 0.1 move a
# weight of size ~0.3 by at most ~0.1 x |g| per step, so the difference stays under 1e-6 absolute, ten times
# inside CS336's own bound, torch.allclose's defaults (rtol 1e-5, atol 1e-8).
RTOL, ATOL = 1e-5, 1e-8


def wrap(kind, module):
    """The wrappers under test, by name (a spawned rank rebuilds them from the name)."""
    if kind == "individual":
        return adapters.get_ddp_individual_parameters(module)
    if kind.startswith("bucketed"):
        mb = kind.split(":")[1]
        return adapters.get_ddp_bucketed(module, None if mb == "none" else float(mb))
    if kind == "ddp2026":
        return adapters.get_ddp(module)
    return PLANTED[kind](module)


def after_backward(kind, ddp, opt):
    if kind == "individual":
        adapters.ddp_individual_parameters_on_after_backward(ddp, opt)
    elif kind == "ddp2026":
        adapters.ddp_on_after_backward(ddp, opt)
    else:
        adapters.ddp_bucketed_on_after_backward(ddp_model=ddp, optimizer=opt)


def check_against_one_process(rank, world, kind):
    for name, cls in MODELS.items():
        torch.manual_seed(rank)  # every rank builds different weights
        ddp = wrap(kind, cls())
        assert isinstance(ddp, nn.Module) and [n for n, _ in ddp.module.named_parameters()] == \
            [n[len("module."):] for n, _ in ddp.named_parameters()]
        for key, t in ddp.module.state_dict().items():  # rank 0's everywhere, frozen ones and buffers too
            copies = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(copies, t)
            assert all(torch.equal(c, copies[0]) for c in copies), f"{name}: {key} differs between ranks"
        baseline = copy.deepcopy(ddp.module)
        frozen = {n: p.detach().clone() for n, p in baseline.named_parameters() if not p.requires_grad}
        opt_one = torch.optim.SGD(baseline.parameters(), lr=0.1)
        opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.1)
        x, y = data()
        rows = x.shape[0] // world
        mine = slice(rank * rows, (rank + 1) * rows)
        for step in range(STEPS):
            if kind != "individual":
                adapters.ddp_bucketed_on_train_batch_start(ddp_model=ddp, optimizer=opt_ddp)
            opt_one.zero_grad()
            opt_ddp.zero_grad()
            nn.functional.mse_loss(baseline(x), y).backward()
            opt_one.step()
            nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
            after_backward(kind, ddp, opt_ddp)
            opt_ddp.step()
            for (n, one), mine_p in zip(baseline.named_parameters(), ddp.module.parameters()):
                assert torch.allclose(one, mine_p, rtol=RTOL, atol=ATOL), \
                    f"{name}, step {step}, rank {rank}: {n} differs from one process by {(one - mine_p).abs().max():.3g}"
            for n, p in ddp.module.named_parameters():
                if n in frozen:
                    assert torch.equal(p, frozen[n]), f"{name}: frozen {n} moved"
            perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(42 + step))
            x, y = x[perm], y[perm]


@pytest.mark.parametrize("kind", ["individual", "bucketed:0.0016", "bucketed:0.0001", "bucketed:0.01",
                                  "bucketed:none", "ddp2026"])
def test_equals_one_process(kind):
    run_ranks(check_against_one_process, 2, kind)


def bucket_counts(rank, world, expected):
    for (model, mb), count in expected.items():
        torch.manual_seed(0)
        ddp = dfs.DDPBucketed(MODELS[model](), mb)
        assert len(ddp.buckets) == count, f"{model} at {mb} MB: {ddp.buckets}"
        # Reverse parameter order, frozen tensors never in a bucket.
        order = [n for b in ddp.buckets for n in b]
        trainable = [n for n, p in ddp.module.named_parameters() if p.requires_grad]
        assert order == list(reversed(trainable)), order


def test_bucket_counts():
    # Greedy packing in reverse parameter order, 1 MB = 10^6 bytes: ToyModel's trainable tensors are 400, 2000 and
    # 1000 bytes, the tied model's 400, 2000, 2000 and 1000 (docs/cs336_map.md works these out).
    expected = {("toy", 0.0016): 3, ("toy", 0.0001): 3, ("toy", 0.01): 1, ("toy", None): 1,
                ("tied", 0.0016): 4, ("tied", 0.0001): 4, ("tied", 0.01): 1, ("tied", None): 1}
    run_ranks(bucket_counts, 2, expected)


# ----- planted mistakes: each must make check_against_one_process fail -----


class MissingDivision(dfs.DDPBucketed):
    """Sums the gradients but forgets to divide by the number of ranks."""

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.mul_(dist.get_world_size())


class NeverSynchronized(dfs.DDPIndividualParameters):
    """Leaves every rank with its own gradient (finish forgotten: the stage-04 all-reduces are never waited for,
    and the C++ class then refuses the next step)."""

    def finish_gradient_synchronization(self):
        pass

    def on_train_batch_start(self):
        pass


class OneBucketLeftLocal(dfs.DDPBucketed):
    """Synchronizes every bucket but the last, whose parameters keep this rank's own gradient."""

    def finish_gradient_synchronization(self):
        last = set(self.buckets[-1])
        local = {n: p.grad.clone() for n, p in self.module.named_parameters() if n in last and p.grad is not None}
        super().finish_gradient_synchronization()
        for n, p in self.module.named_parameters():
            if n in local:
                p.grad.copy_(local[n])


class BucketSentEarly(dfs.DDPBucketed):
    """A bucket launched before its last gradient arrived (emulated, as the C++ suite's SentBeforeReady does): the
    first parameter of bucket 0 still held zeros in its slot when the bucket was sent, so its average is zero."""

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        first = self.buckets[0][0]
        dict(self.module.named_parameters())[first].grad.zero_()


class NoBroadcast(dfs.DDPBucketed):
    """Starts from each rank's own weights (the constructor's broadcast undone)."""

    def __init__(self, module):
        own = copy.deepcopy(module.state_dict())
        super().__init__(module, 0.0016)
        module.load_state_dict(own)


PLANTED = {"missing_division": lambda m: MissingDivision(m, 0.0016), "never_synchronized": NeverSynchronized,
           "one_bucket_left_local": lambda m: OneBucketLeftLocal(m, 0.0016), "no_broadcast": NoBroadcast,
           "bucket_sent_early": lambda m: BucketSentEarly(m, 0.0016)}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_planted_mistakes_are_caught(kind):
    with pytest.raises(Exception, match="AssertionError"):
        run_ranks(check_against_one_process, 2, kind)
