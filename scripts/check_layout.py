#!/usr/bin/env python3
"""Checks that the code's includes run one way, and reports how big each stage is.

The floors, bottom to top: common/, then the stages in order, then extensions/. A file may include its
own floor and the floors below it, never above: common/ includes no stage, stage NN includes common/ and
the stages before it (never a later one, never an extension). Inside common/ each module (x.hpp and
x.cpp together) may include other modules, but the graph they make has no cycle: every module sits on
the ones it includes, so common/ reads bottom-up.

    python3 scripts/check_layout.py            # exit 1 naming each include that runs back up, or a cycle
    python3 scripts/check_layout.py --sizes    # also: lines of .cpp/.hpp per stage folder
    python3 scripts/check_layout.py --self-test   # the check fails on includes that run back up (ctest)

Exit codes: 0 one way (and the report), 1 an include runs back up or common/ has a cycle.
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".cpp", ".hpp")
# Lines of .cpp/.hpp a stage folder may hold and still read in one sitting (issue 23: stage 05 holds the
# buckets, about 550; the others about 650; the capstone composes the rest and is allowed a bit more).
SIZE_TARGET = {"05": 550, "08": 1100}
SIZE_DEFAULT = 650


def size_target(folder_name):
    """The most lines of .cpp/.hpp stage folder `folder_name` ("05_bucketed") may hold."""
    return SIZE_TARGET.get(folder_name[:2], SIZE_DEFAULT)


def stage_lines(folder):
    """Lines of .cpp/.hpp in a stage folder: what its size target counts."""
    return sum(len(f.read_text().splitlines()) for f in folder.iterdir() if f.suffix in SOURCES)


def floor(path):
    """(kind, order) of a path relative to ROOT: ("common", 0), ("stages", NN), ("extensions", NN), or None."""
    parts = pathlib.PurePosixPath(path).parts
    if not parts:
        return None
    if parts[0] == "common":
        return ("common", 0)
    if parts[0] in ("stages", "extensions") and len(parts) > 1:
        m = re.match(r"(\d+)", parts[1])
        return (parts[0], int(m.group(1)) if m else 0)
    return None


def includes(path):
    return INCLUDE.findall(path.read_text(errors="replace"))


def back_up(src, dst):
    """Why `src` including `dst` runs back up, or None when it does not."""
    a, b = floor(src), floor(dst)
    if a is None or b is None:
        return None
    if a[0] == "common" and b[0] != "common":
        return "common/ includes no stage and no extension"
    if a[0] == "stages" and b[0] == "extensions":
        return "a stage never includes an extension"
    if a[0] == "stages" and b[0] == "stages" and b[1] > a[1]:
        return f"stage {a[1]:02d} includes a later stage ({b[1]:02d})"
    return None


def common_graph(files):
    """common/'s module graph: module (file stem) -> the modules its .hpp and .cpp include."""
    graph = {}
    for f in files:
        rel = f.relative_to(ROOT).as_posix()
        if not rel.startswith("common/"):
            continue
        mod = f.stem
        graph.setdefault(mod, set())
        for inc in includes(f):
            if inc.startswith("common/"):
                other = pathlib.PurePosixPath(inc).stem
                if other != mod:
                    graph[mod].add(other)
    return graph


def find_cycle(graph):
    """A cycle in `graph` as a list of module names (first == last), or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def self_test():
    """Mutants the check must catch, and the includes it must let through."""
    caught = [back_up("common/dist.cpp", "stages/05_bucketed/buckets.hpp"),
              back_up("common/models.hpp", "extensions/05a_comm_hooks/comm_hooks.hpp"),
              back_up("stages/03_flat/main.cpp", "stages/05_bucketed/buckets.hpp"),
              back_up("stages/07_fsdp/fsdp.cpp", "extensions/06a_zero1_buckets/bucketed_zero1.hpp"),
              find_cycle({"dist": {"runtime"}, "runtime": {"launch_env", "dist"}, "launch_env": set()})]
    allowed = [back_up("stages/05_bucketed/main.cpp", "stages/04_overlap/overlap_ddp.hpp"),
               back_up("stages/05_bucketed/main.cpp", "common/dist.hpp"),
               back_up("extensions/05a_comm_hooks/main.cpp", "stages/05_bucketed/bucketed_ddp.hpp"),
               back_up("tests/stages/test_fsdp.cpp", "extensions/06a_zero1_buckets/bucketed_zero1.hpp"),
               find_cycle({"dist": {"runtime"}, "runtime": {"launch_env"}, "launch_env": set()})]
    missed = [i for i, why in enumerate(caught) if not why]
    wrong = [i for i, why in enumerate(allowed) if why]
    if missed or wrong:
        print(f"check_layout --self-test: FAIL: mutants {missed} not caught, allowed cases {wrong} refused")
        return 1
    print(f"check_layout --self-test: PASS: {len(caught)} mutants caught (an include from common/ into a stage or "
          f"an extension, from a stage into a later stage or an extension, a cycle in common/), "
          f"{len(allowed)} allowed includes let through")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", action="store_true", help="also print the lines of .cpp/.hpp per stage folder")
    ap.add_argument("--self-test", action="store_true", help="check that the check catches its mutants")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    files = sorted(f for d in ("common", "stages", "extensions", "tests", "tools")
                   for f in (ROOT / d).rglob("*") if f.suffix in SOURCES)
    bad = []
    for f in files:
        rel = f.relative_to(ROOT).as_posix()
        for inc in includes(f):
            why = back_up(rel, inc)
            if why:
                bad.append(f"{rel}: #include \"{inc}\": {why}")
    cycle = find_cycle(common_graph(files))
    if args.sizes:
        for folder in sorted(d for d in (ROOT / "stages").iterdir() if d.is_dir()):
            n, target = stage_lines(folder), size_target(folder.name)
            print(f"{folder.relative_to(ROOT).as_posix():28s} {n:6d} lines"
                  + ("" if n <= target else f"  over the ~{target}-line target of one sitting"))
        print("diff lengths: python3 scripts/stage_diffs.py --sizes; both budgets checked: --budget")
    for line in bad:
        print(line)
    if cycle:
        print("common/ has an include cycle: " + " -> ".join(cycle))
    if bad or cycle:
        print(f"check_layout: FAIL: {len(bad)} include(s) run back up{', and a cycle in common/' if cycle else ''}")
        return 1
    print(f"check_layout: PASS: {len(files)} files; includes run one way (extensions -> stages -> common), "
          "and common/'s modules form no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
