#!/usr/bin/env python3
"""Extensions 05e's and 07c's two pictures each, from their runs in docs/results/ (X: ext05e or ext07c):

  X_errors.png   each wire format's relative error against the number of ranks averaged (log-log), fp32 sums
                 against 16-bit sums, with each line's fitted slope (X_errors.json)
  X_curves.png   the training loss of each hook (05e) or variant (07c), and its difference from fp32's against fp32
                 on other data (X_curves.json)

    /usr/bin/python3 scripts/pages/plot_low_byte.py [X...]   # default both; next to their JSON (bench_docs.sh)
"""
import pathlib, sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402
import matplotlib  # noqa: E402
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

R = dplib.RESULTS


def errors(x):
    doc = dplib.results(f"{x}_errors")
    errs = doc["errors"]
    ranks = sorted({e["ranks"] for e in errs})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, f in enumerate(dict.fromkeys(e["format"] for e in errs)):
        med = [np.median([e["relative_error"] for e in errs if e["format"] == f and e["ranks"] == w]) for w in ranks]
        slope = np.polyfit(np.log(ranks), np.log(med), 1)[0]
        fp32_sums = f.endswith("fp32 sums")
        ax.plot(ranks, med, marker="o" if fp32_sums else "s", ls="-" if fp32_sums else "--",
                color=f"C{['bf16', 'fp16', 'int8'].index(f[:4])}", label=f"{f} (slope {slope:+.2f})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks)
    ax.set_xticklabels([str(w) for w in ranks])
    ax.set_xlabel("ranks averaged (simulated: bit-identical to the collective)")
    ax.set_ylabel("relative error of the average")
    what = "all-reduce" if x == "ext05e" else "reduce-scatter"
    ax.set_title(f"{doc['preset']} gradients, {what}: each format's error against the exact average", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(R / f"{x}_errors.png", dpi=110)


def curves(x):
    doc = dplib.results(f"{x}_curves")
    cs = doc["curves"]
    for c in cs:  # 07c names its runs by variant
        c.setdefault("hook", c.get("variant"))
    ref = cs[0]  # the first run is the reference: fp32's
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    for i, c in enumerate(cs):
        name = c["hook"] + (", other data" if c["data"] else "")
        steps = np.arange(1, len(c["losses"]) + 1)
        style = dict(color="grey", ls=":") if c["data"] else dict(color=f"C{i}")
        top.plot(steps, c["losses"], label=name, lw=1, **style)
        if c is not ref:
            bottom.plot(steps, np.abs(np.array(c["losses"]) - np.array(ref["losses"])), lw=1, label=name, **style)
    top.set_ylabel("training loss")
    top.legend(fontsize=8)
    top.set_title(f"{doc['preset']}, {len(ref['losses'])} steps on Markov-chain text: each run against fp32")
    bottom.set_yscale("log")
    bottom.set_ylabel("|loss - fp32's loss|")
    bottom.set_xlabel("step")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(R / f"{x}_curves.png", dpi=110)


if __name__ == "__main__":
    for x in sys.argv[1:] or ["ext05e", "ext07c"]:
        if (R / f"{x}_errors.json").exists() and (R / f"{x}_curves.json").exists():
            errors(x)
            curves(x)
