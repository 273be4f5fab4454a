"""FSDP around a PyTorch nn.Module: stage 07's C++ class shards, gathers and reduce-scatters; forward stays Python's.

Every trainable tensor of a Linear or Embedding (CS336 2026's rule; other modules, such as norms, stay whole and
their gradients are all-reduced) becomes a unit of its own. The module then holds this rank's shard of it as the
parameter (1-D, fp32: the master weights the optimizer steps), and while the module's forward runs, the full
tensor (gathered by the C++ class, in the compute dtype) stands in for it. Backward gathers it again, and its
gradient is reduce-scattered into the shard's .grad (fp32) as soon as it is complete.
"""
from typing import Dict, Optional

import torch
from torch import nn

from . import _C
from ._group import process_group

_SHARDED_TYPES = (nn.Linear, nn.Embedding)


def _is_sharded_module(m: nn.Module) -> bool:
    # torch's Linear and Embedding, and classes of those names (CS336's own cs336_basics.model.Linear).
    return isinstance(m, _SHARDED_TYPES) or type(m).__name__ in ("Linear", "Embedding")


class FSDP(nn.Module):
    """FSDP(module, compute_dtype=None): compute_dtype None computes in float32; torch.float16 or torch.bfloat16
    gathers and computes the sharded modules in that dtype (cast before communicating), while the shards and
    their gradients stay float32."""

    def __init__(self, module: nn.Module, compute_dtype: Optional[torch.dtype] = None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"FSDP(module): module must be a torch.nn.Module, got {type(module).__name__}")
        dtype = torch.float32 if compute_dtype is None else compute_dtype
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"FSDP(compute_dtype={compute_dtype!r}): use None (float32), torch.float16 or "
                             "torch.bfloat16")
        pg = process_group()
        named = list(module.named_parameters())
        for n, p in named:
            on_gloo_off_cpu = p.device.type != "cpu" and torch.distributed.get_backend() == "gloo"
            if p.dtype != torch.float32 or on_gloo_off_cpu:
                raise ValueError(f"FSDP: parameter {n} is {p.dtype} on {p.device}; the shards are float32 master "
                                 "weights: build the model in float32 (model.float()), on the CPU for gloo")
        if dtype == torch.float16 and not cpu_computes_float16() and named[0][1].device.type == "cpu":
            raise ValueError(f"FSDP(compute_dtype=torch.float16): torch {torch.__version__} has no float16 matrix "
                             "product on the CPU; use torch.bfloat16 or None here (float16 runs on torch 2.x)")
        # Which module registers each sharded tensor, under which attribute, in registration order.
        owners = {}
        for mod_name, mod in module.named_modules():
            if not _is_sharded_module(mod):
                continue
            for attr, p in mod._parameters.items():
                if p is None or not p.requires_grad:
                    continue
                if id(p) in owners:
                    raise ValueError(f"FSDP: {mod_name}.{attr} is also {owners[id(p)][2]} (a tied weight); "
                                     "sharding a tensor two modules share is not supported: untie them")
                owners[id(p)] = (mod, attr, f"{mod_name}.{attr}" if mod_name else attr)
        sharded = [p for _, p in named if id(p) in owners]
        if not sharded:
            raise ValueError(f"FSDP: {type(module).__name__} has no trainable Linear or Embedding weight to shard")
        replicated = [p for _, p in named if p.requires_grad and id(p) not in owners]
        self.module = module
        self.compute_dtype = dtype
        self._engine = _C.Fsdp(pg, [n for n, _ in named], [p for _, p in named], list(module.buffers()), sharded,
                               replicated, str(dtype).replace("torch.", ""), True)
        # The surgery: each sharded tensor's place in its module goes to this rank's shard; forward puts the
        # full tensor back while it runs.
        per_module = {}
        for unit, full in enumerate(sharded):
            mod, attr, _ = owners[id(full)]
            shard = self._engine.shard(unit)
            shard.__class__ = nn.Parameter  # the C++ leaf itself (what the stage's reduce-scatter fills)
            mod._parameters[attr] = shard
            per_module.setdefault(id(mod), (mod, []))[1].append((attr, full, shard, unit))
        for mod, entries in per_module.values():
            mod.forward = _gathered_forward(mod, mod.forward, entries, self._engine)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """After loss.backward(), before optimizer.step(): every reduce-scatter done, each shard's .grad the mean
        over ranks (fp32, the shard's shape), the replicated gradients all-reduced and averaged."""
        self._engine.finish_gradient_synchronization()

    def gather_full_params(self) -> Dict[str, torch.Tensor]:
        """Every parameter in full, float32, named as in the wrapped module (no 'module.' prefix). A collective."""
        full = dict(self._engine.gather_full_parameters())
        for n, p in self.module.named_parameters():
            full.setdefault(n, p.detach().clone())  # frozen tensors: never sharded, the same everywhere
        return full


def _gathered_forward(module, original, entries, engine):
    def forward(*args, **kwargs):
        def run(i):
            if i == len(entries):
                return original(*args, **kwargs)
            return engine.run_unit(entries[i][3], lambda: run(i + 1))

        for attr, full, _, _ in entries:
            module._parameters[attr] = full
        try:
            return run(0)
        finally:
            for attr, _, shard, _ in entries:
                module._parameters[attr] = shard

    return forward


def cpu_computes_float16() -> bool:
    """Whether this torch multiplies float16 matrices on the CPU (torch 2.x does; 1.13 does not)."""
    try:
        torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
        return True
    except RuntimeError:
        return False
