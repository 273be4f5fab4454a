#!/usr/bin/env python3
"""The workbook: a learner writes each stage's core; the stage's own tests check it (docs/workbook.md).

The exercises are regions of the stages' own sources (the stage code is the reference solution):
    // [exercise 02.1: average every gradient over the ranks]
    ...
    // [/exercise 02.1]
with their page, hint and ctest label in scripts/course/workbook.toml. This script writes the learner's copy of
the stage sources that hold exercises into workbook/stages/ (ignored by git) with every region replaced by a
stub that throws dp::NotImplemented naming the exercise, what to read and a hint. `cmake --preset workbook`
builds the programs and tests with those files in place of the stages' own (every other file, headers
included, comes from stages/), so `ctest --preset workbook -L stage02` checks the learner's code with the
same suites that check the reference.

    python3 scripts/course/workbook.py init [--force]   # write workbook/ (refuses to overwrite without --force)
    python3 scripts/course/workbook.py status           # each exercise: stub, written, or the reference's code
    python3 scripts/course/workbook.py diff [NN ...]    # the learner's regions against the reference
    python3 scripts/course/workbook.py reset NN [NN ...]  # stage NN's stubs again (the files replaced are backed up)
    python3 scripts/course/workbook.py solve NN [NN ...]  # stage NN's reference code (backed up likewise)
    python3 scripts/course/workbook.py update NN [NN ...] # the course changed stage NN: its new files, your code kept
    python3 scripts/course/workbook.py pages            # each stage page's exercises and folded hints, from the above
    python3 scripts/course/workbook.py check            # CI: regions, metadata and pages agree; stubs round-trip
    python3 scripts/course/workbook.py self-test        # CI: the check catches broken regions and metadata
    python3 scripts/course/workbook.py stubs-fail build   # CI: stubbed, each stage's contract test fails (build's flags)
"""
import argparse
import difflib
import re
import shlex
import shutil
import signal
import sys
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402
from dplib import gtest  # noqa: E402

ROOT = dplib.ROOT
STAGES = ROOT / "stages"
BOOK = ROOT / "workbook"
META = Path(__file__).resolve().parent / "workbook.toml"
SOURCES = (".cpp", ".hpp")
BEGIN = re.compile(r"^(?P<indent>[ \t]*)// \[exercise (?P<id>\d\d\.\d+): (?P<title>[^\]]+)\][ \t]*$")
END = re.compile(r"^[ \t]*// \[/exercise (?P<id>\d\d\.\d+)\][ \t]*$")
INCLUDE = '#include "common/base/errors.hpp"  // dp::NotImplemented: the workbook\'s stubs\n'


class Bad(Exception):
    """Bad input or a broken region: the message names it; exit 2 (input) or 1 (check)."""


class Region:
    def __init__(self, path, id, title, indent, begin, end, body):
        self.path, self.id, self.title, self.indent = path, id, title, indent
        self.begin, self.end, self.body = begin, end, body  # line indices of the markers; the lines between

    @property
    def stage(self):
        return self.id[:2]


def regions_of(path, lines):
    """The exercise regions of one file (a list of lines with their ends), in order."""
    found, open_ = [], None
    for i, line in enumerate(lines):
        b, e = BEGIN.match(line), END.match(line)
        if b:
            if open_:
                raise Bad(f"{path}:{i + 1}: exercise {b['id']} begins inside exercise {open_[1]['id']}")
            open_ = (i, b)
        elif e:
            if not open_ or open_[1]["id"] != e["id"]:
                raise Bad(f"{path}:{i + 1}: '[/exercise {e['id']}]' closes no open exercise {e['id']}")
            j, b = open_
            found.append(Region(path, b["id"], b["title"], b["indent"], j, i, lines[j + 1:i]))
            open_ = None
    if open_:
        raise Bad(f"{path}:{open_[0] + 1}: exercise {open_[1]['id']} is never closed ('// [/exercise {open_[1]['id']}]')")
    return found


def source_files(root):
    return sorted(p for p in root.rglob("*") if p.suffix in SOURCES and p.is_file())


def read_lines(path):
    return path.read_text().splitlines(keepends=True)


def load_meta():
    return tomllib.loads(META.read_text()).get("exercise", {})


