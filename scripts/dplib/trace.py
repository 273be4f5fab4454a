"""Reading the Chrome trace-event files that the training stages write with `--bench ... --trace FILE`.

Shared by scripts/trace/timeline.py (pictures), scripts/trace/trace_overlap.py (the ctest checker),
scripts/trace/trace_summary.py and scripts/pages/figures.py; standard library only. The format (common/base/trace.cpp): one process (pid) per rank; tid 0 is the compute lane
with "X" spans "step" (args: variant, round), nested "forward" / "backward" / "sync" / "optimizer",
and "i" instants ("ready <param>", "bucket 3 ready"); tids 1.. are communication lanes with one "X"
span per collective from launch to completion (args: op, carries, bytes). Times are microseconds.

Within one rank the step spans never overlap, so every compute event belongs to the step whose
window contains it, and every collective to the step in which it was launched.
"""
import bisect
import json
import os
import statistics

from dplib import trace_events

REFERENCE = "reference: one flat all-reduce"  # the step span holding one all-reduce of every gradient
PHASES = ("forward", "backward", "sync", "optimizer")


class TraceError(Exception):
    """Bad input: a missing or unreadable file, not a trace, an unknown variant or round (exit 2)."""


class Span:
    __slots__ = ("name", "ts", "end", "args")

    def __init__(self, name, ts, end, args):
        self.name, self.ts, self.end, self.args = name, ts, end, args

    @property
    def dur(self):
        return self.end - self.ts


class Step(Span):
    """One rank's step of one variant, with the events that happened inside it."""
    __slots__ = ("rank", "variant", "round", "phases", "instants", "comms")

    def __init__(self, rank, ev):
        args = ev.get("args") or {}
        super().__init__("step", ev["ts"], ev["ts"] + ev["dur"], args)
        self.rank, self.variant, self.round = rank, args.get("variant", "?"), args.get("round")
        self.phases, self.instants, self.comms = [], [], []  # Span lists

    def phase(self, name):
        return [s for s in self.phases if s.name == name]


class Trace:
    def __init__(self, path):
        self.path = path
        self.ranks = {}        # pid -> rank label ("rank 0")
        self.steps = {}        # pid -> [Step] sorted by start
        self.orphans = []      # (pid, Span): events on no step's window (a format error)
        self.bad = []          # messages about malformed events (a format error)


def _num(ev, key):
    v = ev.get(key)
    if not isinstance(v, (int, float)):
        raise TraceError(f"event {ev.get('name')!r} has no numeric '{key}': is this a trace written by --trace?")
    return v


def load(path):
    """Reads a trace (plain, or gzipped as bench_docs.sh keeps them: NAME.json.gz); raises TraceError when it
    is missing or not one written by --trace."""
    if not os.path.isfile(path):
        raise TraceError(f"no such file: {path}")
    try:
        events = trace_events(path)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{path} is not a JSON trace file ({e})")
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise TraceError(f"{path} has no 'traceEvents' list: not a Chrome trace-event file")
    t = Trace(path)
    others = []
    for ev in events:
        pid, ph, name = ev.get("pid"), ev.get("ph"), ev.get("name")
        if ph == "M":
            if name == "process_name":
                t.ranks[pid] = (ev.get("args") or {}).get("name", f"rank {pid}")
        elif ph == "X" and name == "step" and ev.get("tid", 0) == 0:
            _num(ev, "ts"), _num(ev, "dur")
            t.steps.setdefault(pid, []).append(Step(pid, ev))
        elif ph in ("X", "i"):
            others.append(ev)
    if not t.steps:
        raise TraceError(f"{path} holds no 'step' spans: not a trace written by a stage's --bench --trace")
    starts = {}
    for pid, steps in t.steps.items():
        steps.sort(key=lambda s: s.ts)
        starts[pid] = [s.ts for s in steps]
    for ev in others:
        pid, tid = ev.get("pid"), ev.get("tid", 0)
        ts = _num(ev, "ts")
        dur = _num(ev, "dur") if ev["ph"] == "X" else 0
        span = Span(ev.get("name", "?"), ts, ts + dur, ev.get("args") or {})
        if dur < 0:
            t.bad.append(f"rank {pid}: '{span.name}' at {ts} us has a negative duration ({dur} us)")
        k = bisect.bisect_right(starts.get(pid, []), ts) - 1  # the last step that started at or before ts
        step = t.steps[pid][k] if k >= 0 else None
        if step is None or ts > step.end:
            t.orphans.append((pid, span))
        elif tid != 0:
            step.comms.append(span)
        elif ev["ph"] == "i":
            step.instants.append(span)
        else:
            if span.name.startswith("optimizer bucket"):  # stage 05 --overlap-optimizer: one per bucket, inside sync
                span.args = dict(span.args, bucket=span.name[len("optimizer bucket "):])
                span.name = "optimizer"
            step.phases.append(span)
    return t


