#!/usr/bin/env python3
"""Draws the seven pictures of the course's ideas into docs/figures/.

    /usr/bin/python3 scripts/pages/figures.py           # writes docs/figures/*.png (about 2 s)
    /usr/bin/python3 scripts/pages/figures.py --check   # draws them into a temporary folder (ctest docs_figures_render)

What it draws, and from what:
  ring_allreduce.png    the ring all-reduce over N = 4 ranks, step by step: which chunk each rank sends to
                        its right neighbour in the N-1 reduce-scatter and N-1 all-gather steps, partial sum or
                        final, and the bytes each rank sends, 2(N-1)/N x S. Arithmetic: the grid comes from a
                        simulation of the ring below, which asserts that every rank ends with every chunk
                        fully reduced.
  buckets_timeline.png  one measured step of stage 05 (1 MB buckets), rank 0, from
                        docs/results/stage05_tiny_1gbit.trace.json.gz: the step's phases, then one row per
                        bucket's all-reduce on one time axis: an outline from its launch while it waits for one
                        of the group's two Gloo workers, solid while it runs (tl.on_the_link).
  zero_memory.png       training state per rank (parameters, gradients, AdamW state) of DDP, ZeRO-1, ZeRO-2
                        and ZeRO-3/FSDP at N = 1, 2, 4, 8 for the `small` preset, from scripts/pages/accounting.py's
                        parameter count and per-device totals. Arithmetic, not measured.
  fsdp_unit_life.png    one measured step of stage 07's FSDP (variant "fsdp"), rank 0, from
                        docs/results/ext07a_small_1gbit.trace.json.gz: per unit its all-gathers, its forward
                        (waiting for the gather, then computing), its backward and its reduce-scatter.
  grads_after_or_during.png  one measured step of stage 02's naive DDP and one of stage 04's overlap, rank 0,
                        from docs/results/stage05_tiny_1gbit.trace.json.gz: the phases, then every gradient's
                        all-reduce in launch order: after backward (02), or from its hook during backward (04);
                        an outline while it waits for a Gloo worker, solid while it runs.
  zero1_step.png        ZeRO-1's step over N = 4 ranks: what each rank holds of the flat buffer after backward,
                        the reduce-scatter, the step of its chunk and the all-gather, and the bytes it sends,
                        2(N-1)/N x 4P. Arithmetic, not measured.

The traces are read with scripts/dplib/trace.py (the reader scripts/trace/timeline.py uses); the step drawn is the
round whose step took the median time on rank 0, as timeline.py picks it. Nothing is random, so two runs
draw the same pictures (the bytes may differ between matplotlib versions).

Correct output: "wrote docs/figures/NAME.png (W x H px)" for each of the seven and exit 0; with --check,
"figures.py --check: all 6 figures render" and exit 0, or one line per figure that failed (its name and why)
and exit 1.
"""
import argparse
import os
import pathlib
import struct
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402
import accounting  # noqa: E402  (scripts/pages/accounting.py: the per-device formulas)
from dplib import trace as tl  # noqa: E402

ROOT = str(dplib.ROOT)
RESULTS = str(dplib.RESULTS)
FIGURES = os.path.join(ROOT, "docs", "figures")
# 10 inches at 110 dpi: 1100 px, the page width. Heights vary: 4.6 for a grid or bars, more for the
# timelines, whose rows (23 buckets, 14 units) must stay readable.
WIDTH, DPI = 10, 110
# The colours of scripts/trace/timeline.py, so that a phase looks the same in every picture of the course.
PHASE = {"forward": "#4C72B0", "backward": "#DD8452", "sync": "#C44E52", "optimizer": "#55A868"}
GATHER, SCATTER, WAIT = "#8172B3", "#DA8BC3", "#BBBBBB"


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # no display, and the same output everywhere
    import matplotlib.pyplot as plt
    return plt


def median_step(name, variant):
    """Rank 0's step of `variant` in the round whose step on rank 0 took the median time, from the trace
    docs/results/NAME (bench_docs.sh keeps the traces gzipped; Perfetto opens them so): (step, variant,
    round, ms), ms(us) being a time in ms since that step began."""
    t = tl.load(os.path.join(RESULTS, name))
    v = tl.match_variant(t, variant)
    r = tl.median_round(t, v)
    step = tl.steps_of(t, v, rank=0, round_=r)[0]
    return step, v, r, lambda us: (us - step.ts) / 1e3