def all_regions(root=STAGES):
    """{id: Region} over every source file under `root`; duplicate ids are an error."""
    out = {}
    for path in source_files(root):
        for r in regions_of(path, read_lines(path)):
            if r.id in out:
                raise Bad(f"exercise {r.id} is marked twice: {out[r.id].path} and {path}")
            out[r.id] = r
    return out


def cxx_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def stub_lines(region, meta):
    m = meta[region.id]
    i = region.indent
    return [
        f"{i}// Exercise {region.id}: {region.title}. Your code replaces the throw below; check it with\n",
        f"{i}//   cmake --build --preset workbook && ctest --preset workbook -L {m['check']}\n",
        f"{i}throw dp::NotImplemented({cxx_string(region.id)}, {cxx_string(region.title)}, {cxx_string(m['read'])},\n",
        f"{i}                         {cxx_string(m['hint'])});\n",
    ]


def filled(path, meta, bodies=None, lines=None):
    """The text of `path` (a stage source; or its `lines`, when given) with each exercise region holding
    `bodies[id]` (the learner's code) or, for an exercise `bodies` lacks, its stub."""
    lines = read_lines(path) if lines is None else lines
    regions = regions_of(path, lines)
    if not regions:
        return "".join(lines)
    out, last = [], 0
    for r in regions:
        out += lines[last:r.begin + 1] + (bodies or {}).get(r.id, stub_lines(r, meta))
        last = r.end
    out += lines[last:]
    if INCLUDE not in out:  # after the file's first #include: dp::NotImplemented must be declared
        first = next(k for k, line in enumerate(out) if line.startswith("#include"))
        out.insert(first + 1, INCLUDE)
    return "".join(out)


def stubbed(path, meta):
    """The text of `path` (a stage source) with every exercise region replaced by its stub."""
    return filled(path, meta)


def stage_dir(num):
    dirs = [d for d in STAGES.iterdir() if d.is_dir() and d.name.startswith(num + "_")]
    if len(dirs) != 1:
        names = ", ".join(sorted(d.name[:2] for d in STAGES.iterdir() if d.is_dir()))
        raise Bad(f"no stage '{num}': give a stage number ({names})")
    return dirs[0]


def write_stage(num, meta, with_stubs, bodies=None):
    """The learner's copy of stage `num`: its source files that hold exercises, stubbed, or the reference
    (`with_stubs` false), or the current reference with the learner's `bodies` in its regions. Files without
    an exercise are not copied: the build takes them from stages/, so they never go stale."""
    src = stage_dir(num)
    dst = BOOK / "stages" / src.name
    if dst.exists():
        shutil.rmtree(dst)
    for path in source_files(src):
        if not regions_of(path, read_lines(path)):
            continue
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(filled(path, meta, bodies) if with_stubs else path.read_text())


def backup(num):
    """Copies the learner's stage folder aside before it is overwritten; returns where it went."""
    src = BOOK / "stages" / stage_dir(num).name
    if not src.exists():
        return None
    dst = BOOK / ".backup" / time.strftime("%Y%m%d-%H%M%S") / src.name
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def need_book():
    if not (BOOK / "stages").is_dir():
        raise Bad("there is no workbook yet: run 'python3 scripts/course/workbook.py init' first")


def check_meta(regions, meta):
    problems = []
    for id, r in sorted(regions.items()):
        m = meta.get(id)
        if m is None:
            problems.append(f"{r.path.relative_to(ROOT)}: exercise {id} has no [exercise.\"{id}\"] in {META.relative_to(ROOT)}")
            continue
        for key in ("read", "hint", "check", "hints"):
            if not m.get(key):
                problems.append(f"{META.relative_to(ROOT)}: exercise {id} lacks '{key}'")
        if m.get("check") and m["check"] != f"stage{r.stage}":
            problems.append(f"{META.relative_to(ROOT)}: exercise {id} is checked by '{m['check']}', not stage{r.stage}")
        if len(m.get("hints", [])) < 2:
            problems.append(f"{META.relative_to(ROOT)}: exercise {id} has {len(m.get('hints', []))} hints; give 2-3")
        page, _, section = m.get("read", "").partition(", ")
        section = section.strip("'")
        if not (ROOT / page).is_file():
            problems.append(f"{META.relative_to(ROOT)}: exercise {id} sends the learner to {page}, which does not exist")
        elif not re.search(r"^#+ " + re.escape(section) + r"( \{#\w+\})?$", (ROOT / page).read_text(), re.M):
            problems.append(f"{META.relative_to(ROOT)}: exercise {id}: {page} has no heading '{section}'")
        if not r.body or all(not line.strip() for line in r.body):
            problems.append(f"{r.path.relative_to(ROOT)}: exercise {id} is empty")
    for id in sorted(set(meta) - set(regions)):
        problems.append(f"{META.relative_to(ROOT)}: exercise {id} is marked in no stage source")
    return problems


