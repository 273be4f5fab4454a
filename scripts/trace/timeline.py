#!/usr/bin/env python3
"""Draws one training step per variant from a trace (`--bench ... --trace FILE`) as a PNG timeline.

  timeline.py TRACE [--variant NAME ...] [--round N] [-o OUT.png] [--title T]

What the picture shows: one panel per variant, stacked, all on the same time axis, in ms since the
step began (the earliest rank's start), so the panels compare at a glance. In a panel every rank has
two lanes:
  compute        forward / backward / sync / optimizer as bars (one colour per phase; the light grey
                 bar behind them is that rank's whole step), and a small black tick at the top for
                 each "ready" instant: a gradient (stage 04) or a bucket (stage 05) ready to send;
  communication  every collective launched in that step, from launch to completion, one colour per
                 operation; collectives in flight at the same time are stacked on sub-lanes (past 8,
                 they wrap around and are drawn semi-transparent on top of each other).
What to look for: in stage 03 the all-reduce starts only after backward ends; in stages 04/05 the
collectives start during backward and hide behind it, and the step gets shorter by what they hide.

--variant: exact name or a unique substring ('flat', 'bucketed 1 MB'); default: every variant but
the reference all-reduce. --round: a round number as recorded (the warm-up steps are not recorded);
default: the round whose step took the median time on rank 0. Each panel also prints one line:
step, backward, communication (union of the collective spans) and hidden (communication that ran
while backward did) in ms, for rank 0.
"""
import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from dplib import trace as tl  # noqa: E402

PHASE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "sync": "#C44E52", "optimizer": "#55A868"}
OP_COLOURS = ["#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD"]
MAX_SUBLANES = 8


def sublanes(spans):
    """Greedy lane per span (the first whose last span has ended), as in common/base/trace.cpp."""
    free_at, lanes = [], []
    for s in spans:
        k = next((i for i, f in enumerate(free_at) if f <= s.ts), len(free_at))
        if k == len(free_at):
            free_at.append(0)
        free_at[k] = s.end
        lanes.append(k)
    return lanes, max(1, len(free_at))


