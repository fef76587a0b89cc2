#!/usr/bin/env bash
# Fetch the JavaScript the built HTML book needs, so its pages work OFFLINE (no CDN):
#
#   require.js                      npm: requirejs                       (AMD loader for widgets)
#   embed-amd.js + its font files   npm: @jupyter-widgets/html-manager 1.x (renders ipywidgets 8)
#   MathJax 3 (es5 build)           npm: mathjax                          (renders $...$ math)
#   mermaid.min.js (IIFE build)     npm: mermaid                          (token-flow diagram;
#                                   see scripts/mermaid_offline.py)
#
# Everything comes from the npm registry with `npm pack` (no node_modules) into the git-ignored
# folder .widgets_js/. _config.yml copies .widgets_js/extra/ into the HTML output
# (html_extra_path), so the files land in _build/html/_static/{tokenflow-widgets,mathjax}/, and
# nb_ipywidgets_js / mathjax_path / scripts/mermaid_offline.py point there. They are deliberately NOT in the source _static/
# folder: Jupyter Book adds every .js file found there to every page (widget code would load twice).
#
# embed-amd.js bundles @jupyter-widgets/base, /controls and /output, so the standard widgets
# need no code from a CDN (tests/test_book.py checks that pages only use those modules).
#
# Idempotent: does nothing when the pinned versions are already in place.
set -euo pipefail

REQUIREJS_VERSION=2.3.7
HTML_MANAGER_VERSION=1.0.15   # html-manager 1.0.x <-> ipywidgets 8.1.x (controls 5.x, model module 2.0.0)
MATHJAX_VERSION=3.2.2         # Sphinx 7.4's default is MathJax 3 (tex-mml-chtml.js)
MERMAID_VERSION=11.16.1       # the mermaid that JupyterLab 4.6 bundles, so both draw alike

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_root="$root/.widgets_js"
extra="$dest_root/extra"
want="requirejs@$REQUIREJS_VERSION @jupyter-widgets/html-manager@$HTML_MANAGER_VERSION mathjax@$MATHJAX_VERSION mermaid@$MERMAID_VERSION"

if [[ -f "$extra/_static/tokenflow-widgets/VERSIONS.txt" && "$(cat "$extra/_static/tokenflow-widgets/VERSIONS.txt")" == "$want" \
      && -s "$extra/_static/tokenflow-widgets/require.js" \
      && -s "$extra/_static/tokenflow-widgets/embed-amd.js" \
      && -s "$extra/_static/mathjax/tex-mml-chtml.js" \
      && -s "$extra/_static/tokenflow-mermaid/mermaid.min.js" ]]; then
    echo "offline JS up to date in $extra ($want)"
    exit 0
fi

command -v npm >/dev/null || { echo "error: npm is needed to fetch the offline widget JS (install node/npm)" >&2; exit 1; }

mkdir -p "$dest_root"
tmp="$(mktemp -d "$dest_root/.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "requirejs@$REQUIREJS_VERSION" \
    "@jupyter-widgets/html-manager@$HTML_MANAGER_VERSION" "mathjax@$MATHJAX_VERSION" \
    "mermaid@$MERMAID_VERSION" >/dev/null)
for pkg in requirejs html-manager mathjax mermaid; do mkdir -p "$tmp/$pkg"; done
tar -xzf "$tmp/requirejs-$REQUIREJS_VERSION.tgz" -C "$tmp/requirejs"
tar -xzf "$tmp/jupyter-widgets-html-manager-$HTML_MANAGER_VERSION.tgz" -C "$tmp/html-manager"
tar -xzf "$tmp/mathjax-$MATHJAX_VERSION.tgz" -C "$tmp/mathjax"
tar -xzf "$tmp/mermaid-$MERMAID_VERSION.tgz" -C "$tmp/mermaid" package/dist/mermaid.min.js package/LICENSE

# stage the whole output tree, then swap it in, so a concurrent build never sees half of it
stage="$tmp/extra"
w="$stage/_static/tokenflow-widgets"
mkdir -p "$w"
cp "$tmp/requirejs/package/require.js" "$w/require.js"
cp "$tmp/html-manager/package/dist/embed-amd.js" "$w/embed-amd.js"
cp "$tmp/html-manager/package/dist/embed.js.LICENSE.txt" "$w/LICENSE.html-manager.txt"
# Font Awesome files that embed-amd.js loads from its own folder
for f in "$tmp"/html-manager/package/dist/*.{woff2,woff,ttf,eot,svg}; do
    if [[ -e "$f" ]]; then cp "$f" "$w/"; fi
done
cp -r "$tmp/mathjax/package/es5" "$stage/_static/mathjax"
cp "$tmp/mathjax/package/LICENSE" "$stage/_static/mathjax/LICENSE"
mkdir -p "$stage/_static/tokenflow-mermaid"
cp "$tmp/mermaid/package/dist/mermaid.min.js" "$stage/_static/tokenflow-mermaid/mermaid.min.js"
cp "$tmp/mermaid/package/LICENSE" "$stage/_static/tokenflow-mermaid/LICENSE.mermaid.txt"
printf '%s' "$want" > "$w/VERSIONS.txt"

rm -rf "$extra.old"
if [[ -e "$extra" ]]; then mv "$extra" "$extra.old"; fi
mv "$stage" "$extra"
rm -rf "$extra.old"
echo "fetched offline JS into $extra ($want)"
