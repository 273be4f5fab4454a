#!/usr/bin/env python3
"""PyTorch's own DistributedDataParallel on the benchmark of stage 05, for a side-by-side comparison.

One rank of a data-parallel run, started by our launcher like any stage program:

    ./build/bin/ddp_launch --nproc 2 --net 1gbit -- /usr/bin/python3 scripts/peers/torch_ddp.py \\
        --preset tiny --batch 4 --context 128 --warmup 2 --steps 10 --json /tmp/theirs.json
    ./build-torch2/bin/ddp_launch --nproc 2 --net 1gbit -- ./build-venv/torch2/bin/python scripts/peers/torch_ddp.py \\
        --preset tiny --comm-hook fp16                                  # pip PyTorch 2.x, fp16 hook
    /usr/bin/python3 scripts/peers/torch_ddp.py --preset small --check-only   # parameter count only, one process

It trains what common/harness/ddp_bench.cpp trains, rebuilt here in Python: the TransformerLM of
common/model/transformer.cpp (pre-norm RMSNorm blocks, interleaved RoPE, explicit causal attention, SwiGLU,
untied lm_head, no biases, fp32), mean cross-entropy over all tokens (lm_loss), AdamW with lr 1e-4 and
the rest at their defaults (weight decay 0.01, as torch::optim::AdamWOptions), uniform random tokens drawn
per step with the seeding of common/model/data.cpp, the global batch split over the ranks in contiguous rows.
The model is wrapped in torch.nn.parallel.DistributedDataParallel (Gloo, --bucket-cap-mb, optionally
PyTorch's fp16_compress_hook), so gradients are bucketed, all-reduced during backward and averaged.

Timing follows ours: --warmup untimed steps, then --steps timed ones; a barrier before each step (ours
begins each round with a collective, then runs its no-communication step and its DDP step back to back;
with no baseline step here, the barrier lines the ranks up instead), time.perf_counter() around
zero_grad + forward + loss + backward (DDP's all-reduces finish inside it) + optimizer.step(), and the
slowest rank sets each step's time. Each rank uses the CPU threads ours would (OMP_NUM_THREADS from the
launcher, else cores / LOCAL_WORLD_SIZE) and keeps freed memory in the heap as ours does.

Rank 0 prints one summary line and, with --json, writes {"framework": "pytorch", "torch_version", "world",
"preset", "params", "bucket_cap_mb", "comm_hook", "step_s": [slowest rank per step], "median", ...}.
Exit codes: 0 done, 1 the model's parameter count differs from TransformerConfig::num_parameters or
training failed, 2 bad input (an unknown preset, a batch the ranks cannot split).
Works with Debian's PyTorch 1.13 (/usr/bin/python3, python3-torch) and pip PyTorch 2.x.
"""
import argparse
import ctypes
import inspect
import json
import math
import os
import pathlib
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402

PRESETS = dplib.PRESETS  # common/model/transformer.cpp, kPresets: name -> (d_model, d_ff, num_layers, num_heads)
VOCAB = dplib.VOCAB
ROPE_THETA = 10000.0
DATA_SEED = 1234  # common/harness/ddp_bench.cpp: token_batch(..., 1234, step)


class UsageError(Exception):
    """Bad input from the user: exit 2, like dp::UsageError."""


# --- The model: common/model/transformer.cpp, op for op ---------------------------------------------------


def trunc_normal(w, std):
    # The same distribution as ours (N(0, std^2) cut at +-3 std); ours redraws the tails, this uses the
    # inverse CDF. Initial values do not change the time of a step, only the distribution matters.
    with torch.no_grad():
        nn.init.trunc_normal_(w, mean=0.0, std=std, a=-3 * std, b=3 * std)


def linear(d_in, d_out):
    lin = nn.Linear(d_in, d_out, bias=False)  # weight [d_out, d_in], as torch::nn::Linear
    trunc_normal(lin.weight, math.sqrt(2.0 / (d_in + d_out)))
    return lin