def variants(t):
    """Variant names in the order rank 0 (or the lowest rank) first ran them."""
    seen = []
    for s in t.steps[min(t.steps)]:
        if s.variant not in seen:
            seen.append(s.variant)
    return seen


def match_variant(t, query):
    """The variant named `query` exactly, else the only one containing it (case-insensitive; the
    reference all-reduce only when no training variant does, so that 'flat' means stage 03)."""
    names = variants(t)
    if query in names:
        return query
    hits = [n for n in names if query.lower() in n.lower()]
    if len(hits) > 1 and REFERENCE in hits:
        hits.remove(REFERENCE)
    if len(hits) == 1:
        return hits[0]
    listing = "\n  ".join(names)
    why = f"is ambiguous ({len(hits)} match)" if hits else "matches none"
    raise TraceError(f"variant {query!r} {why}; the trace holds:\n  {listing}")


def steps_of(t, variant, rank=None, round_=None):
    """The steps of `variant` (every rank, or one), optionally of one round, sorted by rank and time."""
    return [s for pid in sorted(t.steps) if rank is None or pid == rank
            for s in t.steps[pid] if s.variant == variant and (round_ is None or s.round == round_)]


def rounds_of(t, variant):
    return sorted({s.round for s in steps_of(t, variant) if s.round is not None})


def median_round(t, variant):
    """The round whose step on the lowest rank took the median time (the lower median)."""
    steps = [s for s in steps_of(t, variant, rank=min(t.steps)) if s.round is not None]
    if not steps:
        raise TraceError(f"variant {variant!r} has no numbered rounds")
    steps.sort(key=lambda s: s.dur)
    return steps[(len(steps) - 1) // 2].round


# ---- intervals: lists of (start, end) ----------------------------------------------------------
def union(intervals):
    """Merged, sorted, disjoint intervals covering the same time."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [tuple(x) for x in out]


# Collectives one Gloo group runs at once: common/base/c10d_compat.hpp creates its groups with 2 worker threads.
GLOO_WORKERS = 2


def on_the_link(spans, workers=GLOO_WORKERS):
    """(span, start, worker) per collective span, in launch order: when each began to move bytes, and on
    which of the group's worker threads. A Gloo group queues the collectives launched on it and runs them in
    launch order on `workers` threads: one starts when it is launched and a worker is free, that is at the
    completion of the one that worker ran before. So at most `workers` collectives share the rank's link at
    any time, and [launch, start) is the time one waited in the queue. A completion recorded before the
    start this gives (a trace whose order differs) starts it at its completion, never after."""
    free = [(float("-inf"), w) for w in range(workers)]  # (time the worker is free, worker)
    out = []
    for s in sorted(spans, key=lambda s: (s.ts, s.end)):
        free.sort()
        at, w = free.pop(0)
        start = min(max(s.ts, at), s.end)
        out.append((s, start, w))
        free.append((s.end, w))
    return out


def length(intervals):
    return sum(b - a for a, b in union(intervals))


def intersect(x, y):
    """The time covered by both interval lists (each may overlap itself)."""
    x, y, out, i, j = union(x), union(y), [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap(step):
    """(communication us, backward us, hidden us) of one step: the union of its collective spans,
    its backward span(s), and how much of that communication ran while backward was running."""
    comm = [(c.ts, c.end) for c in step.comms]
    bwd = [(p.ts, p.end) for p in step.phase("backward")]
    return length(comm), length(bwd), length(intersect(comm, bwd))


def median(xs):
    return statistics.median(xs) if xs else float("nan")
