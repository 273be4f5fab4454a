#!/usr/bin/env python3
"""Every suite of a test program that serves a stage carries a stage label.

A program such as test_dist holds the suites of two stages (01 and 06); cmake/DpGtestSuites.cmake labels each
suite by its name (LABELS_BY_NAME in tests/common/CMakeLists.txt). A suite added under a new name would
match no rule and silently leave `ctest -L stage01` without it. So: in each test program, if any of its
suites carries a stage label (stageNN), all of them must.

  python3 scripts/check_labels.py --build build    # reads ctest --show-only=json-v1 of that build
  python3 scripts/check_labels.py --self-test      # a suite without its label must be caught
"""
import argparse
import json
import os
import re
import subprocess
import sys

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


def self_test():
    def suite(name, *labels):
        return {"name": name, "command": ["/b/tests/test_dist", f"--gtest_filter={name}"],
                "properties": [{"name": "LABELS", "value": list(labels)}]}
    good = [suite("Barrier.*", "dist", "stage01"), suite("FlatLayout.*", "dist", "stage06"),
            {"name": "test_cli.*", "command": ["/b/tests/test_cli"], "properties": [{"name": "LABELS", "value": ["cli"]}]}]
    bad = good + [suite("NewSuite.*", "dist")]
    assert problems(good) == [], problems(good)
    assert len(problems(bad)) == 1 and "NewSuite" in problems(bad)[0], problems(bad)
    print("check_labels --self-test: PASS (a suite without its stage label is caught)")


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
    found = problems(tests)
    for line in found:
        print("check_labels: " + line)
    if found:
        sys.exit(1)
    print(f"check_labels: PASS: {len(tests)} tests; every suite of a stage's program carries a stage label")


if __name__ == "__main__":
    main()
