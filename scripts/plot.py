#!/usr/bin/env python3
"""Turns benchmark JSON (docs/results/*.json) into the PNG plots the docs show.

    /usr/bin/python3 scripts/plot.py docs/results/allreduce.json docs/results/stage05.json ...
Each file's "benchmark" field picks the plot; the PNG is written next to the JSON (same name, .png).
"""
import json, sys, pathlib
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

def allreduce(doc, ax):
    rows = doc["rows"]
    for link, w in sorted({(r.get("link", "loopback"), r["world_size"]) for r in rows}):
        rs = sorted((r for r in rows if r["world_size"] == w and r.get("link", "loopback") == link),
                    key=lambda r: r["bytes"])
        ax.plot([r["bytes"] / 1e6 for r in rs], [r["busbw_GBps"] for r in rs], marker="o",
                label=f"{rs[0]['backend']}, {w} ranks, {link}")
    ax.set_xscale("log")
    ax.set_xlabel("tensor size (MB, float32)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_yscale("log")
    ax.set_title("all-reduce bus bandwidth (a simulated link's rate is its ceiling)")
    ax.legend()

def ddp(doc, ax):
    rows = doc["rows"]
    names = [r["variant"] for r in rows]
    sync = [r.get("sync_s", r.get("comm_s", 0)) for r in rows]
    compute = [r["step_s"] - c for r, c in zip(rows, sync)]
    comm = sync
    ax.barh(names, compute, label="forward + backward + optimizer")
    ax.barh(names, comm, left=compute, label="waiting for gradient sync")
    # The ratio to the no-communication step of the same round is the comparable number.
    for i, r in enumerate(rows):
        ax.text(r["step_s"] * 1.01, i, f"x{r['ratio_to_no_comm']:.2f}", va="center", fontsize=8)
    ax.set_xlim(0, max(r["step_s"] for r in rows) * 1.15)
    ax.invert_yaxis()
    ax.set_xlabel("s per step (median, slowest rank); xN: step / no-comm step of the same round")
    r0 = rows[0]
    ax.set_title(f"{r0['preset']} Transformer, batch {r0['global_batch']}, context {r0['context']}, "
                 f"{r0['world_size']} ranks, {r0.get('link', 'loopback')}", fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8)

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
               label="4P + 4P + 8P/N")
    ax.invert_yaxis()
    ax.set_xlabel("MB per rank (tensor bytes)")
    ax.set_title(f"{rows[0]['preset']} Transformer: memory per rank with and without ZeRO-1")
    ax.legend(loc="lower right")

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
    rss = [(r["peak_rss_MB"], n) for r, n in zip(rows, names) if r.get("peak_rss_MB", -1) > 0]
    if rss:
        ax.scatter([v for v, _ in rss], [n for _, n in rss], color="k", marker="|", s=400, zorder=3,
                   label="peak RSS (one variant per process)")
    ax.invert_yaxis()
    ax.set_xlabel("MB per rank")
    ax.set_title(f"memory per rank, {rows[0]['world_size']} ranks: DDP 16P, ZeRO-1 8P + 8P/N, FSDP 16P/N + gathered units", fontsize=9)
    ax.legend(loc="upper right", fontsize=8)

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
    # Inset: how far each curve is from the first one, step by step (log scale: from rounding to noise).
    ref = doc["rows"][0]["train"]
    ins = ax.inset_axes([0.34, 0.2, 0.42, 0.4])
    for i, r in enumerate(doc["rows"][1:], start=1):
        d = [max(abs(a[1] - b[1]), 1e-9) for a, b in zip(ref, r["train"])]
        ins.plot(range(1, len(d) + 1), d, styles[i % len(styles)], lw=0.9, color=f"C{i}")
    ins.set_yscale("log")
    ins.set_ylim(1e-9, 1)
    ins.set_title("|loss - loss of the first run| per step (1e-9: equal)", fontsize=7)
    ins.tick_params(labelsize=6)
    ax.set_xlabel("optimizer step (global batch the same for every world size)")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title("stage 08, byte-level Transformer on Debian's fortunes: every run's curve coincides")
    ax.legend(fontsize=7)

PLOTS = {"train_lm": train_lm, "allreduce": allreduce, "sharded_optimizer": memory, "fsdp": fsdp}

def main(paths):
    for p in map(pathlib.Path, paths):
        doc = json.loads(p.read_text())
        fig, ax = plt.subplots(figsize=(8, 5))
        PLOTS.get(doc["benchmark"].split(":")[0], ddp)(doc, ax)
        fig.text(0.01, 0.01, doc.get("machine", ""), fontsize=7, color="gray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        out = p.with_suffix(".png")
        fig.savefig(out, dpi=110)
        print(f"wrote {out}")

if __name__ == "__main__":
    main(sys.argv[1:])
