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
where the stage is a new idea rather than an edit (06, 07, 08) until its diff fits one sitting.

  python3 scripts/stage_diffs.py            writes docs/diffs/ and prints each diff's length
  python3 scripts/stage_diffs.py --check    exit 1 if docs/diffs/ is not what the sources give (ctest)
  python3 scripts/stage_diffs.py --sizes    lines per diff against DIFF_BUDGET, split into new files and edits
                                            (a report; exit 0)
"""
import argparse
import difflib
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Below this, two files share too little for a diff to read as an edit. Measured: files of the same role
# score 0.11-0.46 (flat_ddp.hpp -> overlap_ddp.hpp 0.11, naive_ddp.hpp -> flat_ddp.hpp 0.46); files that
# only share boilerplate score 0.00-0.05.
MIN_SIMILARITY = 0.10
DIFF_BUDGET = 350      # lines: what a page can show as "what changed" in one sitting (issue 23)


def stage_dirs():
    return sorted(p for p in (ROOT / "stages").iterdir() if p.is_dir() and re.match(r"\d\d_", p.name))


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
    return str(p.relative_to(ROOT)) if p else "/dev/null"


def unified(old, new):
    # GNU diff's output (exit 1 when the files differ, which is the point here).
    r = subprocess.run(["diff", "-u", "--label", rel(old), "--label", rel(new), rel(old), rel(new)],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode not in (0, 1):
        sys.exit(f"stage_diffs: diff failed on {rel(old)} {rel(new)}: {r.stderr}")
    return r.stdout


def write_stage(prev, cur, out):
    n = cur.name[:2]
    pairs, dropped = pair_files(files_of(prev), files_of(cur))
    head = [f"# Stage {n} against stage {prev.name[:2]}: every file of {rel(prev)}/ and {rel(cur)}/, "
            "paired by scripts/stage_diffs.py."]
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
    rows.append("from common/: " + " ".join(sorted(includes)))
    if earlier:
        rows.append("from earlier stages: " + " ".join(sorted(earlier)))
    (out / f"{n}.txt").write_text("\n".join(rows) + "\n")
    new_files = sum(len(d.splitlines()) for o, d in diffs if o is None)
    return len(body.splitlines()), new_files


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


def generate(out):
    out.mkdir(parents=True, exist_ok=True)
    dirs = stage_dirs()
    return {cur.name[:2]: write_stage(prev, cur, out) for prev, cur in zip(dirs, dirs[1:])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if docs/diffs/ is stale")
    ap.add_argument("--sizes", action="store_true", help="report each diff's length against the budget")
    ap.add_argument("out", nargs="?", default=str(ROOT / "docs" / "diffs"))
    a = ap.parse_args()
    if a.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(pathlib.Path(tmp))
            r = subprocess.run(["diff", "-r", tmp, str(ROOT / "docs" / "diffs")])
        if r.returncode != 0:
            print("docs/diffs is stale: run python3 scripts/stage_diffs.py, then python3 scripts/expand_snippets.py")
            return 1
        print("docs/diffs is current")
        return 0
    if a.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            lengths = generate(pathlib.Path(tmp))
    else:
        lengths = generate(pathlib.Path(a.out))
    for n, (length, new_files) in lengths.items():
        # A new file can only be read whole: the split says how much of a diff is new code and how much edits.
        split = f" ({new_files} in new files, {length - new_files} editing stage {int(n) - 1:02d}'s)" if new_files else ""
        print(f"{n}.diff: {length:5d} lines{split}{'' if length <= DIFF_BUDGET else f'  over the {DIFF_BUDGET}-line budget'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
