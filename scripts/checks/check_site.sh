#!/usr/bin/env bash
# Opens every page of the documentation site in a real browser (headless Chromium from Debian) and checks it
# reads as a page: a screenshot of each under BUILD/docs/screenshots/, and a failure when the rendered text
# shows what a renderer should have consumed (a raw \snippet or \include, a code fence, an HTML comment, a
# table marker) or an image that did not load.
#
#   bash scripts/checks/check_site.sh [BUILD]     BUILD: a configured build folder (default build)
#
# Needs chromium (apt-get install chromium; not installed by install_deps.sh, since CI does not run this)
# and the build's `docs` target (Doxygen). Exit 0: every page passed; 1: a page failed (named); 2: missing tools.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
command -v chromium >/dev/null || { echo "check_site: needs chromium: apt-get install chromium" >&2; exit 2; }
[ -f "$B/CMakeCache.txt" ] || { echo "check_site: $B is not a configured build folder (cmake --preset default)" >&2; exit 2; }
cmake --build "$B" --target docs >/dev/null
html=$B/docs/html
out=$B/docs/screenshots
mkdir -p "$out"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
# Every page of README.md and docs/*.md, by its Doxygen name (docs/tolerances.md has no {#name}: md_docs_tolerances).
pages=(index start_here stage01 stage02 stage03 stage04 stage05 stage05_measured ext05 ext05a ext05b ext05c ext05d
       stage06 stage06_alltoall ext06 ext06a ext06b ext06c ext06d stage07 ext07 ext07b stage08 stage08_measured stage09
       launching results gpu cs336_map accounting debugging md_docs_tolerances workbook building)
failed=0
for p in "${pages[@]}"; do
  f=$(realpath "$html/$p.html")
  [ -f "$f" ] || { echo "check_site: $p: no $html/$p.html"; failed=1; continue; }
  # The DOM after the page ran (images decoded, scripts done), and a screenshot of its top 1280 x 2400 pixels.
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --run-all-compositor-stages-before-draw \
      --virtual-time-budget=3000 --dump-dom "file://$f" > "$out/$p.dom.html" 2>/dev/null
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,2400 \
      --virtual-time-budget=3000 --screenshot="$out/$p.png" "file://$f" >/dev/null 2>&1
  if ! $PY - "$out/$p.dom.html" "$html" "$p" <<'EOF'
import html.parser, os, re, sys
dom, root, name = sys.argv[1], sys.argv[2], sys.argv[3]
class Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.text, self.images, self.skip = [], [], 0
    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        if tag == "img":
            self.images.append(dict(attrs).get("src", ""))
    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip -= 1
    def handle_data(self, data):
        if not self.skip:
            self.text.append(data)
t = Text()
t.feed(open(dom, encoding="utf-8", errors="replace").read())
text = "".join(t.text)
problems = [f"shows '{m}'" for m in ("\\snippet", "\\include", "```", "<!--") if m in text]
problems += [f"shows the marker '{m}'" for m in re.findall(r"/?table:[\w.-]+ -->", text)]
problems += [f"image {src} is missing" for src in t.images
             if not src.startswith(("http", "data:")) and not os.path.isfile(os.path.join(root, src))]
if len(text.strip()) < 500:
    problems.append(f"only {len(text.strip())} characters of text")
for p in problems:
    print(f"check_site: {name}: {p}")
sys.exit(1 if problems else 0)
EOF
  then failed=1; fi
  echo "check_site: $p: $(wc -c < "$out/$p.png") byte screenshot"
done
[ $failed = 0 ] && echo "check_site: all ${#pages[@]} pages render; screenshots in $out"
exit $failed