def apply_rope(x, positions, theta):
    """Interleaved pairs (2i, 2i+1) rotated by pos * theta^(-2i/Dh); angles in float64, as dp::apply_rope."""
    dh = x.shape[-1]
    inv_freq = torch.pow(theta, torch.arange(0, dh // 2, dtype=torch.float64, device=x.device) * (-2.0 / dh))
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # [T, Dh/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    pairs = x.reshape(*x.shape[:-1], dh // 2, 2)  # [..., T, Dh/2, 2]
    x1, x2 = pairs.select(-1, 0), pairs.select(-1, 1)
    return torch.stack([cos * x1 - sin * x2, sin * x1 + cos * x2], -1).reshape(x.shape)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.to(torch.float32)  # a no-op in fp32, kept so the ops are ours
        inv_rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * inv_rms * self.weight).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads, rope_theta):
        super().__init__()
        self.q_proj = linear(d_model, d_model)
        self.k_proj = linear(d_model, d_model)
        self.v_proj = linear(d_model, d_model)
        self.output_proj = linear(d_model, d_model)
        self.num_heads, self.rope_theta = num_heads, rope_theta

    def forward(self, x):
        B, T, d = x.shape
        H = self.num_heads
        dh = d // H

        def heads(t):
            return t.view(B, T, H, dh).transpose(1, 2)  # [B, H, T, Dh]

        positions = torch.arange(T, dtype=torch.long, device=x.device)
        q = apply_rope(heads(self.q_proj(x)), positions, self.rope_theta)
        k = apply_rope(heads(self.k_proj(x)), positions, self.rope_theta)
        v = heads(self.v_proj(x))
        # Two matmuls, a mask and a softmax like ours (LibTorch 1.13 has no fused attention); PyTorch's
        # scaled_dot_product_attention would do other work and the comparison would not be of DDP alone.
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dh)  # [B, H, T, T]
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        attn = torch.softmax(scores, -1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(B, T, d)
        return self.output_proj(out)


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = linear(d_model, d_ff)
        self.w2 = linear(d_ff, d_model)
        self.w3 = linear(d_model, d_ff)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, d_model, d_ff, num_heads, rope_theta):
        super().__init__()
        # Registration order attn, ffn, ln1, ln2 as ours: the parameter order, hence DDP's initial buckets.
        self.attn = CausalSelfAttention(d_model, num_heads, rope_theta)
        self.ffn = SwiGLU(d_model, d_ff)
        self.ln1 = RMSNorm(d_model)
        self.ln2 = RMSNorm(d_model)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.ffn(self.ln2(h))


class TransformerLM(nn.Module):
    def __init__(self, d_model, d_ff, num_layers, num_heads, context_length, vocab=VOCAB, rope_theta=ROPE_THETA):
        super().__init__()
        self.context_length = context_length
        self.token_embeddings = nn.Embedding(vocab, d_model)
        trunc_normal(self.token_embeddings.weight, 1.0)
        self.layers = nn.ModuleList(TransformerBlock(d_model, d_ff, num_heads, rope_theta) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = linear(d_model, vocab)  # untied, as ours

    def forward(self, tokens):
        x = self.token_embeddings(tokens)  # [B, T, d]
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))  # [B, T, V]


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --- Data: common/model/data.cpp ----------------------------------------------------------------------------


