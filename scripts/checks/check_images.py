#!/usr/bin/env python3
"""Checks the pictures of the pages: that every image link works on a Git host and in the Doxygen site, and
that no PNG under docs/ sits there unshown.

    /usr/bin/python3 scripts/checks/check_images.py                 # (a) and (b), from the repository root
    /usr/bin/python3 scripts/checks/check_images.py --site HTMLDIR  # (c) as well: the built site (build/docs/html)

(a) Every `![alt](path)`, `<img src="path">` and `\\image html path` in README.md and docs/*.md resolves
    relative to its Markdown file, the rule a Git host renders by (README.md: docs/results/X.png; a page in
    docs/: results/X.png). Doxygen finds the same files by name in IMAGE_PATH (docs/results, docs/figures),
    so two shown pictures must not share a file name.
(b) Every PNG under docs/ is shown by some page (remove a plot nobody shows, or show it).
(c) With --site: every <img src> of every HTML file in HTMLDIR exists, and every picture the pages show
    was copied into the site.

Correct output: "check_images: N image links in M pages resolve; all K PNGs under docs/ are shown" (and,
with --site, "check_images: site HTMLDIR: I <img> in H HTML files, all present"), exit 0. Otherwise one
line per problem, naming the page and line, and exit 1.
"""
import argparse, html as html_lib, html.parser, os, pathlib, re, sys, urllib.parse

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dplib  # noqa: E402

ROOT = str(dplib.ROOT)
MD_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
HTML_IMAGE = re.compile(r"<img\b[^>]*\bsrc\s*=\s*[\"']([^\"']+)[\"']", re.I)
DOXY_IMAGE = re.compile(r"[\\@]image\s+html\s+(\"[^\"]+\"|\S+)")


def pages():
    out = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    out += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return [p for p in out if os.path.isfile(p)]


def external(src):
    return re.match(r"^[a-z][a-z0-9+.-]*:", src, re.I) is not None or src.startswith("#")


def links(page):
    """(line number, path as written) of every image the page shows, outside fenced code blocks."""
    fence = None
    for n, line in enumerate(open(page, encoding="utf-8"), start=1):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * 3
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is not None:
            continue
        for rx in (MD_IMAGE, HTML_IMAGE, DOXY_IMAGE):
            for src in rx.findall(line):
                src = src.strip('"')
                if not external(src):
                    yield n, src


def check_pages():
    problems, shown, by_name, count = [], set(), {}, 0
    all_pages = pages()
    for page in all_pages:
        rel = os.path.relpath(page, ROOT)
        for n, src in links(page):
            count += 1
            path = os.path.normpath(os.path.join(os.path.dirname(page), urllib.parse.unquote(src.split("#")[0])))
            if not os.path.isfile(path):
                problems.append(f"{rel}:{n}: image '{src}' does not resolve relative to {rel} "
                                f"(no file {os.path.relpath(path, ROOT)})")
                continue
            shown.add(path)
            name = os.path.basename(path)
            if by_name.setdefault(name, path) != path:
                problems.append(f"{rel}:{n}: image '{src}' has the file name of {os.path.relpath(by_name[name], ROOT)}: "
                                "Doxygen finds images by name, one of them would be lost in the site")
    pngs = []
    for folder, dirs, files in os.walk(os.path.join(ROOT, "docs")):
        dirs.sort()
        pngs += [os.path.join(folder, f) for f in sorted(files) if f.lower().endswith(".png")]
    for png in pngs:
        if os.path.normpath(png) not in shown:
            problems.append(f"{os.path.relpath(png, ROOT)}: shown by no page (README.md, docs/*.md): show it "
                            "where its table or text is, or remove it (and stop making it)")
    return problems, shown, count, len(all_pages), len(pngs)


class Images(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs).get("src") or "")


def check_site(site, shown):
    problems, count, files = [], 0, 0
    if not os.path.isdir(site):
        return [f"site {site}: no such folder (build the docs target first)"], 0, 0
    for folder, dirs, names in os.walk(site):
        dirs.sort()
        for f in sorted(names):
            if not f.endswith(".html"):
                continue
            files += 1
            path = os.path.join(folder, f)
            parser = Images()
            text = open(path, encoding="utf-8", errors="replace").read()
            parser.feed(text)
            # A page's HTML comment (a number marker of scripts/pages/make_tables.py) that Doxygen printed as text: it
            # happens after a link whose text breaks across lines; keep such a link on one line.
            for m in re.finditer(r"&lt;!--(.{0,60})", text):
                problems.append(f"site {os.path.relpath(path, site)}: shows an HTML comment as text: "
                                f"'<!--{html_lib.unescape(m.group(1))}...'")
            for src in parser.srcs:
                count += 1
                if not src:
                    problems.append(f"site {os.path.relpath(path, site)}: an <img> without src")
                elif not external(src) and not os.path.isfile(
                        os.path.join(folder, urllib.parse.unquote(src.split("#")[0].split("?")[0]))):
                    problems.append(f"site {os.path.relpath(path, site)}: <img src=\"{src}\"> is missing")
    for png in sorted(shown):
        if not os.path.isfile(os.path.join(site, os.path.basename(png))):
            problems.append(f"site: {os.path.relpath(png, ROOT)} is shown by a page but not in {site} "
                            "(is its folder in the Doxyfile's IMAGE_PATH?)")
    if files == 0:
        problems.append(f"site {site}: no HTML files")
    return problems, count, files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--site", help="the built HTML folder (build/docs/html): check its <img> too")
    args = ap.parse_args()
    problems, shown, count, npages, npngs = check_pages()
    site_problems, nimg, nhtml = check_site(args.site, shown) if args.site else ([], 0, 0)
    for p in problems + site_problems:
        print(f"check_images: {p}")
    if not problems:
        print(f"check_images: {count} image links in {npages} pages resolve; all {npngs} PNGs under docs/ are shown")
    if args.site and not site_problems:
        print(f"check_images: site {args.site}: {nimg} <img> in {nhtml} HTML files, all present")
    return 1 if problems or site_problems else 0


if __name__ == "__main__":
    sys.exit(main())