def draw_panel(ax, steps, t0, op_colour, lanes_y):
    for s in steps:
        y = lanes_y[s.rank]  # compute lane at y, communication lane at y - 1
        ax.barh(y, s.dur / 1e3, left=(s.ts - t0) / 1e3, height=0.8, color="#E8E8E8", zorder=1)
        for p in sorted(s.phases, key=lambda p: -p.dur):  # longest first: spans nested in sync stay visible
            ax.barh(y, p.dur / 1e3, left=(p.ts - t0) / 1e3, height=0.6, color=PHASE_COLOURS.get(p.name, "k"),
                    zorder=2)
        ticks = [(i.ts - t0) / 1e3 for i in s.instants if "ready" in i.name]
        if ticks:
            ax.vlines(ticks, y + 0.22, y + 0.4, color="black", linewidth=0.6, zorder=3)
        comms = sorted(s.comms, key=lambda c: c.ts)
        lane, n = sublanes(comms)
        rows = min(n, MAX_SUBLANES)
        h = 0.8 / rows
        for c, k in zip(comms, lane):
            top = y - 1 + 0.4 - (k % rows) * h
            ax.barh(top - h / 2, max(c.dur, 1) / 1e3, left=(c.ts - t0) / 1e3, height=h * 0.9,
                    color=op_colour[c.args.get("op", c.name)], alpha=0.9 if k < rows else 0.45,
                    edgecolor="white", linewidth=0.3, zorder=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--variant", action="append", help="variant to draw (repeatable; exact or unique substring)")
    ap.add_argument("--round", type=int, help="round number (default: the median-duration round on rank 0)")
    ap.add_argument("-o", "--output", help="PNG to write (default: TRACE with .png)")
    ap.add_argument("--title", help="figure title (default: the trace's file name)")
    args = ap.parse_args()
    try:
        t = tl.load(args.trace)
        names = [tl.match_variant(t, v) for v in args.variant] if args.variant else \
            [v for v in tl.variants(t) if v != tl.REFERENCE]
        chosen = []
        for v in dict.fromkeys(names):
            rounds = tl.rounds_of(t, v)
            if args.round is None:
                r = tl.median_round(t, v) if rounds else None
            elif args.round in rounds:
                r = args.round
            else:
                raise tl.TraceError(f"round {args.round} is out of range: {v!r} has rounds "
                                    f"{', '.join(map(str, rounds)) or 'none recorded (leave out --round)'}")
            steps = tl.steps_of(t, v, round_=r) if r is not None else \
                [tl.steps_of(t, v, rank=p)[-1] for p in sorted(t.steps) if tl.steps_of(t, v, rank=p)]  # reference
            chosen.append((v, r, steps))
    except tl.TraceError as e:
        print(f"timeline.py: {e}", file=sys.stderr)
        return 2

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ranks = sorted(t.steps)
    ops = sorted({c.args.get("op", c.name) for _, _, steps in chosen for s in steps for c in s.comms})
    op_colour = {op: OP_COLOURS[i % len(OP_COLOURS)] for i, op in enumerate(ops)}
    lanes_y = {r: 2 * (len(ranks) - 1 - i) + 1 for i, r in enumerate(ranks)}  # rank 0 on top
    panel_h = 0.55 + 0.42 * 2 * len(ranks)
    legend_h = 1.1
    fig_h = legend_h + panel_h * len(chosen) + 0.5
    fig, axes = plt.subplots(len(chosen), 1, sharex=True, figsize=(12, fig_h), squeeze=False)
    axes = axes[:, 0]
    span = 0
    for ax, (v, r, steps) in zip(axes, chosen):
        t0 = min(s.ts for s in steps)
        span = max(span, max(s.end for s in steps) - t0)
        draw_panel(ax, steps, t0, op_colour, lanes_y)
        first = [s for s in steps if s.rank == ranks[0]][0]
        comm, bwd, hidden = tl.overlap(first)
        where = f"round {r}" if r is not None else "(no round)"
        head = f"{v}, {where}: step {first.dur / 1e3:.1f} ms"
        stats = (f"(rank {ranks[0]}: backward {bwd / 1e3:.1f} ms, communication {comm / 1e3:.1f} ms, "
                 f"hidden behind backward {hidden / 1e3:.1f} ms)")
        # A long variant name pushes the numbers off the figure: put them on a line of their own.
        ax.set_title(head + ("\n" if len(head) + len(stats) > 140 else "   ") + stats, fontsize=9.5, loc="left")
        print(f"{v} {where} (rank {ranks[0]}): step {first.dur / 1e3:.2f} ms, backward {bwd / 1e3:.2f} ms, "
              f"communication {comm / 1e3:.2f} ms, hidden {hidden / 1e3:.2f} ms")
        ax.set_yticks([y for r_ in ranks for y in (lanes_y[r_], lanes_y[r_] - 1)])
        ax.set_yticklabels([f"{t.ranks.get(r_, f'rank {r_}')} {lane}" for r_ in ranks for lane in ("compute", "comm")],
                           fontsize=8)
        ax.set_ylim(-0.6, 2 * len(ranks) - 0.4)
        for r_ in ranks[1:]:
            ax.axhline(lanes_y[r_] + 0.5, color="#BBBBBB", linewidth=0.6)
        ax.grid(axis="x", color="#DDDDDD", linewidth=0.5, zorder=0)
        ax.set_axisbelow(True)
    axes[-1].set_xlim(0, span / 1e3 * 1.02)
    axes[-1].set_xlabel("time since the step's start (ms)")

    handles = [Patch(color=c, label=p) for p, c in PHASE_COLOURS.items()
               if any(ph.name == p for _, _, steps in chosen for s in steps for ph in s.phases)]
    handles += [Patch(color=op_colour[op], label=op) for op in ops]
    if any("ready" in i.name for _, _, steps in chosen for s in steps for i in s.instants):
        handles.append(Line2D([], [], color="black", marker="|", linestyle="None", markersize=8, label="ready"))
    handles.append(Patch(color="#E8E8E8", label="whole step"))
    fig.suptitle(args.title or os.path.basename(args.trace), y=1 - 0.08 / fig_h, va="top", fontsize=12)
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, 1 - 0.36 / fig_h))
    fig.subplots_adjust(top=1 - legend_h / fig_h, bottom=0.45 / fig_h, left=0.13, right=0.98, hspace=0.45)
    out = args.output or os.path.splitext(args.trace)[0] + ".png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
