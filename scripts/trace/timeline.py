#!/usr/bin/env python3
"""Draws one training step per variant from a trace (`--bench ... --trace FILE`) as a PNG timeline.

  timeline.py TRACE [--variant NAME ...] [--round N] [-o OUT.png] [--title T]

What the picture shows: one panel per variant, stacked, all on the same time axis, in ms since the
step began (the earliest rank's start), so the panels compare at a glance. In a panel every rank has
two lanes:
  compute        forward / backward / sync / optimizer as bars (one colour per phase; the light grey
                 bar behind them is that rank's whole step), and a small black tick at the top for
                 each "ready" instant: a gradient (stage 04) or a bucket (stage 05) ready to send;
  communication  every collective launched in that step, one colour per operation, as the group runs them:
                 Gloo queues a group's collectives and runs them in launch order on two worker threads,
                 so at most two move bytes at a time, sharing the rank's link. Each is drawn solid on its
                 worker's sub-lane from its start (a worker free) to its completion, and as a thin outline
                 on a strip under them from its launch to its start, while it waited in the queue
                 (dplib.trace.on_the_link).
What to look for: in stage 03 the all-reduce starts only after backward ends; in stages 04/05 the
collectives start during backward and hide behind it, and the step gets shorter by what they hide.

--self-test checks the group's queue (dplib.trace.on_the_link) on made-up spans whose answer is known.

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
        for c, start, w in tl.on_the_link(s.comms):
            colour = op_colour[c.args.get("op", c.name)]
            lane = y - 1 + 0.27 - w * 0.3  # worker 0 above worker 1, the queue's strip under both
            if start > c.ts:  # queued: both workers busy with the collectives launched before it
                ax.barh(y - 1 - 0.3, (start - c.ts) / 1e3, left=(c.ts - t0) / 1e3, height=0.12, color="none",
                        edgecolor=colour, linewidth=0.5, zorder=2)
            ax.barh(lane, max(c.end - start, 1) / 1e3, left=(start - t0) / 1e3, height=0.26, color=colour,
                    alpha=0.9, edgecolor="white", linewidth=0.3, zorder=3)


def self_test():
    """Made-up collectives of one group, in µs, launched a at 0, b at 2, c at 3, d at 30, done at 10, 25, 12, 40.
    Two workers: a and b start when launched; c waits until a's worker is free at 10; d starts at 30 on an idle
    group. Want (name, start, worker): a 0 0, b 2 1, c 10 0, d 30 0. The mutants: drawn from launch to completion
    (c at 3, as if it had a worker of its own), and one worker (c after b, at its own completion 12)."""
    spans = [tl.Span(n, ts, end, {}) for n, ts, end in [("a", 0, 10), ("b", 2, 25), ("c", 3, 12), ("d", 30, 40)]]
    want = [("a", 0, 0), ("b", 2, 1), ("c", 10, 0), ("d", 30, 0)]
    got = [(c.name, start, w) for c, start, w in tl.on_the_link(spans)]
    unqueued = [(c.name, c.ts) for c in spans]
    one_worker = [(c.name, start) for c, start, _ in tl.on_the_link(spans, workers=1)]
    ok = got == want and unqueued != [(n, t) for n, t, _ in want] and one_worker != [(n, t) for n, t, _ in want]
    print(f"timeline.py --self-test: {'PASS' if ok else 'FAIL'}: on the link {got}, want {want}")
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
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
    if any(st > c.ts for _, _, steps in chosen for s in steps for c, st, _ in tl.on_the_link(s.comms)):
        handles.append(Patch(facecolor="none", edgecolor="#555555", label="queued (both workers busy)"))
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