# ---- 1. the ring all-reduce --------------------------------------------------------------------
def ring_schedule(n):
    """Simulates the ring all-reduce of n chunks over n ranks. Returns [(phase, [(chunk, contributors)
    per rank])] per step: the chunk rank r sends to rank r+1 and how many ranks' inputs it sums."""
    have = [[{r} for _ in range(n)] for r in range(n)]  # have[r][c]: ranks whose chunk c rank r has summed
    steps = []
    for s in range(n - 1):  # reduce-scatter (ring_allreduce.cpp): send chunk r - s - 1, the receiver adds its own
        sent = [((r - s - 1) % n, set(have[r][(r - s - 1) % n])) for r in range(n)]  # every rank sends at once
        for r, (c, part) in enumerate(sent):
            have[(r + 1) % n][c] |= part
        steps.append(("reduce-scatter", [(c, len(part)) for c, part in sent]))
    assert all(len(have[r][r]) == n for r in range(n)), "rank r should own reduced chunk r"
    for s in range(n - 1):  # all-gather: pass the reduced chunks on (chunk r - s), the receiver overwrites
        sent = [((r - s) % n, set(have[r][(r - s) % n])) for r in range(n)]
        for r, (c, part) in enumerate(sent):
            have[(r + 1) % n][c] = part
        steps.append(("all-gather", [(c, len(part)) for c, part in sent]))
    assert all(len(have[r][c]) == n for r in range(n) for c in range(n)), "every chunk should be reduced"
    return steps


def ring_allreduce(out):
    plt = pyplot()
    from matplotlib.patches import Patch, Rectangle
    n = 4
    steps = ring_schedule(n)
    chunk_colour = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
    fig, ax = plt.subplots(figsize=(WIDTH, 4.6))
    for j, (phase, cells) in enumerate(steps):
        for r, (c, k) in enumerate(cells):
            final = phase == "all-gather"
            ax.add_patch(Rectangle((j + 0.04, r - 0.44), 0.92, 0.88, facecolor=chunk_colour[c],
                                   alpha=1.0 if final else 0.35, hatch=None if final else "//",
                                   edgecolor="white" if final else chunk_colour[c], linewidth=0.8))
            what = "final" if final else f"partial: {k} of {n} ranks"
            ax.text(j + 0.5, r, f"chunk {c}\n{what}", ha="center", va="center", fontsize=8.5,
                    color="white" if final else "black", fontweight="bold" if final else "normal")
    rs = sum(1 for p, _ in steps if p == "reduce-scatter")
    ax.axvline(rs, color="black", linewidth=1.5)
    for x0, x1, label in ((0, rs, f"reduce-scatter: N-1 = {rs} steps"),
                          (rs, len(steps), f"all-gather: N-1 = {len(steps) - rs} steps")):
        ax.text((x0 + x1) / 2, -0.72, label, ha="center", va="bottom", fontsize=10.5, fontweight="bold")
    ax.set_xlim(0, len(steps))
    ax.set_ylim(n - 0.5, -0.9)  # rank 0 on top
    ax.set_xticks([j + 0.5 for j in range(len(steps))])
    ax.set_xticklabels([f"step {j + 1}" for j in range(len(steps))])
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"rank {r} -> rank {(r + 1) % n}" for r in range(n)])
    ax.set_xlabel("step (every rank sends one chunk of S/N bytes to its right neighbour at once)")
    ax.set_ylabel("sender -> receiver")
    share = 2 * accounting.ring(n)  # the fraction of the buffer each rank sends: 2 (N-1)/N
    ax.set_title(f"Ring all-reduce of a buffer of S bytes over N = {n} ranks (arithmetic, not a measurement)",
                 fontsize=11.5)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    handles = [Patch(facecolor="#999999", alpha=0.35, hatch="//", edgecolor="#999999",
                     label="partial sum of k ranks' inputs (the receiver adds its own)"),
               Patch(facecolor="#999999", label="final: summed over all N ranks (the receiver keeps it)")]
    fig.legend(handles=handles, loc="center left", ncol=2, frameon=False, fontsize=9,
               bbox_to_anchor=(0.01, 0.125))
    fig.text(0.02, 0.07, f"After step {rs} rank r owns chunk r, fully reduced; after step {len(steps)} "
             f"every rank holds all {n} chunks, fully reduced.", ha="left", va="center", fontsize=9.5)
    fig.text(0.02, 0.025, f"Each rank sends {len(steps)} chunks of S/{n}: 2(N-1)/N x S = {share:g} S for N = {n} "
             f"(and receives as much).", ha="left", va="center", fontsize=10, fontweight="bold")
    fig.subplots_adjust(left=0.15, right=0.98, top=0.87, bottom=0.31)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


