#!/usr/bin/env python3
"""Writes docs/diffs/: what each stage changed relative to the one before, from every file of both folders.

For stage NN (02..08) it takes every file of stages/NN-1_* and stages/NN_* (.cpp, .hpp, CMakeLists.txt;
headers included) and pairs them with no hand-written list:
  - a file with the same name in both folders is diffed against itself (main.cpp, CMakeLists.txt);
  - any other file of stage NN is diffed against the file of stage NN-1 of the same kind (.hpp with .hpp,
    .cpp with .cpp) whose lines of substance (not blank, braces, includes or namespace lines) it shares
    most (difflib's ratio), if that is at least MIN_SIMILARITY and that file is not taken yet:
    naive_ddp.cpp -> flat_ddp.cpp, overlap_ddp.hpp -> bucketed_ddp.hpp;
  - what is left is new (diffed against /dev/null), or, on the old side, not carried over (named in the
    header: usually a class the new stage still uses from the old folder, such as stage 04's hooks).

Outputs, per stage: docs/diffs/NN.diff (a header, then `diff -u` of every pair: headers first, then
sources, main.cpp and CMakeLists.txt last) and docs/diffs/NN.txt (each file of the stage with its lines
and its first comment line, then the common/ headers it includes). The pages include NN.diff, or NN.txt
where the stage is a new idea rather than an edit (05-09).

The budget (issue 23): a diff has two parts. The edits of the stage before's files (pairs with an old side)
are read as a diff and hold at most DIFF_BUDGET lines. A new file (diffed against /dev/null) is a new idea,
read whole like any file of the stage; what bounds it is the stage's own size target (check_layout.py's
SIZE_TARGET), which --budget checks too.

  python3 scripts/checks/stage_diffs.py            writes docs/diffs/ and prints each diff's length
  python3 scripts/checks/stage_diffs.py --check    exit 1 if docs/diffs/ is not what the sources give (ctest)
  python3 scripts/checks/stage_diffs.py --sizes    lines per diff, split into new files and edits (a report; exit 0)
  python3 scripts/checks/stage_diffs.py --budget   exit 1 naming each diff whose edits pass DIFF_BUDGET and each
                                                   stage folder past its size target (ctest layout_budgets)
  python3 scripts/checks/stage_diffs.py --self-test   the budget check catches its mutants (ctest)
"""
import argparse
import difflib
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402

ROOT = dplib.ROOT
from check_layout import stage_lines, size_target  # noqa: E402  (the stages' size targets live there)
# Below this, two files share too little for a diff to read as an edit: the diff is longer than the new
# file read whole. Measured on the formatted tree: overlap_ddp.cpp -> bucketed_ddp.cpp 0.12 (a 299-line diff
# for a 240-line file), flat_ddp.hpp -> overlap_ddp.hpp 0.11 (100 for 88); naive_ddp.cpp -> flat_ddp.cpp 0.19
# and naive_ddp.hpp -> flat_ddp.hpp 0.46 read as edits; files that only share boilerplate score 0.00-0.07.
MIN_SIMILARITY = 0.15
# Lines of edits of the stage before: what reads as "what changed" in one sitting (issue 23: 350), measured
# on formatted code since issue 76 (05 edits 369 lines of stage 04's, 07 351 of stage 06's: formatted, not squeezed).
DIFF_BUDGET = 400


def stage_dirs(root=ROOT / "stages"):
    return sorted(p for p in root.iterdir() if p.is_dir() and re.match(r"\d\d_", p.name))


def files_of(folder):
    return sorted(p for p in folder.iterdir() if p.suffix in (".cpp", ".hpp") or p.name == "CMakeLists.txt")


def kind(p):
    return "cmake" if p.name == "CMakeLists.txt" else p.suffix


def read_lines(p):
    return p.read_text().splitlines()


def substance(p):
    """The lines that say something: what two files must share for one to read as an edit of the other."""
    trivial = re.compile(r"^(\{|\}|\};|#include .*|#pragma once|namespace \w+ \{|\}  // namespace \w+)$")
    return [s for s in (line.strip() for line in read_lines(p)) if s and not trivial.match(s)]


