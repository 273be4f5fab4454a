"""Reads GoogleTest's `--gtest_list_tests` output: one parser for the scripts that need it (checks/check_labels.py,
course/workbook.py). cmake/DpGtestSuites.cmake reads the same listing in CMake, which cannot import this.

A listing is a suite line ("Suite." or, for a typed suite, "Suite/0.  # TypeParam = dp::NaiveDdp"), then one
indented line per test ("  Test" or "  Test/1  # GetParam() = ...").
"""
import re
from typing import NamedTuple


class Suite(NamedTuple):
    name: str         # "Stage05Bucketed", "GradSyncContract/0", "Prefix/Suite"
    type_param: str   # a typed suite's TypeParam, "" otherwise
    tests: list       # the test names under it, as listed ("Works", "Test/1")


def suites(listing):
    """The suites of a `--gtest_list_tests` listing, in its order."""
    out = []
    for line in listing.splitlines():
        if m := re.match(r"^(\S+)\.(?:\s+#(?: TypeParam = (.*))?.*)?$", line):
            out.append(Suite(m.group(1), (m.group(2) or "").strip(), []))
        elif (m := re.match(r"^  (\S+)", line)) and out:
            out[-1].tests.append(m.group(1))
    return out