def cmd_init(args, meta):
    if BOOK.exists() and not args.force:
        raise Bad(f"{BOOK.relative_to(ROOT)}/ exists and may hold your work: 'reset NN' restubs one stage, "
                  "'init --force' rewrites it all")
    regions = all_regions()
    problems = check_meta(regions, meta)
    if problems:
        raise Bad("\n".join(problems))
    if BOOK.exists():
        for d in sorted((BOOK / "stages").iterdir()) if (BOOK / "stages").exists() else []:
            backup(d.name[:2])
        shutil.rmtree(BOOK / "stages", ignore_errors=True)
    for d in sorted(p for p in STAGES.iterdir() if p.is_dir()):
        write_stage(d.name[:2], meta, with_stubs=True)
    print(f"workbook: wrote {BOOK.relative_to(ROOT)}/stages/ with {len(regions)} exercises to write:")
    for id, r in sorted(regions.items()):
        print(f"  {id}  {r.title:<86} {r.path.relative_to(STAGES)}")
    print("next: cmake --preset workbook && cmake --build --preset workbook && ctest --preset workbook -L stage01")


def cmd_status(args, meta):
    need_book()
    ref = all_regions()
    mine = all_regions(BOOK / "stages")
    stale = set()
    for path in source_files(BOOK / "stages"):
        ref_path = STAGES / path.relative_to(BOOK / "stages")
        bodies = {r.id: r.body for r in regions_of(path, read_lines(path))}
        drop = lambda text: text.replace(INCLUDE, "")  # the stubs' include comes and goes with the stubs
        if not ref_path.exists() or drop(filled(ref_path, meta, bodies)) != drop(path.read_text()):
            stale.add(path.relative_to(BOOK / "stages").parts[0][:2])
    for s in sorted(stale):
        print(f"stage {s}: outside its exercise regions your copy differs from stages/ (the course changed since "
              f"init, or you edited there): 'python3 scripts/course/workbook.py update {s}' takes the course's files and "
              "keeps your regions")
    for id, r in sorted(ref.items()):
        m = mine.get(id)
        if m is None:
            state = "missing (its markers were removed: 'reset %s' restores them)" % r.stage
        elif "".join(m.body) == "".join(stub_lines(r, meta)):
            state = "not written (the stub)"
        elif "".join(m.body) == "".join(r.body):
            state = "the reference's code"
        else:
            state = "written"
        print(f"{id}  {state:<24} {r.title}")


def cmd_diff(args, meta):
    need_book()
    ref = all_regions()
    mine = all_regions(BOOK / "stages")
    wanted = set(args.stages) or {r.stage for r in ref.values()}
    for s in wanted:
        stage_dir(s)
    for id, r in sorted(ref.items()):
        if r.stage not in wanted or id not in mine:
            continue
        a, b = r.body, mine[id].body
        lines = list(difflib.unified_diff(a, b, f"reference {id} ({r.path.relative_to(ROOT)})",
                                          f"yours {id} ({mine[id].path.relative_to(ROOT)})"))
        sys.stdout.write("".join(lines) if lines else f"exercise {id}: the same as the reference\n")


def cmd_reset(args, meta, with_stubs):
    need_book()
    for s in args.stages:
        saved = backup(s)
        write_stage(s, meta, with_stubs=with_stubs)
        what = "stubs" if with_stubs else "reference code"
        print(f"workbook: stage {s} has its {what} again" + (f" (your files are in {saved.relative_to(ROOT)})" if saved else ""))


