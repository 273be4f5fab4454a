#!/usr/bin/env python3
"""Every suite of a test program that serves a stage carries a stage label.

A program such as test_dist holds the suites of two stages (01 and 06); cmake/DpGtestSuites.cmake labels each
suite by its name (LABELS_BY_NAME in tests/common/CMakeLists.txt). A suite added under a new name would
match no rule and silently leave `ctest -L stage01` without it. So: in each test program, if any of its
suites carries a stage label (stageNN), all of them must. And since ctest runs a program's suites through
gtest filters (several suites to a test, "Cli.*:Sizes.*"), every test the program lists
(--gtest_list_tests) must match exactly one ctest test's filter: none left out, none run twice.

  python3 scripts/checks/check_labels.py --build build    # reads ctest --show-only=json-v1 of that build
  python3 scripts/checks/check_labels.py --self-test      # a suite without its label must be caught
"""
import argparse
import fnmatch
import json
import os
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from dplib.gtest import suites  # noqa: E402

STAGE = re.compile(r"^(stage|ext)\d\d$")  # a stage's label or an extension's


def problems(tests):
    """tests: ctest's json-v1 "tests" list. Returns one line per suite that lacks the stage label its
    program's other suites carry."""
    by_program = {}
    for t in tests:
        cmd = t.get("command") or []
        if len(cmd) < 2 or not cmd[1].startswith("--gtest_filter="):  # GoogleTest programs only
            continue
        labels = next((p["value"] for p in t.get("properties", []) if p["name"] == "LABELS"), [])
        by_program.setdefault(os.path.basename(cmd[0]), []).append((t["name"], labels))
    out = []
    for program, suites in sorted(by_program.items()):
        if not any(STAGE.match(l) for _, labels in suites for l in labels):
            continue  # a program of no stage (common's models, the launcher)
        for name, labels in suites:
            if not any(STAGE.match(l) for l in labels):
                out.append(f"{program}: suite '{name}' has no stage label (labels: {', '.join(labels) or 'none'}); "
                           f"add its name to a LABELS_BY_NAME rule of {program}")
    return out


def listed_tests(listing):
    """The full names ("Suite.Test", "Suite/0.Test", "Prefix/Suite.Test/1") of a `--gtest_list_tests` listing."""
    return [f"{s.name}.{t}" for s in suites(listing) for t in s.tests]


def coverage_problems(tests, list_tests):
    """tests: ctest's json-v1 "tests"; list_tests(program path) -> its --gtest_list_tests output. Returns one
    line per GoogleTest test that no ctest test's filter runs, or that two run (filters are globs, "Cli.*")."""
    filters = {}
    for t in tests:
        cmd = t.get("command") or []
        if len(cmd) >= 2 and cmd[1].startswith("--gtest_filter="):
            filters.setdefault(cmd[0], []).extend(cmd[1].split("=", 1)[1].split(":"))
    out = []
    for program, run in sorted(filters.items()):
        for test in listed_tests(list_tests(program)):
            n = sum(fnmatch.fnmatchcase(test, f) for f in run)
            if n != 1:
                out.append(f"{os.path.basename(program)}: {test} is run by {n} ctest tests, not 1 "
                           f"(cmake/DpGtestSuites.cmake registers every suite once)")
    return out


def self_test():
    def suite(name, *labels):
        return {"name": name, "command": ["/b/tests/test_dist", f"--gtest_filter={name}"],
                "properties": [{"name": "LABELS", "value": list(labels)}]}
    good = [suite("Barrier.*", "dist", "stage01"), suite("FlatLayout.*", "dist", "stage06"),
            {"name": "test_cli.*", "command": ["/b/tests/test_cli"], "properties": [{"name": "LABELS", "value": ["cli"]}]}]
    bad = good + [suite("NewSuite.*", "dist")]
    assert problems(good) == [], problems(good)
    assert len(problems(bad)) == 1 and "NewSuite" in problems(bad)[0], problems(bad)
    # Coverage: a typed suite's instances and two plain suites, listed as GoogleTest lists them.
    listing = ("Barrier.\n  Two\nCli.\n  Parses\nC/0.  # TypeParam = A\n  T\nC/1.  # TypeParam = B\n  T\n")
    run = lambda *filters: [{"name": f, "command": ["/b/t", f"--gtest_filter={f}"]} for f in filters]
    full = run("Barrier.*:Cli.*", "C/0.*", "C/1.*")
    assert coverage_problems(full, lambda _: listing) == [], coverage_problems(full, lambda _: listing)
    for mutant, test in ((run("Barrier.*", "C/0.*", "C/1.*"), "Cli.Parses"),               # a suite left out
                         (run("Barrier.*:Cli.*", "Cli.*", "C/0.*", "C/1.*"), "Cli.Parses"),  # one run twice
                         (run("Barrier.*:Cli.*", "C/0.*"), "C/1.T")):                     # a type left out
        found = coverage_problems(mutant, lambda _: listing)
        assert len(found) == 1 and f": {test} is run by" in found[0], found
    print("check_labels --self-test: PASS (a suite without its stage label, a suite that no test runs, or two, "
          "are caught)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", help="a configured and built build folder")
    ap.add_argument("--ctest", default="ctest", help="the ctest to ask (CMake's own, from the build)")
    ap.add_argument("--self-test", action="store_true", help="check that the check catches its mutant")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.build:
        ap.error("--build FOLDER or --self-test")
    shown = subprocess.run([a.ctest, "--test-dir", a.build, "--show-only=json-v1"], capture_output=True, text=True)
    if shown.returncode != 0:
        sys.exit(f"check_labels: ctest --show-only failed in {a.build}: {shown.stderr.strip()}")
    tests = json.loads(shown.stdout)["tests"]

    def list_tests(program):
        r = subprocess.run([program, "--gtest_list_tests"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        if r.returncode != 0:
            sys.exit(f"check_labels: {program} --gtest_list_tests failed ({r.returncode}): {r.stderr.strip()}")
        return r.stdout
    found = problems(tests) + coverage_problems(tests, list_tests)
    for line in found:
        print("check_labels: " + line)
    if found:
        sys.exit(1)
    print(f"check_labels: PASS: {len(tests)} tests; every suite of a stage's program carries a stage label, "
          f"and ctest runs every test of every GoogleTest program once")


if __name__ == "__main__":
    main()
