"""ShardedOptimizer: extension 06b's design of ZeRO-1 around any torch.optim optimizer (CS336's ShardedOptimizer).

Every parameter tensor gets one owner rank (largest first, to the least loaded rank: the C++ partition). Each rank
builds `optimizer_cls` over the tensors it owns only, so it keeps 1/N of the optimizer state; step() runs that
optimizer (Python's own arithmetic, hence bit-identical to the unsharded optimizer) and then the C++ class
broadcasts every tensor from its owner. Gradients must already agree across ranks (DDP's job, or the same data).
"""
import torch
import torch.distributed as dist

from . import _C
from ._group import process_group


class ShardedOptimizer(torch.optim.Optimizer):
    """ShardedOptimizer(params, optimizer_cls, **kwargs): params as for any optimizer (a generator too, or a list of
    groups); optimizer_cls a torch.optim.Optimizer class; kwargs its options (lr, betas, ...)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError(f"ShardedOptimizer(optimizer_cls={optimizer_cls!r}): must be a torch.optim.Optimizer "
                            "class, such as torch.optim.AdamW (the class itself, not an instance)")
        self._engine = _C.ShardedOptimizer(process_group())
        self._rank = dist.get_rank()
        self._optimizer_cls = optimizer_cls
        self._kwargs = dict(kwargs)
        self._local = None         # optimizer_cls over the owned tensors; None while this rank owns none
        self._local_groups = []    # per group of ours: its index in the local optimizer, or None
        super().__init__(params, dict(kwargs))  # calls add_param_group for each group

    def add_param_group(self, param_group: dict) -> None:
        """Adds a group (also while training): its trainable tensors get owners by the same greedy rule, earlier
        owners never change; this rank's optimizer gets the part it owns, with the group's options."""
        super().add_param_group(param_group)  # checks it and fills in the defaults
        group = self.param_groups[-1]
        self._engine.add_param_group(group["params"])
        owned = [p for p in group["params"] if self._engine.owner_of(p) == self._rank]
        if not owned:
            self._local_groups.append(None)
            return
        local_group = {k: v for k, v in group.items() if k != "params"}
        local_group["params"] = owned
        if self._local is None:
            self._local = self._optimizer_cls([local_group], **self._kwargs)
        else:
            self._local.add_param_group(local_group)
        self._local_groups.append(len(self._local.param_groups) - 1)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """Steps the tensors this rank owns, then every tensor is broadcast from its owner (a collective)."""
        self._sync_options()
        loss = None
        if self._local is not None:
            loss = self._local.step(closure, **kwargs) if closure is not None else self._local.step(**kwargs)
        elif closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._engine.broadcast_from_owners()
        return loss

    def _sync_options(self) -> None:
        # A learning-rate scheduler writes into our param_groups: carry every option to the local optimizer.
        for group, local in zip(self.param_groups, self._local_groups):
            if local is None:
                continue
            target = self._local.param_groups[local]
            for key, value in group.items():
                if key != "params":
                    target[key] = value

    def describe(self) -> str:
        """Who owns what: the C++ partition, one line per rank."""
        return self._engine.describe()