def cmd_update(args, meta):
    """The stages' current files with the learner's code carried into their regions."""
    need_book()
    for s in args.stages:
        mine = {r.id: r.body for r in all_regions(BOOK / "stages" / stage_dir(s).name).values()} \
            if (BOOK / "stages" / stage_dir(s).name).exists() else {}
        saved = backup(s)
        write_stage(s, meta, with_stubs=True, bodies=mine)
        print(f"workbook: stage {s} is the course's current code with your {len(mine)} exercise region(s) in it"
              + (f" (your old files are in {saved.relative_to(ROOT)})" if saved else ""))


STAGE_PAGE = {"01": "01_allreduce.md", "02": "02_naive_ddp.md", "03": "03_flat.md", "04": "04_overlap.md",
              "05": "05_bucketed.md", "06": "06_sharded_opt.md", "07": "07_fsdp.md", "10": "10_hierarchy.md"}


def page_block(stage, regions, meta):
    """The workbook's part of a stage page: its exercises, where to write them, their hints folded."""
    mine = [r for id, r in sorted(regions.items()) if r.stage == stage]
    out = [f"<!-- workbook:{stage} -->", "### Write it yourself", "",
           f"In [the workbook](workbook.md) (`python3 scripts/course/workbook.py init`) this stage's core is yours to write; "
           f"`ctest --preset workbook -L stage{stage}` checks it with the tests that check the code above.", ""]
    for r in mine:
        m = meta[r.id]
        out += [f"- `{r.id}`: {r.title}, in `workbook/{r.path.relative_to(ROOT)}`.", ""]
        out += ["<details><summary>Hints</summary>", ""]
        out += [f"{k}. {h}" for k, h in enumerate(m["hints"], 1)]
        out += ["", "</details>", ""]
    out.append(f"<!-- /workbook:{stage} -->")
    return "\n".join(out) + "\n"


def pages_text(regions, meta):
    """{page path: its text with the workbook block current}, for every stage page with exercises."""
    out = {}
    for stage in sorted({r.stage for r in regions.values()}):
        path = ROOT / "docs" / STAGE_PAGE[stage]
        text = path.read_text()
        block = page_block(stage, regions, meta)
        pattern = re.compile(rf"<!-- workbook:{stage} -->\n.*?<!-- /workbook:{stage} -->\n", re.S)
        if pattern.search(text):
            new = pattern.sub(lambda _: block, text)
        else:  # first time: before the page's closing "Next:" line
            at = text.rindex("\nNext:")
            new = text[:at + 1] + block + "\n" + text[at + 1:]
        out[path] = new
    return out


def cmd_pages(args, meta):
    for path, text in pages_text(all_regions(), meta).items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"updated {path.relative_to(ROOT)}")


def compile_entry(entries, path):
    """The entry of a build's compile_commands.json (`entries`) that compiles `path`, directly or through the
    unity file that includes it (the stages' libraries are unity builds: one object per library)."""
    for e in entries:
        src = Path(e["file"])
        if src == path or (src.name.startswith("unity_") and f'"{path}"' in src.read_text()):
            return e
    raise Bad(f"compile_commands.json compiles no {path.relative_to(ROOT)}: is the build configured and built?")


# The contract test that each stage's stubs must fail: (test executable, its suite, or a typed suite's
# TypeParam; a trailing '<' matches every instance of a template). Every stage with exercises has a row.
STUB_CHECKS = {
    "01": ("test_ring", "RingAllReduce"),
    "02": ("test_strategy_contract", "Ddp<Naive>"),
    "03": ("test_strategy_contract", "Ddp<Flat>"),
    "04": ("test_strategy_contract", "Ddp<Overlap>"),
    "05": ("test_strategy_contract", "Bucketed05"),
    "06": ("test_strategy_contract", "Zero1"),
    "07": ("test_strategy_contract", "Fsdp<"),
    "10": ("test_stage10", "HierAllReduce"),
}
STUB_TIMEOUT_S = 180  # one stage's filtered run: a stub throws at the first step, so seconds; a hang fails


def gtest_filter(listing, want):
    """The --gtest_filter of the suites in a `--gtest_list_tests` listing named `want`, or whose TypeParam is
    `want` (or starts with it, when it ends in '<')."""
    return ":".join(f"{s.name}.*" for s in gtest.suites(listing) if s.name == want or s.type_param == want
                    or (want.endswith("<") and s.type_param.startswith(want)))


