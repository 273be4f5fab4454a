#!/usr/bin/env python3
"""Memory and communication per device for DDP, ZeRO-1/2/3 (FSDP) and tensor parallelism, and per node's uplink on a
cluster of two tiers (stage 10), by arithmetic.

Prints the tables of docs/accounting.md: the formulas evaluated for this project's Transformer presets
(data parallelism and ZeRO per device; tensor parallelism)
(fp32 weights and gradients, AdamW: 16 bytes of training state per parameter), and CS336 2025's
communication_accounting problem (the XXL FFN-only model), and CS336 2026's section 8 calculations (one FFN
layer under DP, FSDP, TP and FSDP x TP) evaluated for datasheet figures. Nothing here is measured; the page
checks the formulas against what stages 05-07 measured.

    python3 scripts/pages/accounting.py            # every table, as Markdown
    python3 scripts/pages/accounting.py --ranks 8  # the preset table for 8 devices
    python3 scripts/pages/accounting.py --check docs/accounting.md   # exit 1 unless the page quotes every line (ctest)
    python3 scripts/pages/accounting.py --json     # the per-device formulas for every preset at N = 1, 2, 3, 4, 8:
                                             # tests/common/test_models.cpp checks common/measure/accounting.cpp against them
"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402


def ring(n):
    """Fraction of a buffer each device sends in a ring all-gather or reduce-scatter: (n-1)/n."""
    return (n - 1) / n


def per_device(p, n):
    """(memory bytes, bytes sent per step) per device for P fp32 parameters on n devices, AdamW."""
    return {
        "DDP": (16 * p, 2 * ring(n) * 4 * p),                      # all-reduce = reduce-scatter + all-gather
        "ZeRO-1 (CS336 design)": (8 * p + 8 * p / n, 2 * ring(n) * 4 * p + ring(n) * 4 * p),  # + broadcasts
        "ZeRO-1": (8 * p + 8 * p / n, 2 * ring(n) * 4 * p),       # reduce-scatter grads, all-gather params
        "ZeRO-2": (4 * p + 12 * p / n, 2 * ring(n) * 4 * p),      # gradients sharded too
        "ZeRO-3 / FSDP": (16 * p / n, 3 * ring(n) * 4 * p),       # gather in forward and backward, reduce-scatter
        "ZeRO-3 / FSDP, bf16 gathers": (16 * p / n, ring(n) * (2 * p + 2 * p + 4 * p)),
    }


def two_tier(p, m, l, k=1):
    """Bytes one node's uplink carries per step, each direction, for P fp32 parameters on m nodes of l ranks with
    k micro-batches (stage 10; common/measure/accounting.cpp's uplink_bytes_per_step()). A flat ring over W = m l
    ranks in rank order crosses each node boundary once: one rank's whole 2(W-1)/W share. The hierarchical
    all-reduce (and HSDP's all-reduce of its shards) sends 2(m-1)/m of each rank's 1/l chunk, l ranks per node.
    Flat FSDP's gathers and reduce-scatter are all-to-alls here: each rank sends (W-l)/W of each buffer off its
    node, three buffers per micro-batch."""
    w, g = m * l, 4 * p
    flat = 2 * (w - 1) / w * g if m > 1 else 0
    hier = 2 * (m - 1) / m * g
    return {"DDP, flat ring": flat, "DDP, hierarchical": hier, "FSDP, flat": 3 * k * l * (w - l) / w * g,
            "HSDP": hier, "HSDP, every micro-batch": k * hier, "HSDP, nothing until the last": hier}


def two_tier_table(m, l, k):
    rows = [f"| preset | P | " + " | ".join(f"{s}: MB" for s in two_tier(1, m, l, k)) + " |",
            "|---|---|" + "---|" * len(two_tier(1, m, l, k))]
    for name, (d, dff, layers, _) in dplib.PRESETS.items():
        p = dplib.num_parameters(d, dff, layers)
        rows.append(f"| {name} | {p:,} | " + " | ".join(f"{b / 1e6:.1f}" for b in two_tier(p, m, l, k).values()) + " |")
    return "\n".join(rows)


def wire_values(d, dff, layers, fmt, block=256, r=4, vocab=dplib.VOCAB):
    """What one rank's whole gradient costs on the wire in bytes, before the ring's 2(N-1)/N (extension 05e):
    P values at 4 B (fp32), 2 B (bf16, fp16) or 1 + 4/B B (int8: one fp32 scale per block of B values); PowerSGD
    sends r (n + m) fp32 values per n x m matrix (embedding and lm_head V x d, per block 4 d x d, 3 d_ff x d)
    and every vector (the norms) whole."""
    p = dplib.num_parameters(d, dff, layers, vocab)
    if fmt == "powersgd":
        matrices = 2 * (vocab + d) + layers * (4 * 2 * d + 3 * (dff + d))
        return 4 * (r * matrices + layers * 2 * d + d)
    return {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1 + 4 / block}[fmt] * p


def low_byte_table(ranks=(2, 4)):
    rows = ["| preset | on the wire | bytes per gradient value | " + " | ".join(f"MB sent per rank per step, N = {n}"
                                                                           for n in ranks) + " |",
            "|---|---|---|" + "---|" * len(ranks)]
    for name in ("tiny", "small"):
        d, dff, layers, _ = dplib.PRESETS[name]
        p = dplib.num_parameters(d, dff, layers)
        for fmt, words in (("fp32", "fp32"), ("bf16", "bf16 or fp16"), ("int8", "int8, blocks of 256"),
                           ("powersgd", "PowerSGD, rank 4")):
            b = wire_values(d, dff, layers, fmt)
            rows.append(f"| {name} | {words} | {b / p:.4f} | " + " | ".join(f"{2 * (n - 1) / n * b / 1e6:.2f}"
                                                                           for n in ranks) + " |")
    return "\n".join(rows)


def preset_table(n):
    rows = ["| preset | P | " + " | ".join(f"{k}: GB, GB sent" for k in per_device(1, n)) + " |",
            "|---|---|" + "---|" * len(per_device(1, n))]
    for name, (d, dff, layers, _) in dplib.PRESETS.items():
        p = dplib.num_parameters(d, dff, layers)
        cells = [f"{m / 1e9:.2f}, {s / 1e9:.2f}" for m, s in per_device(p, n).values()]
        rows.append(f"| {name} | {p:,} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def tp_table(y, tokens):
    """Megatron-style tensor parallelism over y devices, fp32: the block matrices split (16 bytes each of
    4d^2 + 3 d dff parameters divided by y; embeddings, head and norms replicated), and per block two
    all-reduces of the activations in forward and two in backward, each of tokens x d values."""
    rows = [f"| preset | memory per device (GB) | sent per step (GB), {tokens} tokens |", "|---|---|---|"]
    for name, (d, dff, layers, _) in dplib.PRESETS.items():
        p = dplib.num_parameters(d, dff, layers)
        split = layers * (4 * d * d + 3 * d * dff)
        mem = 16 * (p - split) + 16 * split / y
        sent = layers * 4 * 2 * ring(y) * 4 * tokens * d
        rows.append(f"| {name} | {mem / 1e9:.2f} | {sent / 1e9:.3f} |")
    return "\n".join(rows)


def xxl():
    """CS336 2025 communication_accounting: d_model 16384, d_ff 53248, 126 blocks of two linears."""
    d, dff, blocks = 16384, 53248, 126
    p = blocks * 2 * d * dff
    state = 16 * p  # fp32 master weights, accumulated gradients, AdamW's two moments
    act_per_token = blocks * 2 * (d + dff)  # bf16: each block's input x and its hidden activation
    h100, v5p = 80e9, 95e9
    c, w_ici, m_x, m_y, x, y = 4.6e14, 2 * 9e10, 2, 1, 16, 4
    alpha = c / w_ici
    lines = [
        f"- parameters P = 126 x 2 x {d} x {dff} = {p:,}",
        f"- (a) fp32 state 16P = {state / 1e9:,.1f} GB ({state / 2**30:,.0f} GiB): {state / h100:.2f} H100s of 80 GB, "
        f"so {int(-(-state // h100))}; bf16 activations saved for backward, {act_per_token / 1e6:.2f} MB per token",
        f"- (b) 16P / N below 95 GB needs N >= {state / v5p:.2f}, so N_FSDP = {int(-(-state // v5p))} "
        f"before activations",
        f"- (c) alpha = C / W_ici = {alpha:.1f}; FSDP bound: tokens per device B/N > alpha / (M_X Y) = "
        f"{alpha / (m_x * y):.1f}, i.e. B > {alpha / (m_x * y) * x * y:,.0f} tokens in all; TP bound: "
        f"Y <= M_Y d_ff / alpha = {m_y * dff / alpha:.1f} (Y = {y} satisfies it)",
    ]
    return "\n".join(lines)


def s8_bounds(tokens, dff, c, w):
    """CS336 2026 section 8 for one FFN layer (W1, W2: D x D_ff, W3: D_ff x D), 2-byte values, C FLOP/s and
    W bytes/s of egress per device. Compute outlasts communication when (derivations on the page):
    DP and FSDP (both passes): N - 1 <= B W / C;  TP forward: N_TP - 1 <= 3 D_ff W / (2 C) (backward: twice
    that); 2D with the axes overlapping: the product of the two; 2D sharing one network:
    3 D_ff (N_FSDP - 1) + 2 B (N_TP - 1) <= 3 B D_ff W / C, whose best product is returned in closed form
    and checked here against a scan over N_TP."""
    dp = 1 + tokens * w / c
    tp = 1 + 3 * dff * w / (2 * c)
    k = 3 * tokens * dff * w / c
    shared = (k + 3 * dff + 2 * tokens) ** 2 / (24 * tokens * dff)  # u = 3 D_ff N_FSDP, v = 2 B N_TP, u + v fixed

    def n_of(n_tp):  # the largest N_FSDP the shared budget leaves for this N_TP, times N_TP
        return n_tp * (1 + (k - 2 * tokens * (n_tp - 1)) / (3 * dff))
    scan = max(n_of(1 + i * (k / (2 * tokens)) / 100000) for i in range(100001))
    assert abs(scan - shared) <= 1e-6 * shared, (scan, shared)
    return dp, tp, dp * tp, shared


def s8():
    """The section 8 bounds for the 2026 leaderboard's model (d_ff 11008, batch 2 x 32768 tokens) on H100
    SXM datasheet figures: 989 TFLOP/s dense bf16, NVLink 450 GB/s each way. Not measured here."""
    tokens, dff, c, w = 2 * 32768, 11008, 989e12, 450e9
    dp, tp, both, shared = s8_bounds(tokens, dff, c, w)
    return "\n".join([
        f"- C / W = {c / w:,.0f} FLOPs per byte; B = {tokens:,} tokens; D_ff = {dff:,}",
        f"- data_parallel_calcs (c) and fsdp_calcs (c): N <= 1 + B W / C = {dp:.1f}",
        f"- tp_calcs (d): forward N_TP <= 1 + 3 D_ff W / (2 C) = {tp:.2f}; backward N_TP <= {1 + 3 * dff * w / c:.2f}",
        f"- fsdp_tp_calcs (c), axes overlapping: N <= {dp:.1f} x {tp:.2f} = {both:.0f}",
        f"- fsdp_tp_calcs (d), one shared network: N <= {shared:.0f} (scan over N_TP agrees)",
    ])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2, help="devices N for the preset table (default 2)")
    ap.add_argument("--check", metavar="PAGE", help="exit 1 unless PAGE quotes every table row and result line")
    ap.add_argument("--json", action="store_true", help="print the per-device formulas for every preset as JSON")
    a = ap.parse_args()
    if a.ranks < 1:
        ap.error(f"--ranks {a.ranks}: give 1 or more devices")
    if a.json:  # [{preset, params, world, rows: {scheme: [memory bytes, bytes sent per step]}}]
        # "uplink": two_tier() on 2 nodes of n/2 ranks, 3 micro-batches, where n is even.
        print(json.dumps([{"preset": name, "params": dplib.num_parameters(d, dff, layers), "world": n,
                           "rows": per_device(dplib.num_parameters(d, dff, layers), n),
                           "uplink": two_tier(dplib.num_parameters(d, dff, layers), 2, n // 2, 3) if n % 2 == 0 else {}}
                          for name, (d, dff, layers, _) in dplib.PRESETS.items() for n in (1, 2, 3, 4, 8)]))
        return 0
    out = "\n".join([f"Per device, N = {a.ranks}: training-state memory and bytes sent per step (GB = 10^9 B)\n",
                     preset_table(a.ranks),
                     "\nTwo tiers, 2 nodes x 2 ranks, 1 micro-batch: what each node's uplink carries per step, each "
                     "direction (MB = 10^6 B)\n", two_tier_table(2, 2, 1),
                     "\nThe same with 4 micro-batches per step\n", two_tier_table(2, 2, 4),
                     "\nOne DDP step's gradient on the wire, each format of extension 05e (MB = 10^6 B)\n",
                     low_byte_table(),
                     f"\nTensor parallelism over {a.ranks} devices, fp32, batch 4 x context 128:\n",
                     tp_table(a.ranks, 4 * 128),
                     "\nCS336 2025 communication_accounting (XXL, FFN-only):\n", xxl(),
                     "\nCS336 2026 section 8, one FFN layer, H100 SXM datasheet figures (not measured):\n", s8()])
    if a.check:  # every table row and result line must appear on the page verbatim
        page = open(a.check).read()
        missing = [l for l in out.splitlines() if l.startswith(("|", "- ")) and l not in page]
        for l in missing:
            print(f"{a.check} lacks: {l}")
        if missing:
            print("regenerate it from: python3 scripts/pages/accounting.py")
            return 1
        print(f"{a.check}: every line of scripts/pages/accounting.py is on the page")
        return 0
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
