#!/usr/bin/env bash
# docs/report.png: the top of a study's report.html as a new reader first sees it, rendered by
# headless Chromium (Debian's `chromium`) at the page width the report is laid out for.
#   scripts/report-screenshot.sh [results/showcase/report.html] [docs/report.png]
set -euo pipefail
page=${1:-results/showcase/report.html}
out=${2:-docs/report.png}
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars --window-size=1280,1800 \
  --screenshot="$(realpath -m "$out")" "file://$(realpath "$page")"
# 256 colours: a page of text and flat plots looks the same and the README's picture stays small
.venv/bin/python -c "import sys; from PIL import Image; Image.open(sys.argv[1]).convert('RGB')\
.quantize(256, method=Image.Quantize.MEDIANCUT).save(sys.argv[1], optimize=True)" "$out"
echo "wrote $out from $page ($(stat -c %s "$out") bytes)"