def _compile_stubbed(e, paths, meta, tmp):
    """Compiles the unity unit of compile_commands entry `e` with its exercise files `paths` stubbed, with the
    build's own flags at -O1; returns (the archive its object belongs in, the stubbed object)."""
    import subprocess
    argv, skip, obj = [], False, None
    for a in shlex.split(e["command"]):  # keep every flag; drop the output, the input, the dependency file
        if skip:
            obj = a if skip == "-o" else obj
            skip = False
        elif a in ("-o", "-c", "-MF", "-MT"):
            skip = a
        elif a != "-MD":
            argv.append("-O1" if a in ("-O2", "-O3") else a)  # -O1 keeps __OPTIMIZE__: the same PCH
    m = re.match(r"^(.*)/CMakeFiles/(\w+)\.dir/", obj)
    if not m:
        raise Bad(f"{obj}: not an object of a CMake target")
    archive = Path(e["directory"]) / m.group(1) / f"lib{m.group(2)}.a"
    if not archive.exists():
        raise Bad(f"{archive} is not built: build it first")
    file = Path(e["file"])
    text = file.read_text()
    src = tmp / f"{m.group(2)}_{file.name}"
    for p in paths:
        stub = tmp / f"{p.parent.name}_{p.name}"
        stub.write_text(stubbed(p, meta))
        text = stub.read_text() if file == p else text.replace(f'"{p}"', f'"{stub}"')
    src.write_text(text)
    out = tmp / m.group(2) / Path(obj).name  # the archive member's own name, so that `ar r` replaces it
    out.parent.mkdir()
    r = subprocess.run(argv + ["-c", str(src), "-o", str(out)], cwd=e["directory"], capture_output=True, text=True)
    if r.returncode != 0:
        raise Bad(f"{', '.join(str(p.relative_to(ROOT)) for p in paths)}, stubbed, does not compile:\n{r.stderr}")
    return archive, out


def _stubbed_archives(objects, tmp):
    """Copies of the stage libraries' archives with each stubbed object replacing its member: {archive: copy}."""
    import subprocess
    copies = {}
    for archive, obj in objects:
        copy = tmp / "lib" / archive.name
        copy.parent.mkdir(exist_ok=True)
        if not copy.exists():
            shutil.copy(archive, copy)
        subprocess.run(["ar", "r", str(copy), str(obj)], check=True, capture_output=True)
        copies[archive] = copy
    return copies


def _relink(build, exe, archives, tmp):
    """tests/`exe` linked again, by ninja's own link command, against the stubbed `archives`; returns its path."""
    import subprocess
    r = subprocess.run(["ninja", "-C", str(build), "-t", "commands", f"tests/{exe}"], capture_output=True, text=True)
    link = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
    if f"-o tests/{exe} " not in link:
        raise Bad(f"ninja knows no link command for tests/{exe} in {build}: {r.stderr.strip()}")
    link = link.removeprefix(": && ").split(" && cd ")[0]  # the link alone, not the suite listing after it
    link = link.replace(f"-o tests/{exe} ", f"-o {tmp / exe} ")
    for archive, copy in archives.items():
        link = re.sub(rf"(?<=\s){re.escape(str(archive.relative_to(build)))}(?=\s)", str(copy), link)
    r = subprocess.run(["bash", "-c", link], cwd=build, capture_output=True, text=True)
    if r.returncode != 0:
        raise Bad(f"tests/{exe}, relinked with the stubs, does not link:\n{r.stderr}")
    return tmp / exe