def pair_files(old, new):
    """[(old or None, new)], and the old files left unpaired."""
    pairs, taken = {}, set()
    by_name = {p.name: p for p in old}
    for n in new:
        if n.name in by_name:
            pairs[n] = by_name[n.name]
            taken.add(by_name[n.name])
    # The rest by content: best-scoring pairs first, each old file used once.
    scored = []
    for n in new:
        if n in pairs:
            continue
        for o in old:
            if o in taken or kind(o) != kind(n):
                continue
            r = difflib.SequenceMatcher(None, substance(o), substance(n), autojunk=False).ratio()
            if r >= MIN_SIMILARITY:
                scored.append((r, o, n))
    for r, o, n in sorted(scored, key=lambda t: (-t[0], t[1].name, t[2].name)):
        if o in taken or n in pairs:
            continue
        pairs[n] = o
        taken.add(o)
    order = {".hpp": 0, ".cpp": 1, "cmake": 3}
    ordered = sorted(new, key=lambda p: (2 if p.name == "main.cpp" else order[kind(p)], p.name))
    return [(pairs.get(n), n) for n in ordered], [o for o in old if o not in taken]


def rel(p):
    if not p:
        return "/dev/null"
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def unified(old, new):
    # GNU diff's output (exit 1 when the files differ, which is the point here).
    r = subprocess.run(["diff", "-u", "--label", rel(old), "--label", rel(new), str(old or "/dev/null"), str(new)],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode not in (0, 1):
        sys.exit(f"stage_diffs: diff failed on {rel(old)} {rel(new)}: {r.stderr}")
    return r.stdout


def write_stage(prev, cur, out):
    n = cur.name[:2]
    pairs, dropped = pair_files(files_of(prev), files_of(cur))
    head = [f"# Stage {n} against stage {prev.name[:2]}: every file of {rel(prev)}/ and {rel(cur)}/, "
            "paired by scripts/checks/stage_diffs.py."]
    for o, c in pairs:
        head.append(f"#   {rel(o):45} -> {rel(c)}")
    for o in dropped:
        head.append(f"#   {rel(o):45} -> (not in this folder)")
    diffs = [(o, unified(o, c)) for o, c in pairs]
    body = "".join(d for _, d in diffs)
    (out / f"{n}.diff").write_text("\n".join(head) + "\n" + body)
    # The file list, with what each holds, and the common/ headers the stage includes.
    rows = ["lines  file                                        what it holds"]
    includes, earlier = set(), set()
    for f in files_of(cur):
        text = f.read_text()
        rows.append(f"{len(text.splitlines()):5d}  {rel(f):43} {what_it_holds(f, text)}")
        includes.update(re.findall(r'#include "(common/[\w./]+\.hpp)"', text))
        earlier.update(h for h in re.findall(r'#include "(stages/[\w./]+\.hpp)"', text) if not h.startswith(rel(cur)))
    rows.append(f"{sum(len(read_lines(f)) for f in files_of(cur)):5d}  in all")
    # What to read as a diff and what whole: the edits are what DIFF_BUDGET counts.
    edits = sum(len(d.splitlines()) for o, d in diffs if o is not None)
    edited = [c.name if o.name == c.name else f"{c.name} (was {o.name})" for o, c in pairs if o is not None]
    rows.append(f"edits of stage {prev.name[:2]}'s files, read in {n}.diff ({edits} of its lines): {', '.join(edited)}")
    new = [c.name for o, c in pairs if o is None]
    if new:
        rows.append(f"new, read whole: {', '.join(new)}")
    rows.append("from common/: " + " ".join(sorted(includes)))
    if earlier:
        rows.append("from earlier stages: " + " ".join(sorted(earlier)))
    (out / f"{n}.txt").write_text("\n".join(rows) + "\n")
    return len(body.splitlines()), edits


def what_it_holds(f, text):
    """The file's first comment line; for a .cpp that opens with its own header, what that header declares."""
    first = text.splitlines()[0] if text else ""
    if first.startswith("//") or first.startswith("#") and not first.startswith("#include"):
        said = re.sub(r"^(//|#) ?", "", first)
    elif f.suffix == ".cpp" and first == f'#include "{rel(f.with_suffix(".hpp"))}"':
        said = f"the definitions of what {f.stem}.hpp declares"
    elif f.name == "CMakeLists.txt":
        said = "how the stage builds: its program and its library"
    else:
        said = ""
    return said if len(said) <= 100 else said[:97] + "..."


def generate(out, stages=ROOT / "stages"):
    """Writes every NN.diff and NN.txt into `out`; {NN: (lines of the diff, lines of it editing the stage before)}."""
    out.mkdir(parents=True, exist_ok=True)
    dirs = stage_dirs(stages)
    return {cur.name[:2]: write_stage(prev, cur, out) for prev, cur in zip(dirs, dirs[1:])}


def over_budget(stages=ROOT / "stages"):
    """Why the stages under `stages` break the budget: each diff whose edits of the stage before pass
    DIFF_BUDGET, each stage folder past its size target. Empty when both hold."""
    with tempfile.TemporaryDirectory() as tmp:
        lengths = generate(pathlib.Path(tmp), stages)
    why = []
    for n, (length, edits) in lengths.items():
        if edits > DIFF_BUDGET:
            why.append(f"{n}.diff: {edits} lines edit stage {int(n) - 1:02d}'s files, past the "
                       f"{DIFF_BUDGET}-line budget: keep more of its lines as they were")
    for d in stage_dirs(stages):
        if (lines := stage_lines(d)) > size_target(d.name):
            why.append(f"{d.name}: {lines} lines of .cpp/.hpp, past its {size_target(d.name)}-line "
                       "target of one sitting: move a feature to extensions/")
    return why


def self_test():
    """Mutants the budget check must catch, and a stage it must let through (new files are not edits)."""
    def stages_of(tmp, files):  # {"04_a/x.cpp": lines} -> a stages/ folder under tmp
        root = pathlib.Path(tmp) / "stages"
        for name, lines in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("".join(line + "\n" for line in lines))
        return root
    base = [f"int a{i} = {i};" for i in range(100)]
    edited = base[:50] + [f"int b{i} = {i};" for i in range(10)] + base[60:]
    cases = {  # name -> (files, caught?)
        "edits past the budget": ({"04_a/x.cpp": base * 2, "05_b/x.cpp": [f"long c{i};" for i in range(250)]}, True),
        "stage 05 past 600 lines": ({"04_a/x.cpp": base, "05_b/x.cpp": edited, "05_b/y.cpp": base * 6}, True),
        "a small edit and a new file": ({"04_a/x.cpp": base, "05_b/x.cpp": edited, "05_b/y.cpp": base * 4}, False),
    }
    wrong = []
    for name, (files, caught) in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            if bool(over_budget(stages_of(tmp, files))) != caught:
                wrong.append(name)
    if wrong:
        print(f"stage_diffs --self-test: FAIL: {', '.join(wrong)}")
        return 1
    print(f"stage_diffs --self-test: PASS: {len(cases)} cases (edits past the budget and a stage past its size "
          "caught; a new file not counted as an edit)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if docs/diffs/ is stale")
    ap.add_argument("--sizes", action="store_true", help="report each diff's length, new files and edits")
    ap.add_argument("--budget", action="store_true", help="fail if edits pass the budget or a stage its size")
    ap.add_argument("--self-test", action="store_true", help="check that --budget catches its mutants")
    ap.add_argument("out", nargs="?", default=str(ROOT / "docs" / "diffs"))
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if a.budget:
        why = over_budget()
        for line in why:
            print(line)
        if why:
            print(f"stage_diffs --budget: FAIL: {len(why)} over")
            return 1
        print(f"stage_diffs --budget: PASS: every diff edits at most {DIFF_BUDGET} lines of the stage before, and "
              "every stage folder is within its size target")
        return 0
    if a.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(pathlib.Path(tmp))
            r = subprocess.run(["diff", "-r", tmp, str(ROOT / "docs" / "diffs")])
        if r.returncode != 0:
            print("docs/diffs is stale: run python3 scripts/checks/stage_diffs.py, "
                  "then python3 scripts/pages/expand_snippets.py")
            return 1
        print("docs/diffs is current")
        return 0
    if a.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            lengths = generate(pathlib.Path(tmp))
    else:
        lengths = generate(pathlib.Path(a.out))
    for n, (length, edits) in lengths.items():
        # A new file is read whole (its stage's size target bounds it); the edits are what the budget counts.
        new_files = length - edits
        split = f" ({new_files} in new files, {edits} editing stage {int(n) - 1:02d}'s)" if new_files else ""
        print(f"{n}.diff: {length:5d} lines{split}{'' if edits <= DIFF_BUDGET else f'  edits over the {DIFF_BUDGET}-line budget'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
