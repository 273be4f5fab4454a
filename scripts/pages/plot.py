#!/usr/bin/env python3
"""Turns benchmark JSON (docs/results/*.json) into the PNG plots the docs show.

    /usr/bin/python3 scripts/pages/plot.py docs/results/allreduce.json docs/results/stage05.json ...
Each file's "benchmark" field picks the plot; the PNG is written next to the JSON (same name, .png).
"""
import re, sys, pathlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402
import matplotlib  # noqa: E402
import matplotlib.ticker
matplotlib.use("Agg")
import matplotlib.pyplot as plt

def link_rate_GBps(link):
    """A simulated link's nominal rate in GB/s ("simulated 1gbit link per rank" -> 0.125), None for loopback."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*gbit", link, re.I)
    return float(m.group(1)) / 8 if m else None

def allreduce(doc, ax):
    """Bus bandwidth against tensor size: one colour per link, one line style per world size, and a dashed
    line at each simulated link's nominal rate (its ceiling)."""
    rows = doc["rows"]
    links = sorted({r.get("link", "loopback") for r in rows}, key=lambda l: -(link_rate_GBps(l) or 1e9))
    worlds = sorted({r["world_size"] for r in rows})
    for li, link in enumerate(links):
        for w in worlds:
            rs = sorted((r for r in rows if r["world_size"] == w and r.get("link", "loopback") == link),
                        key=lambda r: r["bytes"])
            if not rs:
                continue
            ax.plot([r["bytes"] / 1e6 for r in rs], [r["busbw_GBps"] for r in rs], color=f"C{li}",
                    ls="-" if w == worlds[0] else ":", marker="o" if w == worlds[0] else "s",
                    label=f"{rs[0]['backend']}, {w} ranks, {link}")
        rate = link_rate_GBps(link)
        if rate:
            ax.axhline(rate, color=f"C{li}", ls="--", lw=1.2,
                       label=f"{link.replace('simulated ', '').replace(' link per rank', '')} link's nominal rate "
                             f"({rate * 8:g} Gbit/s = {rate:g} GB/s)")
    sizes = sorted({r["bytes"] / 1e6 for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{s:g}" for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("tensor size (MB, float32)")
    ax.set_yscale("log")
    top = max([r["busbw_GBps"] for r in rows] + [link_rate_GBps(l) or 0 for l in links])
    bottom = min([r["busbw_GBps"] for r in rows] + [link_rate_GBps(l) or 1e9 for l in links])
    ticks = [t for t in (0.05, 0.1, 0.125, 0.2, 0.3, 0.5, 0.75, 1, 1.25, 1.5, 2, 3, 5, 10, 20, 50)
             if bottom / 1.5 <= t <= top * 1.5]
    ax.set_ylim(bottom / 1.25, top * 1.25)
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(True, which="major", axis="y", color="0.9")
    ax.set_ylabel("bus bandwidth (GB/s, log scale)")
    ax.set_title("all-reduce bus bandwidth (dashed: a simulated link's nominal rate, its ceiling)", fontsize=11)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))

def ddp(doc, ax):
    """Per variant, the step (median, slowest rank) split into the optimizer step, the time waiting for the
    gradient sync, and the rest (forward + backward). ZeRO-1's reduce-scatter and all-gather run inside its
    optimizer step, so its communication shows in that segment."""
    rows = doc["rows"]
    names = [r["variant"] for r in rows]
    sync = [r.get("sync_s", r.get("comm_s", 0)) for r in rows]
    opt = [min(r.get("optimizer_s", 0), r["step_s"] - c) for r, c in zip(rows, sync)]
    compute = [max(r["step_s"] - c - o, 0) for r, c, o in zip(rows, sync, opt)]
    zero = any("zero" in n.lower() for n in names)
    ax.barh(names, compute, color="C0", label="forward + backward" + (
        " (gathers behind forward: with its all-gathers)" if any("behind forward" in n for n in names) else ""))
    ax.barh(names, opt, left=compute, color="C2",
            label="optimizer step" + (" (ZeRO-1: with its reduce-scatter + all-gather)" if zero else ""))
    ax.barh(names, sync, left=[a + b for a, b in zip(compute, opt)], color="C1", label="waiting for gradient sync")
    # The ratio to the no-communication step of the same round is the comparable number.
    for i, r in enumerate(rows):
        ax.text(r["step_s"] * 1.01, i, f"x{r['ratio_to_no_comm']:.2f}", va="center", fontsize=8)
    ax.set_xlim(0, max(r["step_s"] for r in rows) * 1.15)
    ax.invert_yaxis()
    ax.set_xlabel("s per step (median, slowest rank); xN: step / no-comm step of the same round")
    ax.set_ylabel("variant")
    r0 = rows[0]
    ax.set_title(f"{r0['preset']} Transformer, batch {r0['global_batch']}, context {r0['context']}, "
                 f"{r0['world_size']} ranks, {r0.get('link', 'loopback')}", fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13 - 0.4 / max(len(rows), 5)), ncol=1 if zero else 3,
              fontsize=8)
    # Long variant names and many rows: a figure wide and tall enough that the axes keep a readable size.
    longest = max(len(n) for n in names)
    ax.figure.set_size_inches(max(8, 6.5 + longest * 0.085), max(5, 2.2 + 0.3 * len(rows) + (0.5 if zero else 0)))