def _stage_fails_with_stub(stage, exe, path, listing, tmp):
    """Runs stage `stage`'s contract suite in the stubbed `exe`; returns (problem or None, the line to print)."""
    import os
    import subprocess
    want = STUB_CHECKS[stage][1]
    flt = gtest_filter(listing, want)
    if not flt:
        return f"stage {stage}: {exe} has no suite '{want}'", None
    try:
        r = subprocess.run([str(path), f"--gtest_filter={flt}"], cwd=tmp, capture_output=True, text=True,
                           timeout=STUB_TIMEOUT_S, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    except subprocess.TimeoutExpired:
        return f"stage {stage}: {exe} --gtest_filter={flt} with the stubs ran past {STUB_TIMEOUT_S} s", None
    out = r.stdout + r.stderr
    named = sorted(set(re.findall(rf"NotImplemented: workbook exercise ({stage}\.\d+)", out)))
    failed = re.search(r"(\d+) FAILED TESTS?", out)
    if r.returncode == 0 or not named:
        return (f"stage {stage}: {exe} --gtest_filter={flt} with the stubs "
                + ("passed" if r.returncode == 0 else f"failed (exit {r.returncode}) without "
                   f"'NotImplemented: workbook exercise {stage}.K'") + f":\n{out[-2000:]}"), None
    return None, (f"workbook stubs-fail: stage {stage}: {exe} --gtest_filter={flt}: "
                  f"{failed.group(1) if failed else 'its'} test(s) fail with NotImplemented "
                  f"(exercise {', '.join(named)})")


def cmd_stubs_fail(args, meta):
    """CI: the workbook is live. Each stage library that holds exercises is compiled again with its exercise
    files stubbed (the build's own flags, at -O1), the contract tests are relinked against those objects, and
    each stage's contract test must then fail with that stage's NotImplemented (docs/workbook.md). The same
    tests pass on the reference code in the suite itself."""
    import concurrent.futures
    import json
    import os
    import subprocess
    import tempfile
    t0 = time.time()
    build = Path(args.build).resolve()
    if not (build / "compile_commands.json").exists():
        raise Bad(f"{build} has no compile_commands.json: configure and build it first")
    entries = json.loads((build / "compile_commands.json").read_text())
    regions = all_regions()
    stages = sorted({r.stage for r in regions.values()})
    unchecked = [s for s in stages if s not in STUB_CHECKS]
    if unchecked:
        raise Bad(f"stage(s) {', '.join(unchecked)} hold exercises but have no row in STUB_CHECKS (scripts/course/workbook.py)")
    units = {}  # compile_commands file -> (entry, [exercise files it compiles])
    for path in sorted({r.path for r in regions.values()}):
        e = compile_entry(entries, path)
        units.setdefault(e["file"], (e, []))[1].append(path)
    with tempfile.TemporaryDirectory(prefix="workbook-stubs-") as tmp:
        tmp = Path(tmp)
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            objects = list(pool.map(lambda u: _compile_stubbed(u[0], u[1], meta, tmp), units.values()))
        t1 = time.time()
        archives = _stubbed_archives(objects, tmp)
        exes = {exe: _relink(build, exe, archives, tmp) for exe in sorted({exe for exe, _ in STUB_CHECKS.values()})}
        listings = {exe: subprocess.run([str(path), "--gtest_list_tests"], capture_output=True, text=True).stdout
                    for exe, path in exes.items()}  # once per executable
        t2 = time.time()
        problems = []
        for stage in stages:
            exe = STUB_CHECKS[stage][0]
            problem, line = _stage_fails_with_stub(stage, exe, exes[exe], listings[exe], tmp)
            if problem:
                problems.append(problem)
            else:
                print(line)
        if problems:
            raise Bad("\n".join(problems))
    print(f"workbook stubs-fail: PASS: with every exercise stubbed, a contract test of each of stages "
          f"{', '.join(stages)} fails with NotImplemented ({build.name}; {len(objects)} libraries compiled in "
          f"{t1 - t0:.0f} s, {len(exes)} tests linked in {t2 - t1:.0f} s, run in {time.time() - t2:.0f} s)")


def cmd_check(args, meta):
    """Every region has its metadata and page section; stubbing changes only the regions (and one include)."""
    regions = all_regions()
    problems = check_meta(regions, meta)
    for path, text in pages_text(regions, meta).items():
        if path.read_text() != text:
            problems.append(f"{path.relative_to(ROOT)}: its workbook hints differ from {META.relative_to(ROOT)}: "
                            "run python3 scripts/course/workbook.py pages")
    page = (ROOT / "docs" / "workbook.md").read_text()
    problems += [f"docs/workbook.md: exercise {id} is not in its table" for id in sorted(regions) if f"| `{id}` |" not in page]
    for path in source_files(STAGES):
        ref = read_lines(path)
        stub = stubbed(path, meta).splitlines(keepends=True)
        if stub == ref:
            continue
        # Put the reference's regions back into the stubbed text: the original must come out.
        back = filled(path, meta, {r.id: r.body for r in regions_of(path, ref)}, lines=stub)
        out = [line for line in back.splitlines(keepends=True) if line != INCLUDE or INCLUDE in ref]
        if out != ref:
            problems.append(f"{path.relative_to(ROOT)}: stubbing changes more than its exercise regions")
        if "throw dp::NotImplemented(" not in "".join(stub):
            problems.append(f"{path.relative_to(ROOT)}: a stub does not throw dp::NotImplemented")
    if problems:
        raise Bad("\n".join(problems))
    stages = sorted({r.stage for r in regions.values()})
    print(f"workbook check: PASS: {len(regions)} exercises in stages {', '.join(stages)}; each has its page section, "
          "hint and hints, and its stub round-trips to the reference")


def cmd_self_test(args, meta):
    """The check can fail: each broken input below must be reported."""
    regions = all_regions()
    r = regions["02.1"]
    caught = []
    try:  # a region never closed
        regions_of(Path("x.cpp"), ["  // [exercise 02.1: t]\n", "  x();\n"])
    except Bad as e:
        caught.append(("unclosed region", "never closed" in str(e)))
    try:  # a close without an open
        regions_of(Path("x.cpp"), ["  // [/exercise 02.1]\n"])
    except Bad as e:
        caught.append(("stray close", "closes no open" in str(e)))
    broken = {k: dict(v) for k, v in meta.items() if k != "02.1"}
    caught.append(("no metadata", any("has no [exercise" in p for p in check_meta(regions, broken))))
    broken = {k: dict(v) for k, v in meta.items()}
    broken["02.1"]["read"] = "docs/02_naive_ddp.md, 'No such section'"
    caught.append(("missing section", any("has no heading" in p for p in check_meta(regions, broken))))
    broken["02.1"] = dict(meta["02.1"], hints=["one"])
    caught.append(("one hint", any("give 2-3" in p for p in check_meta(regions, broken))))
    broken["02.1"] = dict(meta["02.1"], check="stage03")
    caught.append(("wrong label", any("not stage02" in p for p in check_meta(regions, broken))))
    text = stubbed(r.path, meta)
    caught.append(("stub throws", "throw dp::NotImplemented(\"02.1\"" in text and "".join(r.body) not in text))
    missed = [name for name, ok in caught if not ok]
    if len(caught) != 7 or missed:
        raise Bad(f"the workbook check misses: {', '.join(missed) or 'a case that raised nothing'}")
    print(f"workbook self-test: PASS: {len(caught)} broken inputs caught")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `workbook.py status | head`: stop quietly
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("init", help="write workbook/ with every exercise stubbed")
    p.add_argument("--force", action="store_true", help="rewrite an existing workbook (its stages are backed up)")
    sub.add_parser("status", help="each exercise: stub, written, or the reference's code")
    p = sub.add_parser("diff", help="your regions against the reference")
    p.add_argument("stages", nargs="*", help="stage numbers, e.g. 02 (default: all)")
    for name, what in (("reset", "stub stage NN's exercises again"), ("solve", "put stage NN's reference code back"),
                       ("update", "take the course's current files for stage NN, your exercise code carried in")):
        p = sub.add_parser(name, help=what)
        p.add_argument("stages", nargs="+", help="stage numbers, e.g. 02")
    sub.add_parser("pages", help="write each stage page's exercises and hints from the regions and the metadata")
    sub.add_parser("check", help="CI: regions, metadata and pages agree; stubs round-trip")
    sub.add_parser("self-test", help="CI: the check catches broken regions and metadata")
    p = sub.add_parser("stubs-fail", help="CI: with the stubs compiled in, each stage's contract test fails with NotImplemented")
    p.add_argument("build", help="a configured and built tree, e.g. build")
    args = ap.parse_args()
    commands = {"init": cmd_init, "status": cmd_status, "diff": cmd_diff, "update": cmd_update,
                "reset": lambda a, m: cmd_reset(a, m, with_stubs=True),
                "solve": lambda a, m: cmd_reset(a, m, with_stubs=False), "pages": cmd_pages,
                "stubs-fail": cmd_stubs_fail, "self-test": cmd_self_test, "check": cmd_check}
    try:
        commands[args.command](args, load_meta())
    except Bad as e:
        print(f"workbook: {e}", file=sys.stderr)
        sys.exit(1 if args.command in ("check", "self-test", "stubs-fail") else 2)


if __name__ == "__main__":
    main()
