#!/usr/bin/env python3
"""Regenerates every results table in README.md and docs/*.md from docs/results/*.json.

A table lives between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; NAME is a JSON file in
docs/results/ (without .json). The block is replaced by a Markdown table, the exact command(s) that
produced the numbers (read from each row, so files merged from several runs stay right) and the machine.
Tables are never edited by hand.

Statistics: the DDP programs keep every round's sample (each round ran one step of every variant back to
back). A ratio's 95% confidence interval is a percentile bootstrap of the median over rounds
(scipy.stats.bootstrap, 9999 resamples, fixed seed so the pages are reproducible); "min-max" is the
range of the rounds. Two variants differ only when the interval of their per-round ratio excludes 1.

    python3 scripts/pages/make_tables.py            # rewrite the pages
    python3 scripts/pages/make_tables.py --check    # exit 1 if any page is not what the JSON gives (ctest)
    python3 scripts/pages/make_tables.py [--check] docs/03_flat.md ...   # those pages only

Numbers in prose are generated too (`<!-- n:FILE EXPR | FORMAT -->VALUE<!-- /n -->`, see NUMBER below), and
--check fails on a measured-looking number in prose that no marker writes and no word in its sentence explains.
A comparison of measurements is checked the same way: `<!-- claim:FILE EXPR -->the words<!-- /claim -->` holds
only while EXPR (over docs/results/FILE.json, as for numbers) is true, and a comparative ("faster than",
"slowest", ...) in a paragraph that quotes a measured number must stand inside such a marker (see CLAIM).

    python3 scripts/pages/make_tables.py --self-test   # the claim check catches a contradicted and an unmarked claim
"""
import functools, pathlib, re, sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402

ROOT = dplib.ROOT
RESULTS = dplib.RESULTS
load = dplib.results  # docs/results/NAME.json, parsed once per run


def ci(samples):
    """Median and 95% percentile-bootstrap interval of the median (dplib.median_ci), or None for fewer than 3
    samples."""
    c = dplib.median_ci(samples)
    return None if c[1] is None else c


def fmt_ci(samples, f="{:.2f}"):
    c = ci(samples)
    if c is None:
        return "-" if not len(samples) else f.format(float(np.median(samples)))
    return f"{f.format(c[0])} [{f.format(c[1])}, {f.format(c[2])}]"


def compare(a, b):
    """Per-round ratio a/b of two rows measured in the same rounds: (median, low, high) or None."""
    if a.get("group") != b.get("group") or "step_samples_s" not in a or "step_samples_s" not in b:
        return None
    return ci([x / y for x, y in zip(a["step_samples_s"], b["step_samples_s"])])


def speedup(doc, r):
    """One process's median step over the row's median step, both measured in this run: a shorter step in the
    step column is always a larger speed-up beside it (a per-round median of ratios need not be)."""
    sp = doc.get("single_process_samples_s")
    return float(np.median(sp)) / r["step_s"] if sp and r.get("step_s") else r.get("speedup_vs_1proc")


# The one place the speed-up's ceiling is explained; every table's note links it (pages sit beside it in docs/).
CEILING_PAGE = "00_start_here.md#what-this-machine-can-and-cannot-show"


def ceiling_note(doc):
    """The speed-up column's ceiling on this machine, said beside it: the no-communication row (ranks only
    computing) is as fast as N ranks on these cores can be, and why that is not N."""
    base = [r for r in doc["rows"] if r["variant"].startswith("no communication")]
    if not base or not doc.get("single_process_samples_s"):
        return None
    w, c = base[0]["world_size"], speedup(doc, base[0])
    if w < 2:
        return None
    if doc.get("cpus_per_rank"):  # ddp_launch --cpus-per-rank K: each rank owns K cores, as it would a GPU
        k = doc["cpus_per_rank"]
        return (f"Speed-up = one process's median step / the row's median step; the process ran on {k} "
                f"core{'s' if k > 1 else ''}, as each rank did (`ddp_launch --cpus-per-rank {k}`), so the "
                f"ceiling is {w}, and the no-communication row's {c:.2f} is how near this run came to it "
                f"([the ceiling]({CEILING_PAGE})).")
    gpu = "device" in base[0]  # scripts/machines/gpu_check.sh: the ranks share one GPU
    shared = "one GPU" if gpu else f"same {doc['machine'].split(', ')[1]}"
    return (f"Speed-up = one process's median step / the row's median step. Its ceiling here is the "
            f"no-communication row's {c:.2f}, not {w}: the {w} ranks share the {shared} that one process "
            f"already keeps busy, so splitting the batch adds no compute" + ("" if gpu else
            f"; with a GPU per rank it would be near {w}") + f" ([the ceiling]({CEILING_PAGE})).")