# ---- 2. buckets leaving during backward ---------------------------------------------------------
def megabytes(n):
    """10^6 bytes, as the course counts a bucket's cap; a few-kB bucket (the norms' weights) in kB."""
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def buckets_timeline(out):
    plt = pyplot()
    from matplotlib.patches import Patch
    step, variant, rnd, ms = median_step("stage05_tiny_1gbit.trace.json.gz", "bucketed 1 MB (stage 05)")
    buckets = sorted((c for c in step.comms if c.args.get("carries", "").startswith("bucket ")),
                     key=lambda c: int(c.args["carries"].split()[1]))
    if not buckets:
        raise tl.TraceError(f"{variant}, round {rnd}: no 'bucket N' all-reduces on rank 0")
    (b0, b1), = tl.union([(p.ts, p.end) for p in step.phase("backward")])
    during = sum(1 for c in buckets if b0 <= c.ts <= b1)
    comm, bwd, hidden = tl.overlap(step)

    rows = len(buckets) + 1
    fig, ax = plt.subplots(figsize=(WIDTH, 6.6))
    ax.axvspan(ms(b0), ms(b1), color=PHASE["backward"], alpha=0.12, zorder=0)  # backward, across every row
    for p in sorted(step.phases, key=lambda p: -p.dur):
        ax.barh(0, p.dur / 1e3, left=ms(p.ts), height=0.7, color=PHASE.get(p.name, "k"), zorder=2)
    wire = {id(c): start for c, start, _ in tl.on_the_link(step.comms)}  # two at a time, the rest queued
    for i, c in enumerate(buckets, start=1):
        w = wire[id(c)]
        ax.barh(i, (w - c.ts) / 1e3, left=ms(c.ts), height=0.25, color="none", edgecolor=GATHER, linewidth=0.6,
                zorder=2)  # queued behind the buckets before it
        ax.barh(i, (c.end - w) / 1e3, left=ms(w), height=0.7, color=GATHER, zorder=2)
        ax.plot([ms(c.ts)], [i], marker="|", color="black", markersize=7, zorder=3)  # launch = bucket ready
    ax.set_yticks(range(rows))
    ax.set_yticklabels(["compute (rank 0)"] + [f"{c.args['carries']}: {megabytes(c.args.get('bytes', 0))}"
                                               for c in buckets], fontsize=7.5)
    ax.set_ylim(rows - 0.4, -0.6)  # compute on top, bucket 0 (the first to fill) under it
    ax.set_xlim(0, ms(max(step.end, max(c.end for c in buckets))) * 1.01)
    ax.set_xlabel("time since the step's start (ms)")
    ax.set_ylabel("all-reduce of each bucket: queued, then running")
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.5, zorder=0)
    ax.set_axisbelow(True)
    ax.set_title(f"Buckets leave while backward runs: one measured step of stage 05 (1 MB buckets), rank 0\n"
                 f"tiny Transformer, 2 ranks, simulated 1 Gbit/s link; round {rnd}, the median step ({step.dur / 1e3:.0f} ms)\n"
                 f"{during} of {len(buckets)} buckets launched during backward ({bwd / 1e3:.0f} ms); "
                 f"{hidden / 1e3:.0f} of {comm / 1e3:.0f} ms of communication hidden behind it", fontsize=10)
    handles = [Patch(color=PHASE[p], label=p) for p in PHASE if step.phase(p)]
    handles += [Patch(color=GATHER, label="all-reduce of a bucket, running (at most 2 share the link)"),
                Patch(facecolor="none", edgecolor=GATHER, label="queued: both Gloo workers busy"),
                plt.Line2D([], [], color="black", marker="|", linestyle="None", markersize=8,
                           label="launch (bucket ready)"),
                Patch(color=PHASE["backward"], alpha=0.12, label="backward, across all rows")]
    # Top right, under the compute row: the first buckets end early, so nothing is drawn there.
    ax.legend(handles=handles, loc="upper right", bbox_to_anchor=(1.0, 0.955), fontsize=8, frameon=True,
              framealpha=0.95)
    fig.subplots_adjust(left=0.19, right=0.98, top=0.87, bottom=0.08)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return (f"{variant} round {rnd}, rank 0: step {step.dur / 1e3:.1f} ms, backward {ms(b0):.1f}-{ms(b1):.1f} ms, "
            f"{during}/{len(buckets)} buckets launched during backward, the first {(buckets[0].ts - b0) / 1e3:.1f} ms "
            f"into it, "
            f"last completes at {ms(max(c.end for c in buckets)):.1f} ms; communication {comm / 1e3:.1f} ms, "
            f"hidden {hidden / 1e3:.1f} ms")


# ---- 3. ZeRO's memory per rank ------------------------------------------------------------------
# Which of the three kinds of training state each scheme shards over the N ranks (the definition of the
# stages); the byte counts come from accounting.per_device, which the split below must add up to.
SHARDS = {"DDP": (), "ZeRO-1": ("optimizer",), "ZeRO-2": ("gradients", "optimizer"),
          "ZeRO-3 / FSDP": ("parameters", "gradients", "optimizer")}


