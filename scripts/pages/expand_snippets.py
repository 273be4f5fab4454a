#!/usr/bin/env python3
"""Expands quoted code into the pages, so that they read the same on a Git host and in the Doxygen site.

A page quotes code by a marker line, which this script turns into a block that holds the code itself:

    \\snippet stages/05_bucketed/bucketed_ddp.cpp launch       (Doxygen's own command; raw text on a Git host)

becomes

    <!-- snippet: stages/05_bucketed/bucketed_ddp.cpp launch -->
    ```cpp
    ...the lines between the two `// [launch]` markers of that file, dedented...
    ```
    <!-- /snippet -->

and `\\include docs/diffs/05.diff` becomes an `<!-- include: ... -->` block holding the whole file. An
expanded block is refreshed from its source on every run, so the quoted code can never go stale: ctest
runs `--check`, which fails naming the page and the block when a source changed and the page was not
regenerated. Markdown code fences render the same in Doxygen and on GitHub or GitLab; HTML comments are
invisible in both.

    python3 scripts/pages/expand_snippets.py            # rewrite README.md and docs/*.md
    python3 scripts/pages/expand_snippets.py --check    # exit 1 if any page is stale (ctest docs_snippets_current)

After editing a stage's sources: `python3 scripts/checks/stage_diffs.py`, then this script.
Exit codes: 0 done (or current), 1 stale pages (--check), 2 a marker names a file or snippet that does not exist.
"""
import argparse
import pathlib
import re
import sys
import textwrap

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402

ROOT = dplib.ROOT
LANG = {".cpp": "cpp", ".hpp": "cpp", ".h": "cpp", ".py": "python", ".sh": "sh", ".cmake": "cmake",
        ".diff": "diff", ".txt": "diff", ".sbatch": "sh"}

# A raw Doxygen command on a line of its own, or a block this script wrote before.
RAW = re.compile(r"^\\(snippet|include) +(\S+)(?: +(.+?))? *$", re.M)
# A block left empty (its code fence lost) is one too: it is filled, and --check finds it stale.
BLOCK = re.compile(r"^<!-- (snippet|include): (\S+)(?: (.+?))? -->\n(?:```\w*\n.*?^```\n)?<!-- /\1 -->$", re.M | re.S)


class MarkerError(Exception):
    pass


def code_of(kind, path, name):
    src = ROOT / path
    if not src.is_file():
        raise MarkerError(f"{path}: no such file")
    text = src.read_text()
    if kind == "include":
        return text.rstrip("\n")
    marker = f"[{name}]"
    lines = text.splitlines()
    at = [i for i, l in enumerate(lines) if l.strip().endswith(marker) and l.strip().startswith(("//", "#"))]
    if len(at) < 2:
        raise MarkerError(f"{path}: snippet '{name}' needs two marker lines '// {marker}', found {len(at)}")
    return textwrap.dedent("\n".join(lines[at[0] + 1:at[1]])).rstrip("\n")


def block(kind, path, name):
    head = f"<!-- {kind}: {path}{' ' + name if name else ''} -->"
    lang = LANG.get(pathlib.Path(path).suffix, "")
    return f"{head}\n```{lang}\n{code_of(kind, path, name)}\n```\n<!-- /{kind} -->"


def expand(page_text):
    out = BLOCK.sub(lambda m: block(m.group(1), m.group(2), m.group(3)), page_text)
    return RAW.sub(lambda m: block(m.group(1), m.group(2), m.group(3)), out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1, naming the pages, if any page is stale")
    a = ap.parse_args(argv)
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    stale = []
    for page in pages:
        text = page.read_text()
        try:
            new = expand(text)
        except MarkerError as e:
            print(f"expand_snippets: {page.relative_to(ROOT)}: {e}", file=sys.stderr)
            return 2
        if new == text:
            continue
        stale.append(page.relative_to(ROOT))
        if not a.check:
            page.write_text(new)
            print(f"updated {page.relative_to(ROOT)}")
    if a.check and stale:
        print("expand_snippets --check: quoted code is stale in " + ", ".join(map(str, stale)) +
              ": run python3 scripts/pages/expand_snippets.py (after python3 scripts/checks/stage_diffs.py)")
        return 1
    if a.check:
        print("expand_snippets --check: every quoted block matches its source")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
