"""Bad input from Python raises ValueError, TypeError or RuntimeError naming the value and the remedy: never a
crash, never a hang. And a module built for another torch refuses to import, naming both versions."""
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import run_ranks
from models import MODELS, TokenModel

import ddp_from_scratch as dfs


def test_no_process_group():
    # In this (pytest's own) process no group was ever initialised.
    for make in (lambda: dfs.DDPIndividualParameters(MODELS["toy"]()), lambda: dfs.DDPBucketed(MODELS["toy"](), 1),
                 lambda: dfs.FSDP(TokenModel()),
                 lambda: dfs.ShardedOptimizer(MODELS["toy"]().parameters(), torch.optim.SGD, lr=0.1)):
        with pytest.raises(RuntimeError, match=r"init_process_group\('gloo'\) first"):
            make()


def raises(exc, pattern, f):
    with pytest.raises(exc, match=pattern):
        f()


def one_rank_checks(rank, world):
    toy = MODELS["toy"]
    # Bucket sizes: not a number, not positive, not finite.
    raises(TypeError, r"bucket_size_mb='25'.*megabytes", lambda: dfs.DDPBucketed(toy(), "25"))
    for bad in (-1, 0, float("nan"), float("inf")):
        raises(ValueError, r"bucket_size_mb=.*must be a positive number", lambda: dfs.DDPBucketed(toy(), bad))
    # Not a module; dtypes the collectives cannot carry; mixed dtypes in one bucket.
    raises(TypeError, r"module must be a torch.nn.Module, got str", lambda: dfs.DDP("model"))
    raises(ValueError, r"parameter weight is torch.bfloat16, which gloo cannot all-reduce here; use one of",
           lambda: dfs.DDP(nn.Linear(4, 4, bias=False).bfloat16()))
    mixed = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).double())
    raises(ValueError, r"0.weight is torch.float32 but 1.weight is torch.float64.*model.float\(\)",
           lambda: dfs.DDPBucketed(mixed, None))
    # finish before any backward.
    ddp = dfs.DDPIndividualParameters(toy())
    raises(RuntimeError, r"before any backward: call loss.backward\(\)", ddp.finish_gradient_synchronization)
    # The optimizer class: an instance, or not an optimizer at all.
    model = toy()
    raises(TypeError, r"must be a torch.optim.Optimizer class", lambda: dfs.ShardedOptimizer(
        model.parameters(), torch.optim.SGD(model.parameters(), lr=0.1), lr=0.1))
    raises(TypeError, r"must be a torch.optim.Optimizer class",
           lambda: dfs.ShardedOptimizer(model.parameters(), nn.Linear, lr=0.1))
    raises(ValueError, r"empty parameter list", lambda: dfs.ShardedOptimizer([], torch.optim.SGD, lr=0.1))
    # FSDP: a compute dtype it does not know, a model with nothing to shard, a tied sharded weight.
    raises(ValueError, r"compute_dtype=torch.float64.*use None", lambda: dfs.FSDP(TokenModel(), torch.float64))
    raises(ValueError, r"no trainable Linear or Embedding", lambda: dfs.FSDP(nn.Sequential(nn.LayerNorm(4))))
    tied = TokenModel()
    tied.head.weight = tied.embed.weight
    raises(ValueError, r"tied weight.*untie them", lambda: dfs.FSDP(tied))


def test_bad_arguments_on_one_rank():
    run_ranks(one_rank_checks, 1)


def different_models(rank, world):
    model = nn.Linear(4, 4 + rank)  # rank 1 built another shape
    raises(ValueError, r"ranks built different models: parameter 0 \(weight\) has shape \[5, 4\] on rank 1 but "
                       r"\[4, 4\] on rank 0", lambda: dfs.DDP(model)) if rank == 1 else \
        raises(ValueError, r"ranks built different models", lambda: dfs.DDP(model))


def test_ranks_with_different_models_fail_together():
    run_ranks(different_models, 2)


def test_module_built_for_another_torch_refuses_to_import(tmp_path):
    package = os.path.dirname(dfs.__file__)
    copy = tmp_path / "ddp_from_scratch"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"), symlinks=False)
    (copy / "_build_info.py").write_text('TORCH_VERSION = "0.9.9"\n')
    out = subprocess.run([sys.executable, "-c", "import ddp_from_scratch"], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ddp_from_scratch was built against torch 0.9.9, but this Python imports "
                           f"torch {torch.__version__}") and "pip install --force-reinstall --no-deps ./python" in last, last