def zero_memory(out):
    plt = pyplot()
    d, dff, layers, _ = dplib.PRESETS["small"]
    p = dplib.num_parameters(d, dff, layers)
    whole = {"parameters": 4 * p, "gradients": 4 * p, "optimizer": 8 * p}  # fp32 weights and grads, AdamW's 2 moments
    kinds = [("parameters", "#4C72B0"), ("gradients", "#DD8452"), ("optimizer", "#55A868")]
    labels = {"parameters": "parameters (4P bytes)", "gradients": "gradients (4P)",
              "optimizer": "AdamW state: exp_avg, exp_avg_sq (8P)"}
    short = {"DDP": "DDP", "ZeRO-1": "ZeRO-1", "ZeRO-2": "ZeRO-2", "ZeRO-3 / FSDP": "ZeRO-3\nFSDP"}
    ranks = (1, 2, 4, 8)
    fig, ax = plt.subplots(figsize=(WIDTH, 4.8))
    xs, names = [], []
    for g, n in enumerate(ranks):
        totals = accounting.per_device(p, n)
        for k, scheme in enumerate(SHARDS):
            x = g * (len(SHARDS) + 1.2) + k
            part = {kind: whole[kind] / n if kind in SHARDS[scheme] else whole[kind] for kind, _ in kinds}
            total = sum(part.values())
            assert abs(total - totals[scheme][0]) < 1e-6 * total, (scheme, n, total, totals[scheme][0])
            bottom = 0.0
            for kind, colour in kinds:
                ax.bar(x, part[kind] / 1e9, bottom=bottom, width=0.8, color=colour,
                       label=labels[kind] if (g, k) == (0, 0) else None)
                bottom += part[kind] / 1e9
            ax.text(x, bottom + 0.03, f"{total / 1e9:.2f}", ha="center", va="bottom", fontsize=7.5)
            xs.append(x)
            names.append(short[scheme])
        # The group's label under the bars' names: x in data, y in axes units.
        ax.text(g * (len(SHARDS) + 1.2) + (len(SHARDS) - 1) / 2, -0.13, f"N = {n}", ha="center", va="top",
                fontsize=10.5, fontweight="bold", transform=ax.get_xaxis_transform())
    ax.set_xticks(xs)
    ax.set_xticklabels(names, fontsize=7.5)
    ax.set_ylim(0, 16 * p / 1e9 * 1.12)
    ax.set_ylabel("training state per rank (GB = 10^9 B)")
    ax.set_xlabel("scheme, for N ranks", labelpad=20)
    ax.grid(axis="y", color="#DDDDDD", linewidth=0.5)
    ax.set_axisbelow(True)
    ax.set_title(f"Training state per rank: `small` preset, P = {p:,} parameters, fp32 + AdamW\n"
                 f"(arithmetic from scripts/pages/accounting.py's formulas, not measured)", fontsize=10.5, pad=26)
    # Above the plot: every group's first bars reach the top, so inside there is no free corner.
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8.5, frameon=False)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.84, bottom=0.19)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return (f"small, P = {p:,}: DDP {16 * p / 1e9:.2f} GB at every N; at N = 8 ZeRO-1 "
            f"{accounting.per_device(p, 8)['ZeRO-1'][0] / 1e9:.2f}, ZeRO-2 {accounting.per_device(p, 8)['ZeRO-2'][0] / 1e9:.2f}, "
            f"ZeRO-3 / FSDP {accounting.per_device(p, 8)['ZeRO-3 / FSDP'][0] / 1e9:.2f} GB")


