#!/usr/bin/env python3
"""Checks a training trace (`--bench ... --trace FILE`): how much communication hides behind backward.

  trace_overlap.py TRACE --variant NAME --max-overlap F   every step's overlap fraction <= F
  trace_overlap.py TRACE --variant NAME --min-overlap F   the straggler's median share of the possible >= F
  trace_overlap.py TRACE --check-format                   the trace is complete and consistent

For every timed step of the variant on every rank, the overlap fraction is the part of the step's
communication time (the union of the spans of the collectives launched in it) that falls inside the
step's backward span. Stage 03 communicates only after backward, so it must be 0 in every step;
overlaps of at most --tolerance-ms (default 1 ms, clock granularity) count as none. Bucketed DDP
hides communication behind backward, but how much depends on timing, and on the CPU: communication
can only hide while backward runs, so at most min(communication, backward) of it can, and a faster CPU
shortens backward while the simulated link keeps communication as long (an AMD EPYC with AVX-512 ran
tiny's backward in 0.2-0.3 s against 0.31-0.46 s of communication: at most 0.6 of it could hide).
--min-overlap therefore asks for a share of that possible overlap, hidden / min(communication,
backward), which is the plain fraction wherever backward is the longer. It is checked in each round on
the straggler, the rank with the longest backward: a faster rank's collectives include waiting for the
straggler's last buckets, which hides behind the straggler's backward rather than its own (on 2 cores
one rank is often 1.5x slower). The median over rounds counts, so one noisy step does not fail it.

--check-format: every rank 0..N-1 is present with the same steps; every step (but the reference
all-reduce) has forward, backward and optimizer spans inside it; every collective has a non-negative
duration and lies inside the step that launched it (within the tolerance).

Exit 0: the condition holds; 1: it does not (the message names the step and rank); 2: bad input.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from dplib import trace as tl  # noqa: E402


def check_format(t, tol_us):
    problems = list(t.bad)
    pids = sorted(t.steps)
    if pids != list(range(len(pids))):
        problems.append(f"ranks {pids} are not 0..{len(pids) - 1}: a rank's events are missing")
    for pid in sorted(t.ranks):
        if pid not in t.steps:
            problems.append(f"{t.ranks[pid]} has no step spans")
    keys = {pid: [(s.variant, s.round) for s in t.steps[pid]] for pid in pids}
    for pid in pids[1:]:
        if keys[pid] != keys[pids[0]]:
            problems.append(f"rank {pid} ran other steps than rank {pids[0]}: "
                            f"{len(keys[pid])} vs {len(keys[pids[0]])} steps")
    for pid, span in t.orphans:
        problems.append(f"rank {pid}: '{span.name}' at {span.ts / 1e3:.3f} ms lies in no step")
    for pid in pids:
        for s in t.steps[pid]:
            where = f"rank {pid}, {s.variant!r} round {s.round}"
            if s.dur < 0:
                problems.append(f"{where}: negative step duration")
            if s.variant != tl.REFERENCE:
                for name in ("forward", "backward", "optimizer"):
                    if not s.phase(name):
                        problems.append(f"{where}: no '{name}' span")
            for p in s.phases:
                if p.end > s.end + tol_us:
                    problems.append(f"{where}: '{p.name}' ends {(p.end - s.end) / 1e3:.3f} ms after the step")
            for c in s.comms:
                if c.end > s.end + tol_us:
                    problems.append(f"{where}: collective '{c.name}' ends {(c.end - s.end) / 1e3:.3f} ms after the step")
    ncomm = sum(len(s.comms) for pid in pids for s in t.steps[pid])
    nsteps = sum(len(v) for v in t.steps.values())
    for p in problems[:20]:
        print("FORMAT:", p)
    if len(problems) > 20:
        print(f"FORMAT: ... and {len(problems) - 20} more")
    print(f"format: {len(pids)} ranks, {nsteps} steps, {ncomm} collectives, variants: {', '.join(tl.variants(t))}: "
          + ("ok" if not problems else f"{len(problems)} problems"))
    return not problems


def check_overlap(t, variant, args, tol_us):
    steps = tl.steps_of(t, variant)
    if not steps:
        raise tl.TraceError(f"variant {variant!r} has no steps")
    print(f"{variant}: fraction of communication time overlapping backward, per step (and of the possible: "
          f"hidden / min(communication, backward))")
    per_rank, failures = {}, []
    for s in steps:
        comm, bwd, hidden = tl.overlap(s)
        if comm == 0:
            print(f"  rank {s.rank} round {s.round}: no collectives")
            continue
        frac = hidden / comm
        # The most that can hide is the shorter of the two: the share of that which did.
        possible = hidden / min(comm, bwd) if bwd > 0 else 0.0
        per_rank.setdefault(s.rank, []).append((frac, possible, bwd, s))
        print(f"  rank {s.rank} round {s.round}: step {s.dur / 1e3:8.2f} ms, backward {bwd / 1e3:8.2f} ms, "
              f"communication {comm / 1e3:8.2f} ms, overlapping {hidden / 1e3:8.2f} ms -> {frac:.3f} "
              f"({possible:.3f} of the possible)")
        if args.max_overlap is not None and frac > args.max_overlap and hidden - args.max_overlap * comm > tol_us:
            failures.append(f"rank {s.rank} round {s.round}: {frac:.3f} of {comm / 1e3:.2f} ms of communication "
                            f"({hidden / 1e3:.2f} ms) overlaps backward; at most {args.max_overlap} "
                            f"(+{tol_us / 1e3:g} ms) allowed")
    if not per_rank:
        raise tl.TraceError(f"variant {variant!r} launched no collectives: nothing to check")
    for r, v in sorted(per_rank.items()):
        print(f"  rank {r}: median {tl.median([x[0] for x in v]):.3f} over {len(v)} steps "
              f"({tl.median([x[1] for x in v]):.3f} of the possible)")
    # The straggler of each round: the rank with the longest backward. A faster rank's collectives also
    # wait for the straggler's buckets; that wait hides behind the straggler's backward, not its own, so
    # only the straggler's share says how much of the step's communication backward really hides.
    rounds = {}
    for r, v in per_rank.items():
        for _, possible, bwd, s in v:
            if s.round not in rounds or bwd > rounds[s.round][0]:
                rounds[s.round] = (bwd, possible, r)
    shares = [rounds[k][1] for k in sorted(rounds)]
    med = tl.median(shares)
    print("  straggler (longest backward) per round, share of the possible: "
          + ", ".join(f"round {k} rank {rounds[k][2]} {rounds[k][1]:.3f}" for k in sorted(rounds)))
    print(f"  median over rounds of the straggler's share of the possible: {med:.3f}")
    if args.min_overlap is not None and med < args.min_overlap:
        low = min(sorted(rounds), key=lambda k: rounds[k][1])
        failures.append(f"median straggler overlap {med:.3f} of the possible (hidden / min(communication, backward)) "
                        f"over {len(shares)} rounds is below {args.min_overlap} (lowest: round {low}, rank "
                        f"{rounds[low][2]}, {rounds[low][1]:.3f})")
    for f in failures:
        print("FAIL:", f)
    return not failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--variant", help="exact name or a unique substring, e.g. 'flat' or 'bucketed 1 MB'")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--max-overlap", type=float, metavar="F", help="every step's fraction must be <= F")
    g.add_argument("--min-overlap", type=float, metavar="F",
                   help="the straggler's median share of the possible overlap, hidden / min(communication, backward), "
                        "must be >= F")
    ap.add_argument("--tolerance-ms", type=float, default=1.0, help="clock granularity allowance (default 1)")
    ap.add_argument("--check-format", action="store_true", help="check the trace's completeness and consistency")
    args = ap.parse_args()
    if not args.check_format and not args.variant:
        ap.error("give --variant NAME (with --max-overlap or --min-overlap) and/or --check-format")
    if (args.max_overlap is not None or args.min_overlap is not None) and not args.variant:
        ap.error("--max-overlap / --min-overlap need --variant")
    for v in (args.max_overlap, args.min_overlap):
        if v is not None and not 0 <= v <= 1:
            ap.error("overlap fractions lie in [0, 1]")
    try:
        t = tl.load(args.trace)
        ok = True
        if args.check_format:
            ok = check_format(t, args.tolerance_ms * 1e3) and ok
        if args.variant:
            ok = check_overlap(t, tl.match_variant(t, args.variant), args, args.tolerance_ms * 1e3) and ok
    except tl.TraceError as e:
        print(f"trace_overlap.py: {e}", file=sys.stderr)
        return 2
    print("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