def memory(doc, ax):
    rows = doc["rows"]
    names = [f"{r['optimizer']} ({r['world_size']} ranks)" for r in rows]
    parts = [("param_MB", "parameters"), ("grad_MB", "gradients"), ("state_MB_max_rank", "optimizer state")]
    left = [0.0] * len(rows)
    for key, label in parts:
        vals = [r[key] for r in rows]
        ax.barh(names, vals, left=left, label=label)
        left = [a + b for a, b in zip(left, vals)]
    ax.scatter([r["expected_MB"] for r in rows], names, color="k", marker="|", s=400, zorder=3,
               label="formula: AdamW 16P, sharded 8P + 8P/N (P params, N ranks)")
    ax.invert_yaxis()
    ax.set_xlim(0, max(max(left), max(r["expected_MB"] for r in rows)) * 1.08)
    ax.set_xlabel("MB per rank (tensor bytes)")
    ax.set_ylabel("optimizer (world size)")
    ax.set_title(f"{rows[0]['preset']} Transformer: memory per rank with and without ZeRO-1 (|: formula)",
                 fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8)

def fsdp(doc, ax):
    """Stage 07: per variant (and preset) the bytes one rank keeps, stacked, and the gathered peak."""
    rows = doc["rows"]
    names = [f"{r['variant']}, {r['preset']}, {r['compute_dtype']}" for r in rows]
    left = [0.0] * len(rows)
    for key, label in [("param_MB", "parameters (shards)"), ("grad_MB", "gradients (shards)"),
                       ("state_MB", "AdamW state"), ("gathered_peak_MB", "gathered units, peak")]:
        vals = [r[key] for r in rows]
        ax.barh(names, vals, left=left, label=label)
        left = [a + b for a, b in zip(left, vals)]
    ax.scatter([r["expected_MB"] for r in rows], names, color="w", edgecolor="k", marker="D", s=40, zorder=4,
               label="the title's formula (bytes; P parameters, N ranks)")
    rss = [(r["peak_rss_MB"], n) for r, n in zip(rows, names) if r.get("peak_rss_MB", -1) > 0]
    if rss:
        ax.scatter([v for v, _ in rss], [n for _, n in rss], color="k", marker="|", s=400, zorder=3,
                   label="peak RSS (one variant per process)")
    ax.invert_yaxis()
    ax.set_xlim(0, max(left + [r["expected_MB"] for r in rows] + [v for v, _ in rss]) * 1.08)
    ax.set_xlabel("MB per rank")
    ax.set_ylabel("variant, preset, compute dtype")
    ax.set_title(f"memory per rank, {rows[0]['world_size']} ranks: DDP 16P, ZeRO-1 8P + 8P/N, FSDP 16P/N + gathered units", fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8)
    ax.figure.set_size_inches(9, max(5, 2.6 + 0.45 * len(rows)))

def diff_inset(ax, where, ref, curves, styles, title):
    """An inset of how far each curve is from `ref`, step by step (log scale: from rounding to noise)."""
    ins = ax.inset_axes(where)
    for i, c in enumerate(curves, start=1):
        d = [max(abs(a - b), 1e-9) for a, b in zip(ref, c)]
        ins.plot(range(1, len(d) + 1), d, styles[i % len(styles)], lw=0.9, color=f"C{i}")
    ins.set_yscale("log")
    ins.set_ylim(1e-9, 1)
    ins.set_title(title + " per step (1e-9: equal)", fontsize=7)
    ins.tick_params(labelsize=6)


def train_lm(doc, ax):
    """Loss curves: training loss (thin, smoothed over 10 steps) and validation loss (markers)."""
    styles = ["-", "--", ":", "-."]  # the curves coincide: dashes let each one show through the others
    for i, r in enumerate(doc["rows"]):
        steps = [x[0] + 1 for x in r["train"]]
        loss = [x[1] for x in r["train"]]
        k = 10
        smooth = [sum(loss[max(0, i - k + 1):i + 1]) / len(loss[max(0, i - k + 1):i + 1]) for i in range(len(loss))]
        label = f"{r['sync']}, {r['world_size']} rank{'s' if r['world_size'] > 1 else ''}"
        if r.get("threads"):
            label += f" x {r['threads']} thread{'s' if r['threads'] > 1 else ''}"
        if r.get("accumulate", 1) > 1:
            label += f", {r['accumulate']} micro-batches"
        line, = ax.plot(steps, smooth, styles[i % len(styles)], lw=1.4, label=f"{label}: train (mean of 10 steps)")
        if r["val"]:
            ax.plot([v[0] + 1 for v in r["val"]], [v[1] for v in r["val"]], "o", ms=4, color=line.get_color(),
                    mfc="none", label=f"{label}: validation")
    losses = [[x[1] for x in r["train"]] for r in doc["rows"]]
    diff_inset(ax, [0.34, 0.2, 0.42, 0.4], losses[0], losses[1:], styles, "|loss - loss of the first run|")
    ax.set_xlabel("optimizer step (global batch the same for every world size)")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title("stage 08, byte-level Transformer on Debian's fortunes: every run's curve coincides")
    ax.legend(fontsize=7)