# ---- 4. an FSDP unit's life ---------------------------------------------------------------------
def fsdp_unit_life(out):
    plt = pyplot()
    from matplotlib.patches import Patch, Rectangle
    step, variant, rnd, ms = median_step("ext07a_small_1gbit.trace.json.gz", "fsdp")
    fwd = {s.args["unit"]: s for s in step.phase("forward unit")}
    bwd_ready = {i.args["unit"]: i for i in step.instants if i.name == "backward unit"}
    gathers, scatters = {}, {}
    for c in step.comms:
        what = c.args.get("carries", "")
        if what.startswith("gather unit "):
            gathers.setdefault(int(what.split()[-1]), []).append(c)  # forward's, then backward's
        elif what.startswith("reduce-scatter unit "):
            scatters[int(what.split()[-1])] = c
    for g in gathers.values():
        g.sort(key=lambda c: c.ts)  # the lanes interleave in the file
    units = sorted(fwd)
    if not units or not gathers:
        raise tl.TraceError(f"{variant}, round {rnd}: no 'forward unit' spans or unit gathers on rank 0")
    f_end = max(s.end for s in fwd.values())

    fig, ax = plt.subplots(figsize=(WIDTH, 7.8))
    for p in step.phases:
        if p.name in ("forward", "backward"):
            ax.axvspan(ms(p.ts), ms(p.end), color=PHASE[p.name], alpha=0.07, zorder=0)
    for p in sorted((p for p in step.phases if p.name in PHASE), key=lambda p: -p.dur):
        ax.barh(-1, p.dur / 1e3, left=ms(p.ts), height=0.6, color=PHASE[p.name], zorder=2)
    prefetch = {}  # unit k -> (start, end) of the time unit k+1's gather ran while unit k computed
    waits, computes = [], []  # per unit in forward, us: for the line printed (the page quotes it)
    for u in units:
        # Each unit's row: its collectives on the upper half, its compute on the lower half.
        for g in gathers.get(u, []):
            ax.barh(u - 0.2, g.dur / 1e3, left=ms(g.ts), height=0.36, color=GATHER, zorder=2)
        if u in scatters:
            s = scatters[u]
            ax.barh(u - 0.2, s.dur / 1e3, left=ms(s.ts), height=0.36, color=SCATTER, zorder=2)
        # The forward-unit span starts when compute reaches the unit, so it includes the wait for the
        # unit's own gather (gather_in_time.py's definition): drawn grey until that gather completes.
        f = fwd[u]
        own = [g for g in gathers.get(u, []) if g.ts <= f.end]
        ready = min(max(max(g.end for g in own), f.ts), f.end) if own else f.ts
        ax.barh(u + 0.2, (ready - f.ts) / 1e3, left=ms(f.ts), height=0.36, color=WAIT, zorder=2)
        ax.barh(u + 0.2, (f.end - ready) / 1e3, left=ms(ready), height=0.36, color=PHASE["forward"], zorder=2)
        waits.append(ready - f.ts)
        computes.append(f.end - ready)
        # The prefetch: unit u+1's gather in flight while unit u computes.
        nxt = [g for g in gathers.get(u + 1, []) if g.ts <= f_end]
        both = tl.intersect([(ready, f.end)], [(nxt[0].ts, nxt[0].end)]) if nxt else []
        if both:
            prefetch[u] = (both[0][0], both[-1][1])
        # Backward of the unit: the trace has an instant when its weights are back, not a span; the bar
        # runs from there to the launch of its reduce-scatter (its gradients complete).
        if u in bwd_ready:
            b = bwd_ready[u].ts
            ax.plot([ms(b)], [u + 0.2], marker="|", color="black", markersize=8, zorder=3)
            if u in scatters and scatters[u].ts > b:
                ax.barh(u + 0.2, (scatters[u].ts - b) / 1e3, left=ms(b), height=0.36, color=PHASE["backward"],
                        zorder=2)
    if prefetch:  # point at the longest overlap: unit k's compute (lower half) over unit k+1's gather (upper)
        k = max(prefetch, key=lambda u: prefetch[u][1] - prefetch[u][0])
        a, b = prefetch[k]
        ax.add_patch(Rectangle((ms(a), k + 0.0), (b - a) / 1e3, 1.0, fill=False, edgecolor="black",
                               linestyle="--", linewidth=1.0, zorder=4))
        ax.annotate(f"prefetch: unit {k + 1}'s all-gather is in flight\nwhile unit {k} computes "
                    f"({(b - a) / 1e3:.0f} ms of overlap)", xy=(ms(b), k + 0.5), xytext=(ms(b) + 600, k + 0.5),
                    va="center", fontsize=9, arrowprops=dict(arrowstyle="->", color="black"), zorder=5)
    ax.set_yticks([-1] + units)
    ax.set_yticklabels(["step phases"] + [f"unit {u}" for u in units], fontsize=8)
    ax.set_ylim(units[-1] + 0.6, -1.6)
    ax.set_xlim(0, ms(step.end) * 1.005)
    ax.set_xlabel("time since the step's start (ms)")
    ax.set_ylabel("FSDP unit (upper half: its collectives; lower half: its compute)", fontsize=9)
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.5, zorder=0)
    ax.set_axisbelow(True)
    ax.set_title(f"An FSDP unit's life: one measured step of stage 07's FSDP (variant {variant!r}), rank 0\n"
                 f"small Transformer, 2 ranks, simulated 1 Gbit/s link; round {rnd}, the median step "
                 f"({step.dur / 1e3:.0f} ms)\nfor {len(prefetch)} of {len(units) - 1} units k the gather of "
                 f"unit k+1 ran while unit k computed its forward", fontsize=10)
    handles = [Patch(color=GATHER, label="all-gather of the unit's weights"),
               Patch(color=SCATTER, label="reduce-scatter of its gradients"),
               Patch(color=WAIT, label="forward: waiting for its gather"),
               Patch(color=PHASE["forward"], label="forward: computing"),
               Patch(color=PHASE["backward"], label="backward: weights back -> reduce-scatter launch"),
               plt.Line2D([], [], color="black", marker="|", linestyle="None", markersize=8,
                          label="'backward unit': weights gathered")]
    handles += [Patch(color=PHASE[p], label=f"step: {p}") for p in ("sync", "optimizer") if step.phase(p)]
    # Under the plot: the rows fill the axes' corners.
    fig.legend(handles=handles, loc="lower center", fontsize=8, frameon=False, ncol=4)
    fig.subplots_adjust(left=0.1, right=0.98, top=0.89, bottom=0.15)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    fwd_gathers = [g[0].dur for u, g in gathers.items() if g[0].ts <= fwd[u].end]
    forward = sum(p.dur for p in step.phase("forward"))
    return (f"{variant} round {rnd}, rank 0: step {step.dur / 1e3:.1f} ms, forward {forward / 1e3:.1f} ms, "
            f"{len(units)} units, {sum(len(v) for v in gathers.values())} gathers, {len(scatters)} reduce-scatters; "
            f"in forward: gathers {min(fwd_gathers) / 1e3:.0f}-{max(fwd_gathers) / 1e3:.0f} ms, unit compute "
            f"{min(computes) / 1e3:.0f}-{max(computes) / 1e3:.0f} ms, waiting {sum(waits) / 1e3:.0f} ms in all; "
            f"prefetch overlapped compute in {len(prefetch)}/{len(units) - 1} units")