def ddp_table(doc):
    rows = doc["rows"]
    groups = len({r.get("group", 0) for r in rows}) > 1
    head = ["variant"] + (["baseline"] if groups else []) + [
        "collectives / step", "step (s), median [min-max]", "step / no-comm [95% CI]", "exposed comm (s)",
        "overlap efficiency [95% CI]", "tokens/s", "speedup vs 1 process"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["variant"]] + ([r.get("baseline", "-")] if groups else [])
        cells += [str(r.get("calls_per_step", "-")),
                  f"{r['step_s']:.3f} [{r['step_min_s']:.3f}-{r['step_max_s']:.3f}]",
                  fmt_ci(r.get("ratio_samples", [r.get("ratio_to_no_comm", 1)]), "{:.3f}"),
                  f"{r['exposed_comm_s']:+.3f}",
                  fmt_ci(r["overlap_samples"]) if "overlap_samples" in r else "-",
                  f"{r['tokens_per_s']:.0f}" if "tokens_per_s" in r else "-",
                  f"{speedup(doc, r):.2f}" if speedup(doc, r) is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    if "single_process_samples_s" in doc:
        sp = doc["single_process_samples_s"]
        k = doc.get("cpus_per_rank")
        where = (f"on {k} core{'s' if k > 1 else ''} as each rank" if k
                 else f"all {doc['machine'].split(', ')[1]}")
        notes.append(f"One process, whole global batch, {where}: "
                     f"{np.median(sp):.3f} s per step [{min(sp):.3f}-{max(sp):.3f}]. "
                     f"One flat all-reduce of all gradients: {np.median(doc['flat_allreduce_samples_s']):.3f} s "
                     f"[{min(doc['flat_allreduce_samples_s']):.3f}-{max(doc['flat_allreduce_samples_s']):.3f}] "
                     f"(the communication time in the overlap efficiency).")
        notes += [n for n in [ceiling_note(doc)] if n]
    # Each stage against the one before it, round by round (only rows measured in the same rounds).
    by = {r["variant"]: r for r in rows}
    buck = [r for r in rows if "(stage 05)" in r["variant"]]
    best = min(buck, key=lambda r: r["step_s"]) if buck else None
    pairs = [("flat (stage 03)", "naive (stage 02)"), ("overlap (stage 04)", "flat (stage 03)")]
    if best:
        pairs += [(best["variant"], "overlap (stage 04)"), (best["variant"], "flat (stage 03)")]
    said = []
    for a, b in pairs:
        c = compare(by[a], by[b]) if a in by and b in by else None
        if c:
            verdict = "faster" if c[2] < 1 else "slower" if c[1] > 1 else "no difference shown"
            said.append(f"{a} / {b} x{c[0]:.3f} [{c[1]:.3f}, {c[2]:.3f}], {verdict}")
    # Stage 05's features, each alone against the plain row of the same cap (--comm-hook, --bucket-order,
    # --overlap-optimizer lists), and the best row against the plain one.
    for r in buck:
        m = re.fullmatch(r"bucketed ([\d.]+) MB \(stage 05\)", r["variant"])
        if not m:
            continue
        for feature in (", fp16 hook", ", arrival order", ", optimizer overlapped"):
            other = f"bucketed {m.group(1)} MB{feature} (stage 05)"
            c = compare(by[other], r) if other in by else None
            if c:
                verdict = "faster" if c[2] < 1 else "slower" if c[1] > 1 else "no difference shown"
                said.append(f"{other} / plain x{c[0]:.3f} [{c[1]:.3f}, {c[2]:.3f}], {verdict}")
    # Extension 06a: each ZeRO-1 row against stage 05's DDP row of the same run.
    ddp_row = next((r for r in rows if r["variant"].startswith("DDP, ")), None)
    for r in rows:
        if ddp_row and r["variant"].startswith("ZeRO-1"):
            c = compare(r, ddp_row)
            if c:
                verdict = "faster" if c[2] < 1 else "slower" if c[1] > 1 else "no difference shown"
                said.append(f"{r['variant']} / DDP x{c[0]:.3f} [{c[1]:.3f}, {c[2]:.3f}], {verdict}")
    if said:
        notes.append("Step against step, round by round (median and 95% CI): " + "; ".join(said) + ".")
    for m in doc.get("memory", []):
        notes.append(f"Bytes per rank, {m['variant']}: parameters {m['param_MB']:.1f} MB, gradients {m['grad_MB']:.1f}, "
                     f"AdamW state {m['state_MB']:.1f}, total {m['total_MB']:.1f} (arithmetic {m['expected_MB']:.1f}).")
    for a in doc.get("accumulation", []):
        notes.append(f"Gradient accumulation, K = {a['accumulate']} (micro-batches per AdamW step) of {rows[0].get('global_batch', '?')} "
                     f"sequences each: step {a['step_s']:.3f} s, {1e3 * a['per_sequence_s']:.1f} ms per "
                     f"sequence, {a['collectives_per_step']} collectives per step.")
    for r in rows:
        c = ci(r.get("ratio_samples", []))
        if c and c[2] < 1 and not r["variant"].startswith("no communication"):
            notes.append(f"Note: {r['variant']} is faster than its no-communication baseline beyond the interval "
                         f"(x{c[0]:.3f} [{c[1]:.3f}, {c[2]:.3f}]); read it as noise of this shared machine.")
    if rows and rows[0].get("cut_by_budget"):
        notes.append(f"--budget cut the run to {rows[0]['steps']} of {rows[0]['steps_requested']} timed steps.")
    if groups:
        notes.append("Variants that did not fit in memory together ran in groups, each with its own "
                     "no-communication baseline (the baseline column).")
    return lines, notes


def torch_ddp_table(doc):
    """scripts/bench/compare_torch_ddp.py: ours and PyTorch's DDP, alternated launch by launch (a round = one launch
    of each); every ratio is taken round by round."""
    head = ["variant", "step (s), median [95% CI]", "x PyTorch DDP [95% CI]", "x lower bound [95% CI]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["rows"]:
        lines.append("| " + " | ".join([r["variant"], fmt_ci(r["round_medians_s"], "{:.3f}"),
                                        fmt_ci(r["ratio_to_pytorch_ddp_samples"], "{:.3f}"),
                                        fmt_ci(r["ratio_to_lower_bound_samples"], "{:.3f}")]) + " |")
    lb, fw = doc["lower_bound"]["median"], doc["forward_ratio_ours_to_pytorch"]
    c = doc["config"]
    notes = [f"{c['preset']}, {c['world']} ranks, {'loopback' if c['net'] == 'none' else c['net'] + ' link per rank'}, "
             f"{c['rounds']} rounds of {c['warmup']} + {c['steps']} steps per launch; bucket cap {c['cap']:g} MiB on both "
             f"sides (ours given it in MB). Lower bound (medians): forward {lb['forward_s']:.3f} + max(backward "
             f"{lb['backward_s']:.3f}, one flat all-reduce {lb['comm_s']:.3f}) + optimizer {lb['optimizer_s']:.3f} = "
             f"{lb['bound_s']:.3f} s, from our no-communication row in the same launches.",
             f"Same work on both sides: forward pass, ours / PyTorch's, x{fw['ratio']:.3f}.",
             "Verdict: " + doc["verdict"]["text"] + (("; fp16 hooks: " + doc["verdict_fp16"]["text"])
                                                      if doc.get("verdict_fp16") else "") + "."]
    return lines, notes


def python_ddp_table(doc):
    """scripts/bench/python_ddp.py: one Python model with PyTorch's DDP and with ddp_from_scratch's, per bucket cap,
    alternated step by step in one launch; each ratio is taken step by step against PyTorch's row of the same cap."""
    head = ["variant", "step (s), median [95% CI]", "tokens/s", "x PyTorch DDP, same cap, per step [95% CI]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["rows"]:
        base = next(b for b in doc["rows"] if not b["ours"] and b["cap_mib"] == r["cap_mib"])
        ratio = "1" if r is base else fmt_ci([x / y for x, y in zip(r["step_samples_s"], base["step_samples_s"])],
                                             "{:.3f}")
        lines.append("| " + " | ".join([r["variant"], fmt_ci(r["step_samples_s"], "{:.3f}"),
                                        f"{r['tokens_per_s']:.0f}", ratio]) + " |")
    notes = [f"{doc['preset']} ({doc['params']:,} parameters), global batch {doc['global_batch']} x {doc['context']} "
             f"tokens over {doc['world']} ranks, {doc['link']}; {doc['steps']} timed steps of each after {doc['warmup']}; "
             f"torch {doc['torch_version']}."]
    return lines, notes


def low_byte_table(doc):
    """Extension 05e's benchmark: per hook, the bytes each rank sent per step, the step, and its ratio round by round
    to the fp32 all-reduce's step and to the fp32 lower bound (forward + max(backward, one fp32 all-reduce) + optimizer,
    from the medians of the no-communication row of the hook's group and each round's all-reduce; the program
    computed it: `lower_bound_samples_s`)."""
    rows = doc["rows"]
    grouped = len({r.get("group", 0) for r in rows}) > 1
    bases = [r for r in rows if r["variant"] == r["baseline"]]
    fp32 = next((r for r in rows if r["variant"].startswith("fp32 hook")), None)
    hooks = doc["low_byte"]["rows"]
    lb = hooks[0]["lower_bound_samples_s"]
    head = ["hook", "MB sent per rank per step", "step (s), median [95% CI]", "x fp32 all-reduce [95% CI]",
            "x lower bound [95% CI]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = bases[0]
    lines.append(f"| no communication{' (group of the first hook)' if grouped else ''} | 0 | "
                 f"{fmt_ci(base['step_samples_s'], '{:.3f}')} | - | "
                 f"{fmt_ci([a / b for a, b in zip(base['step_samples_s'], lb)], '{:.3f}')} |")
    for h in hooks:
        r = next(r for r in rows if r["variant"].startswith(h["hook"] + " hook,"))
        vs = compare(r, fp32) if fp32 is not None else None
        vs = f"{vs[0]:.3f} [{vs[1]:.3f}, {vs[2]:.3f}]" if vs is not None else "-" if r is fp32 else "- (another group)"
        lines.append(f"| {HOOK_WORDS.get(h['hook'], h['hook'])} | {h['sent_MB_per_step']:.2f} | "
                     f"{fmt_ci(r['step_samples_s'], '{:.3f}')} | {vs} | "
                     f"{fmt_ci(h['ratio_to_lower_bound_samples'], '{:.3f}')} |")
    lines.append(f"| lower bound: forward + max(backward, fp32 all-reduce) + optimizer | - | {fmt_ci(lb, '{:.3f}')} | - | 1 |")
    r0 = rows[0]
    notes = [f"{r0['preset']}, {r0['world_size']} ranks, {r0['link']}, {len(r0['step_samples_s'])} rounds of one timed "
             f"step of each variant; int8 blocks of {doc['block']} values; PowerSGD rank {doc['powersgd_rank']}. "
             f"Lower bound (medians): forward {base['forward_s']:.3f} + max(backward {base['backward_s']:.3f}, one fp32 "
             f"all-reduce {np.median(doc['flat_allreduce_samples_s']):.3f}) + optimizer {base['optimizer_s']:.3f} s."]
    if grouped:
        notes.append("The model's replicas did not fit together: each hook was measured in a group of its own, against "
                     "its group's no-communication row, and its lower bound takes the all-reduce's median over all rounds.")
    return lines, notes


HOOK_WORDS = {"fp32": "fp32 all-reduce (stage 05)", "fp16-allreduce": "fp16 all-reduce, fp16 sums (extension 05a)",
              "bf16": "bf16 wire, fp32 sums", "fp16": "fp16 wire, fp32 sums", "int8": "int8 wire, fp32 sums",
              "bf16-lowsum": "bf16 wire, bf16 sums", "fp16-lowsum": "fp16 wire, fp16 sums",
              "powersgd": "PowerSGD, error feedback"}


def variant_words(v):
    """Extension 07c's variant "WEIGHTS/GRADIENTS" in words."""
    w, g = v.split("/")
    if v == "fp32/fp32":
        return "stage 07: fp32 weights, fp32 gradients"
    grads = "fp32" if g == "fp32" else g.replace("-lowsum", "") + (" (16-bit sums)" if "lowsum" in g else " (fp32 sums)")
    if w == "zero1":
        return "ZeRO-1 (stage 06), fp32 gradients" if g == "fp32" else f"ZeRO-1, {grads} gradients"
    return f"{w} weights, {grads} gradients"


def fsdp_low_byte_table(doc):
    """Extension 07c's benchmark: per variant, the bytes each rank sent per step (counted by its Fsdp; the program
    checked them against the formula), the step, and its ratio round by round to stage 07's fp32 step."""
    rows = doc["rows"]
    first = variant_words(doc["low_byte"][0]["variant"]).split(":")[0].split(",")[0]
    head = ["variant (weights / gradients on the wire)", "MB sent per rank per step", f"x {first}'s bytes",
            "step (s), median [95% CI]", f"x {first}'s step [95% CI]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = next(r for r in rows if r["variant"] == r["baseline"])
    lines.append(f"| no communication | 0 | - | {fmt_ci(base['step_samples_s'], '{:.3f}')} | - |")
    fp32 = doc["low_byte"][0]["sent_MB_per_step"]
    for v in doc["low_byte"]:
        r = next(r for r in rows if r["variant"] == v["variant"])
        ratio = "1" if v is doc["low_byte"][0] else fmt_ci(v["ratio_to_first_samples"], "{:.3f}")
        lines.append(f"| {variant_words(v['variant'])} | {v['sent_MB_per_step']:.2f} | "
                     f"{v['sent_MB_per_step'] / fp32:.3f} | {fmt_ci(r['step_samples_s'], '{:.3f}')} | {ratio} |")
    r0 = rows[0]
    zero1 = all(v["variant"].startswith("zero1/") for v in doc["low_byte"])
    how = ("stage 06's ZeRO-1, its all-gather of the parameters in fp32" if zero1 else
           "FSDP resharding after forward, fp32 compute")
    counted = ("reported by each variant's strategy, which computes them by formula (the fp32 all-gather's, "
               "and the reduce-scatter's in its wire)" if zero1 else "counted by each variant's Fsdp")
    notes = [f"{r0['preset']}, {r0['world_size']} ranks, {r0['link']}, {len(r0['step_samples_s'])} rounds of one "
             f"timed step of each variant; {how}; int8 blocks of {doc['block']} values, each rank's shard encoded on "
             f"its own. Bytes: {counted}, equal to the formula (the program checks it)."]
    if len({r.get("group", 0) for r in rows}) > 1:
        notes.append("The model's replicas did not fit together: the variants were measured in groups, one after "
                     "another, so a ratio to stage 07's row from another group compares rounds taken apart in time.")
    return lines, notes


def low_byte_errors_table(doc):
    """Extension 05e's error study: each format's relative error (median over draws) per number of simulated ranks,
    the slope of log(error) over log(ranks), and the worst |error| / derived bound over every value (fp32 sums)."""
    errs = doc["errors"]
    ranks = sorted({e["ranks"] for e in errs})
    formats = list(dict.fromkeys(e["format"] for e in errs))
    head = ["format"] + [f"{w} ranks" for w in ranks] + ["slope over log(ranks)", "worst error / bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in formats:
        med = [float(np.median([e["relative_error"] for e in errs if e["format"] == f and e["ranks"] == w])) for w in ranks]
        slope = float(np.polyfit(np.log(ranks), np.log(med), 1)[0])
        worst = max(e["worst_over_bound"] for e in errs if e["format"] == f)
        lines.append("| " + " | ".join([f] + [f"{m:.2e}" for m in med] + [f"{slope:+.2f}",
                                                                           f"{worst:.2f}" if worst > 0 else "-"]) + " |")
    draws = len({e["seed"] for e in errs})
    model = "`low_byte_scatter_average()`" if "weight_errors" in doc else "`low_byte_average()`"
    notes = [f"Relative error ||average - exact|| / ||exact|| over every gradient value of {doc['preset']}, "
             f"median over {draws} draws of per-rank gradients (2 sequences each); ranks simulated by "
             f"{model}, bit-identical to the collective. Worst error / bound: the largest over every "
             "value, rank count and draw (at most 1 where the design holds; '-' where no bound is derived)."]
    if "weight_errors" in doc:
        notes.append("The weights after one all-gather (2 ranks), relative error [worst / bound]: " + ", ".join(
            f"{w['format']} {w['relative_error']:.2e} [{w['worst_over_bound']:.2f}]" for w in doc["weight_errors"]) + ".")
    return lines, notes


def low_byte_curves_table(doc):
    """Extension 05e's loss curves: the final loss per hook, its distance from fp32's, and fp32 on other data."""
    curves = doc["curves"]
    for c in curves:  # extension 07c names its runs by variant
        c.setdefault("hook", c.get("variant"))
    ref = curves[0]  # the first run is the reference: fp32's
    other = next(c for c in curves if c["data"] == 1)
    noise = abs(other["final_loss"] - ref["final_loss"])
    head = ["run", "loss at step 1", "final loss (mean of the last tenth)", "final's distance from fp32's",
            "largest distance from fp32's loss, over the steps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in curves:
        words = variant_words(c["hook"]) if "/" in c["hook"] else HOOK_WORDS.get(c["hook"], c["hook"])
        name = words + (", other data" if c["data"] else "")
        gap = max(abs(a - b) for a, b in zip(c["losses"], ref["losses"]))
        lines.append(f"| {name} | {c['losses'][0]:.4f} | {c['final_loss']:.4f} | "
                     f"{abs(c['final_loss'] - ref['final_loss']):.4f} | {gap:.4f} |")
    n = len(ref["losses"])
    opt = "SGD with momentum 0.9 (lr 0.05)" if doc.get("curve_optimizer") == "sgd" else "AdamW (lr 1e-3)"
    if doc.get("powersgd_start", 0) > 0:
        opt += f"; PowerSGD after {doc['powersgd_start']} plain fp32 steps"
    return lines, [f"{n} steps of {opt} on text from a Markov chain (256 states, 4 successors each), "
                   f"{doc.get('preset', '')} model; the bound each run is held to: fp32 on other data ends "
                   f"{noise:.4f} from fp32."]


def capstone_curves_table(doc):
    """Extension 08a: stage 08's run with each hook against fp32, and fp32 on other batches (the bound)."""
    runs = doc["runs"]
    ref, other = runs[0], runs[-1]
    head = ["run", "training loss, final (mean of the last tenth)", "its distance from fp32's",
            "validation loss, final", "its distance from fp32's"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    words = {"ddp": "fp32 all-reduce (stage 05's DDP)", "ddp-int8": "int8 wire, fp32 sums",
             "ddp-bf16": "bf16 wire, fp32 sums"}
    for r in runs:
        name = words.get(r["sync"], r["sync"]) + (", other batches" if r["other_data"] else "")
        lines.append(f"| {name} | {r['final_train_loss']:.4f} | {abs(r['final_train_loss'] - ref['final_train_loss']):.4f} | "
                     f"{r['final_val_loss']:.4f} | {abs(r['final_val_loss'] - ref['final_val_loss']):.4f} |")
    c = doc["config"]
    return lines, [f"Stage 08's capstone: the {c['preset']} byte-level model on {c['corpus']}, {len(ref['train'])} steps of "
                   f"AdamW (lr {c['lr']:g}, warm-up {c['warmup']}), global batch {c['batch']} x {c['context']} bytes, "
                   f"{c['world_size']} ranks; the same weights and batches for every run but the last. The bound each "
                   f"hook is held to is on the validation loss (the same held-out text for every run): fp32 on other "
                   f"batches ends {abs(other['final_val_loss'] - ref['final_val_loss']):.4f} from fp32 there. Its training "
                   "loss is no bound: other batches' losses differ by the batches' own noise, which may average out near "
                   "zero by chance."]


def plain_table(doc, cols):
    present = [c for c in cols if any(c[0] in r for r in doc["rows"])]
    lines = ["| " + " | ".join(h for _, h, _ in present) + " |", "|" + "---|" * len(present)]
    for r in doc["rows"]:
        lines.append("| " + " | ".join(cell(r, k, f) for k, _, f in present) + " |")
    return lines, []


COLUMNS = {
    "allreduce": [("backend", "backend", "{}"), ("link", "link", "{}"), ("world_size", "ranks", "{}"),
                  ("size", "size", "{}"), ("iters", "iterations", "{}"),
                  ("latency_median_s", "median latency (ms)", "ms"), ("algbw_GBps", "algbw (GB/s)", "{:.3f}"),
                  ("busbw_GBps", "busbw (GB/s)", "{:.3f}"), ("copy_GBps", "device copy (GB/s)", "{:.1f}")],
    "alltoall": [("exchange", "exchange", "{}"), ("link", "link", "{}"), ("world_size", "ranks", "{}"),
                 ("sent_MB", "MB sent per rank", "{:.1f}"), ("time_median_s", "median time (ms)", "ms0"),
                 ("rate_MBps", "MB/s per rank", "{:.0f}")],
    "sharded_optimizer": [("optimizer", "optimizer", "{}"), ("world_size", "ranks", "{}"),
               ("param_MB", "params (MB)", "{:.1f}"), ("grad_MB", "grads (MB)", "{:.1f}"),
               ("state_MB_max_rank", "optimizer state, max rank (MB)", "{:.1f}"),
               ("expected_MB", "4P+4P+8P/N (MB)", "{:.1f}"), ("peak_rss_start_MB", "peak RSS at start (MB)", "{:.0f}"),
               ("peak_rss_before_step_MB", "before step (MB)", "{:.0f}"),
               ("peak_rss_after_step_MB", "after step (MB)", "{:.0f}"), ("buffer_MB", "comm buffers (MB)", "{:.1f}"),
               ("sent_MB_per_step", "sent per rank per step (MB)", "{:.1f}"), ("step_median_s", "step (s)", "{:.3f}")],
    "gather_in_time": [("variant", "variant", "{}"), ("link", "link", "{}"), ("preset", "preset", "{}"),
                       ("world_size", "ranks", "{}"), ("units_checked", "unit forwards checked", "{}"),
                       ("in_time", "weights already gathered", "{}"), ("median_wait_ms", "median wait (ms)", "{:.1f}"),
                       ("wait_per_step_ms", "waiting per step (ms)", "{:.0f}"),
                       ("forward_per_step_ms", "forward per step (ms)", "{:.0f}")],
    "weak_scaling": [("world_size", "ranks", "{}"), ("per_rank", "sequences per rank", "{}"),
                     ("global_batch", "global batch", "{}"), ("link", "link", "{}"),
                     ("tokens_per_s_no_comm_samples", "tokens/s, no communication [95% CI]", "ci0"),
                     ("efficiency_no_comm_samples", "its efficiency [95% CI]", "ci2"),
                     ("tokens_per_s_bucketed_samples", "tokens/s, 1 MB buckets [95% CI]", "ci0"),
                     ("efficiency_bucketed_samples", "its efficiency [95% CI]", "ci2")],
    "train_lm": [("sync", "sync", "{}"), ("world_size", "ranks", "{}"), ("threads", "threads per rank", "{}"),
                 ("accumulate", "micro-batches", "{}"),
                 ("link", "link", "{}"), ("steps", "steps", "{}"), ("step_s", "step (s), median [95% CI]", "ci"),
                 ("tokens_per_s", "tokens/s", "{:.0f}"), ("data_s", "data (s)", "{:.4f}"),
                 ("forward_s", "forward (s)", "{:.3f}"), ("backward_s", "backward (s)", "{:.3f}"),
                 ("sync_s", "exposed sync (s)", "{:.3f}"), ("optimizer_s", "optimizer (s)", "{:.3f}"),
                 ("loss_last20", "train loss, last 20 steps", "{:.4f}"), ("val_last", "validation loss", "{:.4f}"),
                 ("max_diff_vs_1", "max loss diff vs 1 rank", "{:.1e}")],
    "margins": [("check", "check (stage, what)", "{}"), ("worst_ratio", "worst diff / bound", "{:.3f}"),
                ("diff", "that diff", "{:.2g}"), ("bound", "its bound", "{:.2g}"), ("where", "where", "{}"),
                ("runs", "runs", "{}")],
    "elastic": [("scenario", "run", "{}"), ("link", "link", "{}"), ("ranks", "ranks", "{}"),
                ("seen_s", "failure seen after (s)", "{:.2f}"), ("round_s", "round (s)", "{:.2f}"),
                ("group_s", "new group (s)", "{:.2f}"), ("heal_s", "heal or state check (s)", "{:.2f}"),
                ("redone_step_s", "redone step (s)", "{:.2f}"), ("restart_s", "restart (s)", "{:.2f}"),
                ("lost_steps", "steps lost", "{}"), ("recovery_s", "failure -> next new step done (s)", "{:.2f}"),
                ("joined_at_step", "replacement joins at step", "{}"), ("join_s", "its join (s)", "{:.2f}"),
                ("final_loss", "loss at step 60", "{:.4f}"), ("max_diff", "max loss difference to the uninterrupted run", "{:.1e}")],
    "elastic_recovery": [("part", "what", "{}"), ("median_s", "median (s)", "{:.3f}"), ("p95_s", "p95 (s)", "{:.3f}"),
                         ("max_s", "max (s)", "{:.3f}"), ("samples", "samples", "{}")],
    "elastic_chaos": [("run", "run", "{}"), ("kill_times", "kill times", "{}"), ("sizes", "ranks, generation by generation", "{}"),
                      ("fallbacks", "fallbacks to the checkpoint", "{}"), ("redone", "steps redone", "{}"),
                      ("steps", "steps trained", "{}"), ("max_diff", "max loss difference to the uninterrupted run", "{:.1e}"),
                      ("exit", "exit", "{}"), ("left", "processes left", "{}")],
    "sharded_checkpoint": [("operation", "operation", "{}"), ("preset", "preset", "{}"), ("saved_by", "saved by (ranks)", "{}"),
                           ("world_size", "ranks", "{}"), ("files_per_rank", "files per rank, most", "{:.0f}"),
                           ("checkpoint_MB", "checkpoint (MB)", "{:.1f}"), ("largest_file_MB", "largest file (MB)", "{:.1f}"),
                           ("rss_added_MB", "peak RSS it added, most of any rank (MB)", "{:.0f}"),
                           ("gathered_rss_added_MB", "gathering the whole state instead (MB)", "{:.0f}"),
                           ("full_state_MB", "12P, by formula (MB)", "{:.1f}"), ("seconds", "time (s), slowest rank", "{:.2f}")],
    "fsdp": [("variant", "variant", "{}"), ("world_size", "ranks", "{}"), ("link", "link", "{}"), ("preset", "preset", "{}"),
             ("compute_dtype", "compute", "{}"), ("param_MB", "params (MB)", "{:.1f}"), ("grad_MB", "grads (MB)", "{:.1f}"),
             ("state_MB", "AdamW state (MB)", "{:.1f}"), ("total_MB", "total (MB)", "{:.1f}"),
             ("expected_MB", "by formula: 16P, 8P+8P/N or 16P/N (MB)", "{:.1f}"), ("gathered_peak_MB", "gathered, peak (MB)", "{:.1f}"),
             ("peak_rss_MB", "peak RSS (MB)", "rss"), ("sent_MB_per_step", "sent per rank per step (MB)", "{:.1f}"),
             ("step_s", "step (s), median [95% CI]", "ci"), ("ratio", "step / first variant's [95% CI]", "ci"),
             ("peak_cuda_MB", "peak CUDA allocated (MB)", "rss"),
             ("step_peak_cuda_MB", "a step's CUDA peak above its start (MB)", "{:.0f}")],
}


# Files whose table shows fewer columns than their benchmark's: extension 07a's memory runs time 2 steps of one
# variant per process, so their step times and ratios say nothing; the large run shows its step time.
_MEM = COLUMNS["fsdp"][:12]
COLUMNS_BY_FILE = {"ext07a_memory": _MEM, "ext07a_large": _MEM + [("step_median_s", "step (s), median of 2", "{:.1f}")]}
# On the GPU (scripts/machines/gpu_check.sh): CUDA's own allocator figures beside the tensors counted.
_GPU_FSDP = [c for c in COLUMNS["fsdp"] if c[0] not in ("link", "peak_rss_MB", "sent_MB_per_step", "ratio")]
_GPU_FSDP = [c if c[0] != "step_s" else ("step_median_s", "step (s), median", "{:.3f}") for c in _GPU_FSDP]
COLUMNS_BY_FILE.update({"gpu_ext07a_large_bf16": _GPU_FSDP, "gpu_ext07a_xl_bf16": _GPU_FSDP})
# NCCL at 1 rank moves nothing (the all-reduce is in place): its latency is the call's own cost, and a bandwidth
# computed from it would be meaningless.
COLUMNS_BY_FILE["gpu_stage01_nccl_w1"] = [c for c in COLUMNS["allreduce"] if c[0] not in ("algbw_GBps", "busbw_GBps")]


def gpu_check_table(doc):
    """scripts/machines/gpu_check.sh: one row per step, its exit code, time and its last PASS (or error) line."""
    lines = ["| step | result | time (s) | last line of its own checks |", "|---|---|---|---|"]
    for st in doc["rows"]:
        if st.get("rc") is None:
            lines.append(f"| `{st['name']}` | skipped ({st.get('skipped')}) | - | - |")
            continue
        tail = [l for l in st.get("log_tail", []) if "tests passed" in l]  # ctest's verdict line
        last = (st.get("pass_lines") or tail or st.get("log_tail") or ["-"])[-1]
        last = re.sub(r"^\[rank \d+/\d+\] ", "", last).replace("|", "\\|")
        last = last if len(last) <= 150 else last[:147] + "..."
        result = "PASS" if st["rc"] == 0 else f"FAIL (exit {st['rc']})"
        lines.append(f"| `{st['name']}` | {result} | {st['seconds']:.1f} | {last} |")
    notes = [f"{doc['passed']} steps passed, {doc['failed']} failed, {doc['skipped']} skipped; the build took "
             f"{doc['build_s']} s with {doc['cpu_cores']} cores. Device: {doc['device']} ({doc['device_memory_GiB']} GiB, "
             f"driver {doc['driver']}), torch {doc['torch']} (CUDA {doc['torch_cuda']}, NCCL {doc['nccl']}), "
             f"commit {doc['commit']}, {doc['date']}. Each step's command is below, its PASS lines in the JSON record."]
    if doc["command"] != doc.get("script", doc["command"]):  # a chosen subset of the steps (GPU_CHECK_ONLY)
        notes[0] += f" Run as `{doc['command']}`."
    return lines, notes


def cell(row, key, fmt):
    v = row.get(key)
    if v is None:
        return "-"
    if fmt == "ci":  # per-round samples
        return fmt_ci(v, "{:.3f}")
    if fmt in ("ci0", "ci2"):  # per-round samples, 0 or 2 decimals
        return fmt_ci(v, "{:.0f}" if fmt == "ci0" else "{:.2f}")
    if fmt == "rss":  # -1: several variants shared the process, so its peak is no one's
        return "-" if v < 0 else f"{v:.0f}"
    if fmt == "ms":
        return f"{v * 1e3:.3f}"
    if fmt == "ms0":
        return f"{v * 1e3:.0f}"
    return fmt.format(v)


def samples(doc):
    """Text sampled from each run's model (stage 08), as a code block per run."""
    out = []
    for r in doc["rows"]:
        if "sample" in r:
            out += [f"{r['sync']}, {r['world_size']} rank{'s' if r['world_size'] > 1 else ''}, after {r['steps']} steps "
                    f"(the prompt \"The \" and what followed it, temperature 0.8; `{r['command']}`):", "",
                    "```text", r["sample"], "```", ""]
    return "\n".join(out).rstrip()


def table(name):
    if name.endswith(".sample"):  # <!-- table:FILE.sample -->: the text sampled by the runs of FILE
        return samples(load(name[:-7]))
    doc = load(name)
    kind = doc["benchmark"].split(":")[0]
    if kind == "ext08a":
        lines, notes = capstone_curves_table(doc)
    elif kind == "ext07c" and "low_byte" in doc:
        lines, notes = fsdp_low_byte_table(doc)
    elif kind in ("ext05e", "ext07c"):
        lines, notes = (low_byte_table(doc) if "low_byte" in doc else low_byte_errors_table(doc) if "errors" in doc
                        else low_byte_curves_table(doc))
    elif name in COLUMNS_BY_FILE:
        lines, notes = plain_table(doc, COLUMNS_BY_FILE[name])
    else:
        lines, notes = (torch_ddp_table(doc) if kind == "compare_torch_ddp" else gpu_check_table(doc) if kind == "gpu_check" else
                        python_ddp_table(doc) if kind == "python_ddp" else
                        ddp_table(doc) if kind not in COLUMNS else plain_table(doc, COLUMNS[kind]))
    # Each row carries the command and machine it came from (older files: the file's own).
    cmds, machines = [], []
    for r in doc["rows"] or [{}]:  # a file with no rows (extension 05e's error study, curves): the file's own
        c, m = r.get("command", doc["command"]), r.get("machine", doc["machine"])
        if kind == "compare_torch_ddp":  # ours' machine line, and which PyTorch ran the peer
            m = f"{doc['ours']['machine']}; peer: PyTorch {doc['theirs']['torch_version']}"
        if c not in cmds:
            cmds.append(c)
        if m not in machines:
            machines.append(m)
    out = lines + [""] + [n + "  " for n in notes]
    out += [f"Measured on: {'; '.join(machines)}.  ", "Command" + ("s" if len(cmds) > 1 else "") + ":", ""]
    out += ["```sh"] + cmds + ["```"]
    return "\n".join(out)


# A measured number in a sentence: `<!-- n:FILE EXPR | FORMAT -->VALUE<!-- /n -->`. EXPR is evaluated over
# docs/results/FILE.json (names below), FORMAT is a str.format pattern ("{:.3f}", "x{0:.3f} [{1:.3f}, {2:.3f}]"
# for a (median, low, high) tuple); VALUE is what the generator wrote, so a page reads the same on a Git host.
NUMBER = re.compile(r"<!-- n:([\w.-]+) (.+?) -->(.*?)<!-- /n -->", re.S)


@functools.lru_cache(maxsize=None)
def number_env(name):
    doc = load(name)
    rows = doc.get("rows", []) if isinstance(doc, dict) else []

    def find(**kw):
        """The first row whose fields equal every keyword (a field named like a keyword: find(**{"a b": 1}))."""
        for r in rows:
            if all(r.get(k) == v for k, v in kw.items()):
                return r
        raise KeyError(f"no row of {name}.json with {kw}")

    def row(variant):
        return find(variant=variant)

    return {"d": doc, "rows": rows, "find": find, "row": row, "med": lambda xs: float(np.median(xs)),
            "ci": ci, "ratio": lambda a, b: compare(row(a), row(b)), "speedup": lambda v: speedup(doc, row(v)),
            "J": load, "np": np,
            "min": min, "max": max, "abs": abs, "len": len, "sum": sum, "round": round, "all": all, "any": any}


def number(name, body):
    expr, _, fmt = body.rpartition(" | ") if " | " in body else (body, "", "{}")
    if not (RESULTS / f"{name}.json").exists():
        raise ValueError(f"docs/results/{name}.json is missing")
    v = eval(expr, {"__builtins__": {}}, number_env(name))  # the repository's own pages, never user input
    return fmt.format(*v) if isinstance(v, (tuple, list)) else fmt.format(v)


# A comparison of measurements in words: `<!-- claim:FILE EXPR -->the words<!-- /claim -->`. EXPR is evaluated as a
# number's is; the claim stands while it is true, and make_tables fails naming the page and the words when new
# results contradict them. A comparative in a paragraph that quotes a measured number (an n: marker) must stand in
# one: "faster than", "fastest", "slower than", "slowest" (not "the slowest rank", which names whose time is shown).
CLAIM = re.compile(r"<!-- claim:([\w.-]+) (.+?) -->(.*?)<!-- /claim -->", re.S)
COMPARATIVE = re.compile(r"\b(?:faster|slower|quicker)\s+than\b|\b(?:fastest|slowest)\b(?!\s+ranks?\b)", re.I)


def claim_holds(name, expr):
    if not (RESULTS / f"{name}.json").exists():
        raise ValueError(f"docs/results/{name}.json is missing")
    # The names as globals, so that a comprehension in EXPR sees them too; the repository's own pages only.
    return bool(eval(expr, {"__builtins__": {}, **number_env(name)}))


def claims(md, text):
    """What is wrong with the claims of one page: a claim its results contradict (or that cannot be evaluated),
    and a comparative beside a measured number that no claim marker checks."""
    out = []
    for m in CLAIM.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        words = " ".join(m.group(3).split())[:120]
        try:
            if not claim_holds(m.group(1), m.group(2)):
                out.append(f"{md}:{line}: the results contradict \"{words}\" ({m.group(1)}.json: {m.group(2)} is false)")
        except Exception as e:
            out.append(f"{md}:{line}: the claim \"{words}\" cannot be checked: {e!r}")
    bare = re.sub(r"<!-- table:([\w.-]+) -->.*?<!-- /table:\1 -->", lambda m: "\n" * m.group(0).count("\n"), text,
                  flags=re.S)
    bare = CLAIM.sub(lambda m: "C" + "\n" * m.group(0).count("\n"), bare)
    bare = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), bare, flags=re.S)
    for start, para, header in paragraphs(bare):
        if header is not None or "<!-- n:" not in para:
            continue
        plain = NUMBER.sub("N", para)
        for m in COMPARATIVE.finditer(re.sub(r"`[^`]*`", " ", plain)):
            out.append(f"{md}:{start}: '{m.group(0)}' compares measurements unchecked: wrap the words in "
                       f"<!-- claim:FILE EXPR -->...<!-- /claim -->")
    return out


def self_test():
    """A page with a contradicted claim and one with an unmarked comparative must fail; a true claim passes.
    Run over a real results file (lm_speed.json), as the pages' claims are."""
    fsdp = 'med(find(sync="fsdp", world_size=2, link="simulated 1gbit link per rank")["step_s"])'
    ddp2 = 'med(find(sync="ddp, 2 MB buckets", world_size=2, link="simulated 1gbit link per rank")["step_s"])'
    number = f"<!-- n:lm_speed {fsdp} | {{:.3f}} -->0.289<!-- /n -->"
    cases = {
        "a true claim": (f"FSDP took {number} s, <!-- claim:lm_speed {ddp2} < {fsdp} -->slower than DDP with 2 MB "
                         f"buckets<!-- /claim -->.", 0),
        "a contradicted claim": (f"FSDP took {number} s, <!-- claim:lm_speed {fsdp} < {ddp2} -->the fastest of "
                                 f"all<!-- /claim -->.", 1),
        "an unmarked comparative": (f"FSDP took {number} s, the fastest of the three.", 1),
        "the slowest rank is a name, not a claim": (f"The slowest rank's step, {number} s.", 0),
    }
    wrong = [name for name, (text, n) in cases.items() if len(claims("page.md", text)) != n]
    # The ceiling note beside the speed-up column, over a real run: N when every rank and the single process had
    # their own cores (ddp_launch --cpus-per-rank), the no-communication row's speed-up below N otherwise.
    doc = load("stage05_tiny_1gbit")
    n = next(r["world_size"] for r in doc["rows"] if r["variant"].startswith("no communication"))
    unpinned = ceiling_note({k: v for k, v in doc.items() if k != "cpus_per_rank"})
    pinned = ceiling_note(dict(doc, cpus_per_rank=1))
    if not (unpinned and f"not {n}:" in unpinned and pinned and f"the ceiling is {n}," in pinned):
        wrong.append("the ceiling note follows the pinning")
    if wrong:
        print(f"make_tables --self-test: FAIL: {', '.join(wrong)}")
        return 1
    print(f"make_tables --self-test: PASS: {len(cases)} cases (a contradicted claim and an unmarked comparative "
          f"caught; a true claim and 'the slowest rank' let through); the ceiling note follows the pinning")
    return 0


# What reads as a measured number in prose: a decimal (0.812, x1.43) or a percentage. Versions (LibTorch 1.13.1,
# Python 3.11) are not; a number that is arithmetic, cited or a setting says so in its sentence (the words below).
MEASURED = re.compile(r"(?<![\w.\-/])[x×~]?\d+\.\d+(?![\d.]*\d)(?:\s?%)?|(?<![\w.])\d+\s?%")
VERSION = re.compile(r"(LibTorch|torch|PyTorch|Python|CUDA|NCCL|Gloo|Debian|version|C\+\+|CMake|cmake|Doxygen|"
                     r"GCC|gcc|clang|Slurm|OpenBLAS|FSDP|v|scipy|numpy|matplotlib|fmt|CLI11|GoogleTest)\W{0,2}$")
SAID = re.compile(r"arithmetic|cited|published|formula|closed form|by construction|threshold|tolerance|"
                  r"set by|setting|estimate|nominal|for example|e\.g\.", re.I)


def unsourced(md, text):
    """Measured-looking numbers in the prose of one page that no `n:` marker writes and no word explains."""
    text = re.sub(r"<!-- table:([\w.-]+) -->.*?<!-- /table:\1 -->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = NUMBER.sub("N", text)
    # A passage whose every number is arithmetic, cited or a setting says so once, visibly, and is fenced:
    # <!-- arithmetic: what computes it -->...<!-- /arithmetic --> (also cited:, settings:, and printed: for the
    # exact printout of a deterministic check, naming the test that prints it).
    text = re.sub(r"<!-- (arithmetic|cited|settings|printed): [^>]*?-->.*?<!-- /\1 -->",
                  lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"<!--.*?-->|```.*?```|\\code.*?\\endcode", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    out = []
    for para_start, para, header in paragraphs(text):
        for sentence in [para] if header is not None else re.split(r"(?<=[.;:!?])\s+(?=[A-Z(*\[])", para):
            plain = re.sub(r"`[^`]*`|\]\([^)]*\)|https?://\S+", " ", sentence)
            for m in MEASURED.finditer(plain):
                if VERSION.search(plain[:m.start()]) or SAID.search(plain) or (header and SAID.search(header)):
                    continue
                out.append(f"{md}:{para_start}: '{m.group(0)}' in \"{' '.join(sentence.split())[:140]}\"")
    return out


def paragraphs(text):
    """(first line, text, None) per paragraph or list item; (line, row, header row) per row of a hand-written
    table, whose header may say for a whole column that it is arithmetic or a setting."""
    start, buf, header = 0, [], None
    for i, line in enumerate(text.splitlines() + [""], 1):
        if line.lstrip().startswith("|"):
            if buf:
                yield start, " ".join(buf), None
                buf = []
            if header is None:
                header = line
            elif not re.fullmatch(r"[\s|:-]+", line):
                yield i, line, header
            continue
        header = None
        if line.strip():
            if buf and re.match(r"\s*([-*]|\d+\.) ", line):  # a list item starts a block of its own
                yield start, " ".join(buf), None
                buf = []
            if not buf:
                start = i
            buf.append(line)
        elif buf:
            yield start, " ".join(buf), None
            buf = []


def main(check, only):
    pattern = re.compile(r"(<!-- table:([\w.-]+) -->\n).*?(<!-- /table:\2 -->)", re.S)
    stale, loose, wrong_claims = [], [], []
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if only:  # some pages only: make_tables.py [--check] docs/05_bucketed.md ...
        unknown = [o for o in only if not any(pathlib.Path(o).resolve() == p for p in pages)]
        if unknown:
            print(f"make_tables: {', '.join(unknown)}: not a page (README.md or docs/*.md); give pages by path, "
                  f"e.g. docs/03_flat.md", file=sys.stderr)
            return 2
        pages = [p for p in pages if any(pathlib.Path(o).resolve() == p for o in only)]
    for md in pages:
        text = md.read_text()
        def repl(m):
            name = m.group(2)
            if not (RESULTS / f"{name.removesuffix('.sample')}.json").exists():
                raise SystemExit(f"make_tables: {md.name} has a table '{name}' but docs/results/{name}.json is missing")
            body = table(name)
            if md.parent == ROOT:  # README.md: the notes' links point into docs/
                body = body.replace(f"]({CEILING_PAGE})", f"](docs/{CEILING_PAGE})")
            return m.group(1) + body + "\n" + m.group(3)
        new = pattern.sub(repl, text)
        def num(m):
            try:
                return f"<!-- n:{m.group(1)} {m.group(2)} -->{number(m.group(1), m.group(2))}<!-- /n -->"
            except Exception as e:  # a marker that cannot be evaluated is a broken source
                raise SystemExit(f"make_tables: {md.name}: the number marker '{m.group(0)[:160]}' fails: {e!r}")
        new = NUMBER.sub(num, new)
        # A line that starts with `<!--` inside a paragraph starts an HTML block on a Git host (CommonMark), which
        # shows the rest of the line raw: a marker that a line break left at a line's start joins the line above.
        new = re.sub(r"(\S)[ \t]*\n[ \t]*(<!-- (?:n|claim):)", r"\1 \2", new)
        wrong_claims += claims(md.relative_to(ROOT), new)
        if check:
            loose += unsourced(md.relative_to(ROOT), new)
            loose += [f"{md.relative_to(ROOT)}:{i}: a number marker starts the line (a Git host shows that line as raw "
                      f"HTML): begin the sentence with a word" for i, line in enumerate(new.splitlines(), 1)
                      if line.lstrip().startswith(("<!-- n:", "<!-- claim:"))]
        if new != text:
            stale.append(str(md.relative_to(ROOT)))
            if not check:
                md.write_text(new)
                print(f"updated {md.relative_to(ROOT)}")
    if check and stale:
        print("make_tables --check: these pages differ from docs/results/*.json: " + ", ".join(stale)
              + "; run python3 scripts/pages/make_tables.py", file=sys.stderr)
        return 1
    if wrong_claims:
        print("\n".join(wrong_claims), file=sys.stderr)
        print(f"make_tables: {len(wrong_claims)} claim(s) in prose are contradicted by docs/results/*.json or not "
              f"checked: reword them to what the results show, or mark them with <!-- claim:FILE EXPR -->",
              file=sys.stderr)
        return 1
    if check and loose:
        print("\n".join(loose), file=sys.stderr)
        print(f"make_tables --check: {len(loose)} measured-looking numbers in prose have no source: write each with "
              f"<!-- n:FILE EXPR | FORMAT -->VALUE<!-- /n --> (docs/results/FILE.json), or say in its sentence that "
              f"it is arithmetic, cited or a setting", file=sys.stderr)
        return 1
    if check:
        print("make_tables --check: every table and every number in prose matches its JSON")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--self-test" in args:
        sys.exit(self_test())
    sys.exit(main("--check" in args, [a for a in args if a != "--check"]))