def _mix(z):
    """SplitMix64 finaliser, as common/model/data.cpp (step numbers spread over 64 bits)."""
    m = (1 << 64) - 1
    z = (z + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def token_batch(batch, context, vocab, seed, step):
    """Inputs and next-token targets [batch, context], from a generator of its own seeded by (seed, step)."""
    gen = torch.Generator()
    gen.manual_seed(seed ^ _mix(step))
    tokens = torch.randint(0, vocab, (batch, context + 1), generator=gen, dtype=torch.long)
    return tokens[:, :context].contiguous(), tokens[:, 1:].contiguous()


# --- Process setup ------------------------------------------------------------------------------------


def env_int(name):
    """A positive integer environment variable, or 0 (unset or not a number), as runtime.cpp reads it."""
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() and 0 < int(text) < 4096 else 0


def configure_cpu_threads():
    """dp::configure_cpu_threads: OMP_NUM_THREADS if set (the launcher sets it), else cores / ranks on this machine;
    and keep freed memory in the heap (glibc would unmap and re-fault hundreds of MB each step)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
        libc.mallopt(M_MMAP_THRESHOLD, 512 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    except OSError:
        pass  # not glibc: the allocator's defaults, as ours would have there too
    n = env_int("OMP_NUM_THREADS")
    if n == 0:
        # ranks on this machine: LOCAL_WORLD_SIZE, times DP_NET_NODES under ddp_launch --net-nodes (simulated nodes)
        local = max(1, env_int("LOCAL_WORLD_SIZE") or 1) * max(1, env_int("DP_NET_NODES") or 1)
        n = max(1, (os.cpu_count() or 1) // local)
    torch.set_num_threads(n)
    return n


def init_process_group():
    """Gloo from the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) that ddp_launch
    gives; started without it, one rank on a free local port, as our programs do."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # GLOO_SOCKET_IFNAME (set by ddp_launch --net) is read by Gloo itself: traffic uses the shaped link.
    dist.init_process_group("gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def link_description():
    """As dp::link_description: the simulated link under ddp_launch --net, else loopback."""
    net = os.environ.get("DP_NET", "")
    return f"simulated {net} link per rank" if net else "loopback"


def zero_grad_sets_to_none(opt):
    # Each version's default: False in 1.13 (as LibTorch 1.13's zero_grad), True in 2.x (as LibTorch 2.x's).
    p = inspect.signature(opt.zero_grad).parameters.get("set_to_none")
    return bool(p.default) if p is not None else False


def slowest_per_step(samples, world):
    """Max over ranks of each step's sample (the next step cannot start before the slowest rank is done)."""
    mine = torch.tensor(samples, dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return torch.stack(every).max(0).values.tolist()


# --- Main ---------------------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small", help="Transformer size: " + ", ".join(PRESETS) + " (default small)")
    ap.add_argument("--batch", type=int, default=4, help="global batch, sequences per step split over the ranks")
    ap.add_argument("--context", type=int, default=128, help="tokens per sequence")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0,
                    help="DDP bucket cap (PyTorch's unit: MiB, 2^20 bytes; default 25, PyTorch's default)")
    ap.add_argument("--comm-hook", default="none", choices=["none", "fp16"],
                    help="none: fp32 all-reduce; fp16: PyTorch's default_hooks.fp16_compress_hook")
    ap.add_argument("--json", metavar="FILE", help="rank 0 writes the results here")
    ap.add_argument("--check-only", action="store_true", help="build the model, check its parameter count, exit")
    a = ap.parse_args(argv)
    dplib.check_preset_args(ap, a, ("batch", "context", "steps"))
    if a.warmup < 0:
        ap.error(f"--warmup must be 0 or more, got {a.warmup}")
    if a.bucket_cap_mb <= 0:
        ap.error(f"--bucket-cap-mb must be positive, got {a.bucket_cap_mb:g}")
    return a


def build_model(a):
    """The model on every rank (seed 0, as ours), and None or why it is not ours."""
    d_model, d_ff, layers, heads = PRESETS[a.preset]
    torch.manual_seed(0)  # every rank builds the same model (DDP broadcasts rank 0's anyway)
    model = TransformerLM(d_model, d_ff, layers, heads, a.context)
    params = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    expected = dplib.num_parameters(d_model, d_ff, layers)
    problem = None
    if params != expected:
        problem = (f"the Python model has {params:,} parameters, TransformerConfig::num_parameters gives "
                   f"{expected:,} for --preset {a.preset}: the two models differ")
    elif tensors != 3 + 9 * layers:
        # Ours has 3 + 9 L parameter tensors (num_parameter_tensors); the same count split into other
        # tensors would make other buckets, so it would not be the same model for DDP either.
        problem = f"the Python model has {tensors} parameter tensors, ours {3 + 9 * layers}"
    return model, params, problem


def main(argv):
    a = parse_args(argv)
    threads = configure_cpu_threads()

    if a.check_only:
        _, params, problem = build_model(a)
        d_model, d_ff, layers, _ = PRESETS[a.preset]
        print(f"{a.preset}: {params:,} parameters; TransformerConfig::num_parameters gives "
              f"{dplib.num_parameters(d_model, d_ff, layers):,}: {'MISMATCH: ' + problem if problem else 'match'}",
              flush=True)
        return 1 if problem else 0

    if a.json:  # an unwritable path fails now, not after the whole benchmark
        folder = os.path.dirname(os.path.abspath(a.json))
        if not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
            print(f"error: --json {a.json}: cannot write there; give a path in an existing, writable folder",
                  file=sys.stderr, flush=True)
            return 2
    rank, world = init_process_group()
    tag = f"[rank {rank}/{world}]"
    if a.batch % world:
        print(f"{tag} error: --batch {a.batch} cannot be split evenly over {world} ranks; use a multiple of {world}",
              file=sys.stderr, flush=True)
        return 2

    model, params, problem = build_model(a)
    if problem:
        print(f"{tag} error: {problem}", file=sys.stderr, flush=True)
        return 1
    if rank == 0:
        d_model, d_ff, layers, heads = PRESETS[a.preset]
        print(f"pytorch {torch.__version__} DDP: {a.preset} (d_model {d_model}, d_ff {d_ff}, {layers} layers, "
              f"{heads} heads, ctx {a.context}, vocab {VOCAB}); {params:,} params (= num_parameters); "
              f"global batch {a.batch}, {world} ranks (gloo, {link_description()}), {threads} thread(s) per rank, "
              f"{a.bucket_cap_mb:g} MiB buckets, hook {a.comm_hook}", flush=True)

    ddp = DDP(model, bucket_cap_mb=a.bucket_cap_mb)
    if a.comm_hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)  # the rest at defaults: weight decay 0.01, as ours

    step_s, fwd_s, bwd_s, opt_s = [], [], [], []
    for i in range(a.warmup + a.steps):
        gx, gy = token_batch(a.batch, a.context, VOCAB, DATA_SEED, i)
        per_rank = a.batch // world  # contiguous rows [rank * per_rank, (rank + 1) * per_rank), as shard_rows
        x, y = gx[rank * per_rank:(rank + 1) * per_rank], gy[rank * per_rank:(rank + 1) * per_rank]
        dist.barrier()  # every rank starts the step together, so a step's time is this step's work only
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = lm_loss(ddp(x), y)
        t1 = time.perf_counter()
        loss.backward()  # DDP all-reduces bucket by bucket in here and waits for the last before returning
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i >= a.warmup:
            step_s.append(t3 - t0), fwd_s.append(t1 - t0), bwd_s.append(t2 - t1), opt_s.append(t3 - t2)
        if not math.isfinite(loss.item()):
            print(f"{tag} error: loss is {loss.item()} at step {i}", file=sys.stderr, flush=True)
            return 1

    slowest = slowest_per_step(step_s, world)
    fwd, bwd, optim = (slowest_per_step(s, world) for s in (fwd_s, bwd_s, opt_s))
    if rank == 0:
        med = statistics.median(slowest)
        tokens = a.batch * a.context
        print(f"pytorch {torch.__version__} DDP {a.preset}, {world} ranks, {link_description()}, "
              f"{a.bucket_cap_mb:g} MiB buckets, hook {a.comm_hook}: step {med:.3f} s [{min(slowest):.3f}-"
              f"{max(slowest):.3f}] over {len(slowest)} steps (slowest rank), {tokens / med:.0f} tokens/s; "
              f"forward {statistics.median(fwd):.3f} s, backward+comm {statistics.median(bwd):.3f} s, "
              f"optimizer {statistics.median(optim):.3f} s", flush=True)
        if a.json:
            doc = {
                "framework": "pytorch", "torch_version": torch.__version__, "python": sys.executable,
                "world": world, "preset": a.preset, "params": params, "global_batch": a.batch,
                "context": a.context, "warmup": a.warmup, "steps": a.steps, "threads_per_rank": threads,
                "link": link_description(), "bucket_cap_mb": a.bucket_cap_mb, "bucket_cap_unit": "MiB",
                "comm_hook": a.comm_hook, "zero_grad_set_to_none": zero_grad_sets_to_none(opt),
                "step_s": slowest, "median": med, "min": min(slowest), "max": max(slowest),
                # medians as ours names them; backward includes DDP's communication that was not hidden
                "forward_s": statistics.median(fwd), "backward_s": statistics.median(bwd),
                "optimizer_s": statistics.median(optim),
                "forward_samples_s": fwd, "backward_samples_s": bwd, "optimizer_samples_s": optim,
                "command": os.environ.get("DP_LAUNCH_COMMAND") or " ".join([sys.executable] + sys.argv),
            }
            tmp = a.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=2)
            os.replace(tmp, a.json)  # a reader never sees half a file
    dist.barrier()  # no rank leaves while another may still talk to it
    return 0


def leave(code):
    """Exits without tearing down the process group. With Debian's PyTorch 1.13 a rank once hung for
    good at exit after destroy_process_group() (one thread spinning, the main thread in the Gloo group's
    destructor, after the other rank had closed its sockets); after the final barrier there is nothing
    left to tear down that the kernel does not free, so flush and leave at once."""
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        rc = main(sys.argv[1:])
    except SystemExit as e:  # argparse: exit 2 on bad options, 0 after --help
        rc = e.code if isinstance(e.code, int) else 1
    except Exception as e:  # one line, like our programs, and the code the launcher passes on
        print(f"[rank {os.environ.get('RANK', 0)}/{os.environ.get('WORLD_SIZE', 1)}] error: {type(e).__name__}: {e}",
              file=sys.stderr)
        rc = 1
    leave(rc)