# ---- 5. after backward, or during it: stages 02 and 04 ------------------------------------------
def grads_after_or_during(out):
    plt = pyplot()
    from matplotlib.patches import Patch
    name = "stage05_tiny_1gbit.trace.json.gz"
    panels = [("naive (stage 02)", "stage 02: every gradient all-reduced after backward, one call each"),
              ("overlap (stage 04)", "stage 04: each gradient's all-reduce launched by its hook, during backward")]
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH, 7.4), sharex=True)
    notes, right = [], 0.0
    drawn = []
    for ax, (variant, title) in zip(axes, panels):
        step, v, rnd, ms = median_step(name, variant)
        calls = sorted((c for c in step.comms if c.args.get("op") == "all_reduce"), key=lambda c: c.ts)
        if not calls:
            raise tl.TraceError(f"{v}, round {rnd}: no all-reduces on rank 0")
        (b0, b1), = tl.union([(p.ts, p.end) for p in step.phase("backward")])
        during = sum(1 for c in calls if b0 <= c.ts <= b1)
        drawn.append((ax, step, v, rnd, ms, calls, b0, b1, during, title))
        right = max(right, ms(max(step.end, max(c.end for c in calls))))
    for ax, step, v, rnd, ms, calls, b0, b1, during, title in drawn:
        ax.axvspan(ms(b0), ms(b1), color=PHASE["backward"], alpha=0.12, zorder=0)
        for p in sorted(step.phases, key=lambda p: -p.dur):
            ax.barh(0, p.dur / 1e3, left=ms(p.ts), height=2.4, color=PHASE.get(p.name, "k"), zorder=2)
        wire = {id(c): start for c, start, _ in tl.on_the_link(step.comms)}  # two at a time, the rest queued
        for i, c in enumerate(calls, start=3):
            w = wire[id(c)]
            ax.barh(i, (w - c.ts) / 1e3, left=ms(c.ts), height=0.3, color="none", edgecolor=GATHER, linewidth=0.5,
                    zorder=2)  # queued behind the all-reduces before it
            ax.barh(i, max((c.end - w) / 1e3, 0.3), left=ms(w), height=0.8, color=GATHER, zorder=2)
        ax.set_yticks([0, 3, 2 + len(calls)])
        ax.set_yticklabels(["compute (rank 0)", "1st all-reduce", f"{len(calls)}th"], fontsize=8)
        ax.set_ylim(3 + len(calls), -1.6)
        ax.grid(axis="x", color="#DDDDDD", linewidth=0.5, zorder=0)
        ax.set_axisbelow(True)
        ax.set_title(f"{title}\n{len(calls)} all-reduces, {during} launched during backward; the median step "
                     f"(round {rnd}): {step.dur / 1e3:.0f} ms", fontsize=9.5)
        notes.append(f"{v} round {rnd}: step {step.dur / 1e3:.0f} ms, {during}/{len(calls)} launched during backward")
    axes[-1].set_xlim(0, right * 1.01)
    axes[-1].set_xlabel("time since the step's start (ms); rows: the gradients' all-reduces in launch order")
    handles = [Patch(color=PHASE[p], label=p) for p in PHASE]
    handles += [Patch(color=GATHER, label="one gradient's all-reduce, running (at most 2 share the link)"),
                Patch(facecolor="none", edgecolor=GATHER, label="queued: both Gloo workers busy"),
                Patch(color=PHASE["backward"], alpha=0.12, label="backward, across all rows")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle("One measured step, rank 0: tiny Transformer, 2 ranks, simulated 1 Gbit/s link (both ranks "
                 "start from rank 0's broadcast weights)", fontsize=10)
    fig.subplots_adjust(left=0.14, right=0.98, top=0.88, bottom=0.15, hspace=0.32)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return "; ".join(notes)


# ---- 6. ZeRO-1's step: reduce-scatter, step a chunk, all-gather --------------------------------
def zero1_step(out):
    plt = pyplot()
    from matplotlib.patches import Patch, Rectangle
    n = 4
    colour = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
    # What each rank holds of the flat buffer (chunk c of N) after each phase: "mine" = its own local gradient
    # or the weights before the step, "sum" = summed over the N ranks, "new" = updated weights.
    phases = [
        ("1. after backward", "its own gradient, every chunk", lambda r, c: ("grad", 0.35, "//")),
        ("2. reduce-scatter", "chunk r summed over the ranks", lambda r, c: ("sum", 1.0, None) if c == r else None),
        ("3. step chunk r", "with AdamW's state for chunk r only", lambda r, c: ("new", 1.0, None) if c == r else None),
        ("4. all-gather", "every updated chunk, everywhere", lambda r, c: ("new", 1.0, None)),
    ]
    fig, ax = plt.subplots(figsize=(WIDTH, 4.6))
    gap = 0.6
    for j, (head, sub, held) in enumerate(phases):
        x0 = j * (n + gap)
        ax.text(x0 + n / 2, -0.95, head, ha="center", va="bottom", fontsize=10.5, fontweight="bold")
        ax.text(x0 + n / 2, -0.62, sub, ha="center", va="bottom", fontsize=8.5)
        for r in range(n):
            for c in range(n):
                h = held(r, c)
                if h is None:
                    ax.add_patch(Rectangle((x0 + c + 0.05, r - 0.42), 0.9, 0.84, facecolor="white",
                                           edgecolor="#CCCCCC", linewidth=0.8))
                    continue
                kind, alpha, hatch = h
                ax.add_patch(Rectangle((x0 + c + 0.05, r - 0.42), 0.9, 0.84, facecolor=colour[c], alpha=alpha,
                                       hatch=hatch, edgecolor="black" if kind == "new" else "white",
                                       linewidth=2.0 if kind == "new" else 0.8))
                ax.text(x0 + c + 0.5, r, {"grad": "g", "sum": "sum", "new": "w'"}[kind], ha="center", va="center",
                        fontsize=8, color="black" if kind == "grad" else "white", fontweight="bold")
    ax.set_xlim(-0.2, len(phases) * (n + gap) - gap + 0.2)
    ax.set_ylim(n - 0.45, -1.05)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"rank {r}" for r in range(n)])
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    ring = accounting.ring(n)
    ax.set_title(f"ZeRO-1's step over N = {n} ranks: the flat buffer of P parameters in {n} chunks "
                 f"(arithmetic, not a measurement)", fontsize=11, pad=34)
    handles = [Patch(facecolor="#999999", alpha=0.35, hatch="//", edgecolor="white", label="g: this rank's gradient"),
               Patch(facecolor="#999999", label="sum: the chunk's gradient summed over the ranks"),
               Patch(facecolor="#999999", edgecolor="black", linewidth=2.0, label="w': the chunk's updated weights")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8.5, frameon=False, bbox_to_anchor=(0.5, 0.08))
    fig.text(0.5, 0.035, f"Each rank sends (N-1)/N x 4P bytes in the reduce-scatter and as much in the all-gather: "
             f"2(N-1)/N x 4P = {2 * ring:g} x 4P for N = {n},\nDDP's all-reduce cut in two around the step; "
             f"between steps a rank keeps 1/N of AdamW's state.", ha="center", va="center", fontsize=9.5,
             fontweight="bold")
    fig.subplots_adjust(left=0.08, right=0.99, top=0.80, bottom=0.23)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