def elastic_timeline(ax, trace, title):
    """Every process of a stage 09 run, from its --trace: steps (a colour per generation), rounds, new groups,
    heals (or state checks), kills and failures seen."""
    events = dplib.trace_events(trace)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    colours = {"round": "#8C8C8C", "new group": "#8172B3", "heal": "#222222", "state check": "#55A868"}
    generation = ["#4C72B0", "#DD8452", "#64B5CD", "#CCB974", "#DA8BC3", "#937860"]
    for e in events:
        if e["ph"] == "X":
            kind = "step" if e["name"].startswith("step") else e["name"].split(" ")[0] if e["name"].startswith("round") else e["name"]
            c = colours.get(kind, generation[e["args"].get("generation", 0) % len(generation)] if kind == "step" else "k")
            ax.barh(e["pid"], e["dur"] / 1e6, left=e["ts"] / 1e6, height=0.6, color=c, edgecolor="white", lw=0.3)
        elif e["ph"] == "i":
            ax.plot(e["ts"] / 1e6, e["pid"], "X" if e["name"].startswith("DP_FAULT") else "v", ms=8,
                    color="C3" if e["name"].startswith("DP_FAULT") else "k")
    ax.set_yticks(list(names), [names[p].replace("process ", "") for p in names], fontsize=7)
    ax.set_ylabel("process (slot.restart)", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.invert_yaxis()


def elastic(doc, fig):
    """Stage 09: the loss curves of runs that lost ranks (kept in memory, restarted from a checkpoint, or fallen
    back to one when every holder died) on the uninterrupted run's; below, the timelines of every process of the
    elastic run and of the fallback run (their --trace)."""
    base = pathlib.Path(doc.get("_path", ".")).parent
    traces = [(base / doc.get(k, ""), t) for k, t in (
        ("trace", "a rank killed at step 21, its replacement joining"),
        ("trace_fallback", "every rank killed at step 36: the replacements load the step-30 checkpoint"))]
    traces = [(p, t) for p, t in traces if doc.get("trace") and p.is_file()]
    axes = fig.subplots(1 + len(traces), 1, gridspec_kw={"height_ratios": [3] + [2] * len(traces)})
    top = axes[0] if traces else axes
    rows = [r for r in doc["rows"] if r["link"] == "loopback"] or doc["rows"]
    styles = ["-", "--", ":", "-."]
    for i, r in enumerate(rows):
        top.plot(range(1, len(r["train"]) + 1), r["train"], styles[i % 4], lw=1.4, label=r["scenario"])
    for r in rows:
        if r.get("failed_step"):
            top.axvline(r["failed_step"], color="C3", lw=0.8, ls=":")
        if r.get("joined_at_step"):
            top.axvline(r["joined_at_step"], color="C2", lw=0.8, ls=":")
    diff_inset(top, [0.45, 0.45, 0.38, 0.3], rows[0]["train"], [r["train"] for r in rows[1:]], styles,
               "|loss - uninterrupted loss|")
    top.set_xlabel("optimizer step (red: ranks killed; green: a replacement joins)")
    top.set_ylabel("cross-entropy (nats per byte)")
    top.set_title("stage 09: ranks killed mid-run cost neither the curve nor, while one holder lives, a step "
                  "since a checkpoint", fontsize=10)
    top.legend(fontsize=7, loc="upper right")
    for ax, (path, title) in zip(axes[1:] if traces else [], traces):
        elastic_timeline(ax, path, title)
    if traces:
        axes[-1].set_xlabel("seconds; bars: steps (one colour per generation), rounds (grey), new groups (purple), "
                            "heals (black), state checks (green); X: killed; v: failure seen", fontsize=7)


FIGURES = {"elastic": elastic}  # plots that draw their own axes on the whole figure

FIGSIZE = {"allreduce": (11, 5), "elastic": (9, 11)}  # room for the legend beside the axes; two timelines

PLOTS = {"train_lm": train_lm, "allreduce": allreduce, "sharded_optimizer": memory, "fsdp": fsdp}

def main(paths):
    for p in map(pathlib.Path, paths):
        doc = dplib.load_json(p)
        kind = doc["benchmark"].split(":")[0]
        if kind in FIGURES:
            fig = plt.figure(figsize=FIGSIZE.get(kind, (9, 8)))
            FIGURES[kind]({**doc, "_path": str(p)}, fig)
        else:
            fig, ax = plt.subplots(figsize=FIGSIZE.get(kind, (8, 5)))
            PLOTS.get(kind, ddp)(doc, ax)
        fig.text(0.01, 0.01, doc.get("machine", ""), fontsize=7, color="gray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        out = p.with_suffix(".png")
        fig.savefig(out, dpi=110)
        print(f"wrote {out}")

if __name__ == "__main__":
    main(sys.argv[1:])