# ---- 7. The Python package: what crosses from Python to C++ -------------------------------------
def python_bridge(out):
    plt = pyplot()
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    fig, ax = plt.subplots(figsize=(WIDTH, 5.0))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 6.2)
    ax.axis("off")
    lanes = [(0.2, 3.1, "#E8F0FA", "Python: your script"), (3.45, 6.55, "#F3F3F3", "autograd (LibTorch), shared"),
             (6.9, 9.8, "#FBEDE4", "C++: the stages' classes")]
    for x0, x1, colour, title in lanes:
        ax.add_patch(FancyBboxPatch((x0, 0.25), x1 - x0, 5.45, boxstyle="round,pad=0.02", facecolor=colour,
                                    edgecolor="#BBBBBB"))
        ax.text((x0 + x1) / 2, 5.85, title, ha="center", va="center", fontsize=10.5, fontweight="bold")

    def box(x, y, w, h, text, colour="white", bold=False):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", facecolor=colour, edgecolor="#555555"))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8.5,
                fontweight="bold" if bold else "normal")

    def arrow(a, b, text="", colour="#333333", dy=0.12):
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, color=colour, linewidth=1.3))
        if text:
            ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + dy, text, ha="center", va="bottom", fontsize=7.5,
                    color=colour)

    rows = [4.6, 3.4, 2.2, 1.0]  # bottom of each row's boxes
    box(0.45, rows[0], 2.4, 0.75, "dist.init_process_group('gloo')")
    box(7.15, rows[0], 2.4, 0.75, "dp::ProcessGroup::adopt(\nyour group's own Gloo backend)")
    box(0.45, rows[1], 2.4, 0.75, "model = DDPBucketed(model, 25)\n(your nn.Module inside)", "#FFFFFF", True)
    box(7.15, rows[1], 2.4, 0.75, "BucketedDdp(pg, ModelTensors):\nbroadcast, buckets, hooks", "#FFFFFF", True)
    box(0.45, rows[2], 2.4, 0.75, "loss = f(model(x))\nloss.backward()")
    box(3.7, rows[2], 2.6, 0.75, "each parameter's AccumulateGrad\nadds into .grad: one node, one\nTensorImpl, for "
        "Python and C++")
    box(7.15, rows[2], 2.4, 0.75, "post-hook: copy .grad into its\nbucket; a full bucket's\nall-reduce starts")
    box(0.45, rows[3], 2.4, 0.75, "model.finish_gradient_\nsynchronization(); opt.step()")
    box(7.15, rows[3], 2.4, 0.75, "wait for the last buckets,\ndivide by N, copy into .grad")
    mid = 0.375
    arrow((2.85, rows[0] + mid), (7.15, rows[0] + mid), "group._get_backend(cpu) on torch 2.x; the group on 1.13",
          "#1F5FA8")
    arrow((2.85, rows[1] + mid), (7.15, rows[1] + mid), "named_parameters(), buffers(): the tensors themselves",
          "#1F5FA8")
    arrow((2.85, rows[2] + mid), (3.7, rows[2] + mid))
    arrow((6.3, rows[2] + mid), (7.15, rows[2] + mid), "hook, no GIL", "#A0522D")
    arrow((2.85, rows[3] + mid), (7.15, rows[3] + mid), "one call, the GIL released while it waits", "#1F5FA8")
    ax.set_title("The package: your forward and backward stay PyTorch's; gradients leave through C++ hooks "
                 "on the same AccumulateGrad nodes", fontsize=10.5)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.92, bottom=0.02)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


FIGURES_DRAWN = {"ring_allreduce": ring_allreduce, "buckets_timeline": buckets_timeline,
                 "zero_memory": zero_memory, "fsdp_unit_life": fsdp_unit_life,
                 "grads_after_or_during": grads_after_or_during, "zero1_step": zero1_step,
                 "python_bridge": python_bridge}


def png_size(path):
    """(width, height) from a PNG's header, or None when the file is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="draw into a temporary folder; exit 1 unless all of them are PNGs of a sane size")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = tmp if args.check else FIGURES
        os.makedirs(folder, exist_ok=True)
        failed = []
        for name, draw in FIGURES_DRAWN.items():
            out = os.path.join(folder, name + ".png")
            try:
                note = draw(out)
            except Exception as e:  # one broken picture must not hide the others
                failed.append(f"{name}: drawing failed: {type(e).__name__}: {e}")
                continue
            size = png_size(out) if os.path.isfile(out) else None
            nbytes = os.path.getsize(out) if os.path.isfile(out) else 0
            # 10 x 4-7 inches at 110 dpi is 1100 x 440-800 px; a few KB would be an empty canvas.
            if size is None or not (800 <= size[0] <= 2000 and 300 <= size[1] <= 1200) or nbytes < 20000:
                failed.append(f"{name}: not a PNG of a sane size ({size} px, {nbytes} bytes)")
                continue
            shown = out if args.check else os.path.relpath(out, ROOT)
            print(f"wrote {shown} ({size[0]} x {size[1]} px, {nbytes // 1000} kB)" + (f": {note}" if note else ""))
        for f in failed:
            print(f"figures.py: {f}", file=sys.stderr)
        if failed:
            return 1
        if args.check:
            print(f"figures.py --check: all {len(FIGURES_DRAWN)} figures render")
    return 0


if __name__ == "__main__":
    sys.exit(main())
