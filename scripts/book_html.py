"""Sphinx extension: page-level fixes for the HTML book.

sphinx-thebe (always loaded by Jupyter Book 1) adds its config script from the
``env-before-read-docs`` event, which Sphinx 7.4 registers both on the app and on the HTML
builder, so every page declared ``const THEBE_JS_URL`` twice (a console SyntaxError). The book
turns Thebe off (``launch_buttons.thebe: false``: it would need a remote kernel), so this
extension drops sphinx-thebe's scripts and stylesheet from every page.

The html-manager (embed-amd.js) loads its Font Awesome files from a webpack public path that
it derives from the require.js URI of its own modules; with require.js's default base URL (the
page's folder) that was ``notebooks/@jupyter-widgets/...``: three 404s per widget page.
A global ``require`` object defined before require.js loads is require.js's configuration, so
an inline script maps the ``@jupyter-widgets`` module names onto ``_static/tokenflow-widgets/``
(where scripts/fetch_widget_js.sh copies the font files), using the page's
``data-content_root`` (Sphinx >= 7.2). The modules themselves are all defined inside
embed-amd.js, so the mapping never makes require.js fetch code; it only fixes those URIs.

Figures on a narrow screen: a figure is drawn for the 784 px column, and scaled down with a
phone's column its text would be about 7 px high. An inline script (:data:`FIGURE_JS`) puts each
figure of a notebook output or a precomputed explorer in a ``div.tf-figure`` of its own, gives
the image its intended width as ``--tf-figure-width``, and adds a hint after it;
_static/tokenflow.css (screen only) keeps the image at no less than a set share of that width,
lets the box scroll sideways, and shows the hint while the box has more to scroll to. The
image's inline height (myst-nb writes the PNG's ``width`` and ``height``) is dropped, so the
figure keeps its aspect ratio at any width (the stylesheet's ``height: auto !important`` does
the same without scripts). Wide tables (``div.tf-table-wrap`` of tokenflow.viz.Table, the
theme's ``div.pst-scrollable-table-container`` around markdown tables) and the Mermaid diagram
(``pre.tokenflow-mermaid``) scroll in their own box already; they get the same hint, worded
for a table or a diagram. Without scripts, figures scale with the column as before.

Loaded by _config.yml (``sphinx: local_extensions: {book_html: scripts/}``).
"""
from __future__ import annotations

import json


def _is_thebe(asset) -> bool:
    name = getattr(asset, "filename", None) or str(asset)
    body = (getattr(asset, "attributes", None) or {}).get("body", "")
    return "sphinx-thebe" in (name or "") or "THEBE_JS_URL" in body


def _drop_thebe(app, pagename, templatename, context, doctree):
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [a for a in context[key] if not _is_thebe(a)]


WIDGET_ASSETS = """
var require = (function () {
  var w = new URL((document.documentElement.dataset.content_root || "") +
                  "_static/tokenflow-widgets", document.baseURI).href;
  return {paths: {"@jupyter-widgets/html-manager/dist": w, "@jupyter-widgets": w}};
})();
"""


# The hints' texts per edition and kind (the Chinese ones use only characters of the book's
# web font, scripts/build_fonts.py).
FIGURE_HINTS = {"en": {"figure": "← scroll sideways to see the whole figure →",
                       "table": "← scroll sideways to see the whole table →",
                       "diagram": "← scroll sideways to see the whole diagram →"},
                "zh": {"figure": "← 左右滑动查看整幅图 →",
                       "table": "← 左右滑动查看整张表 →",
                       "diagram": "← 左右滑动查看整幅图 →"}}

# The boxes that scroll sideways with a hint, and the kind of hint each gets.
HINTED_BOXES = {"table": ".bd-article div.tf-table-wrap, "
                         ".bd-article div.pst-scrollable-table-container, "
                         ".bd-article div.tf-mp-scroll",
                "diagram": ".bd-article pre.tokenflow-mermaid"}

FIGURE_JS = """
document.addEventListener("DOMContentLoaded", function () {
  var hints = %s, boxes = %s;
  hints = hints[document.documentElement.lang.slice(0, 2)] || hints.en;
  var seen = window.ResizeObserver && new ResizeObserver(function (found) {
    found.forEach(function (b) {
      var box = b.target;
      // (a markdown table scrolls itself inside the theme's container)
      box.classList.toggle("tf-figure-wide", [box].concat([].slice.call(
        box.querySelectorAll(":scope > table"))).some(function (e) {
          return e.scrollWidth > e.clientWidth + 1; }));
    });
  });
  // a hint after the box, shown by the stylesheet while the box is wider than its room
  function hinted(box, kind) {
    var note = document.createElement("div");
    note.className = "tf-figure-hint";
    note.setAttribute("aria-hidden", "true");
    note.textContent = hints[kind];
    box.after(note);
    if (seen) seen.observe(box);
  }
  document.querySelectorAll(".bd-article div.cell_output img, .bd-article .tf-out img")
    .forEach(function (img) {
      var width = parseFloat(img.style.width) || parseFloat(img.getAttribute("width"));
      if (!width || img.closest(".tf-figure")) return;
      var item = img.parentNode.matches("a.image-reference") ? img.parentNode : img;
      var box = document.createElement("div");
      box.className = "tf-figure";
      item.parentNode.insertBefore(box, item);
      box.appendChild(item);
      img.style.removeProperty("height");       // the width sets it: the aspect ratio kept
      img.style.setProperty("--tf-figure-width", width + "px");
      hinted(box, "figure");
    });
  Object.keys(boxes).forEach(function (kind) {
    document.querySelectorAll(boxes[kind]).forEach(function (box) {
      box.classList.add("tf-scroll-box");
      hinted(box, kind);
    });
  });
});
""" % (json.dumps(FIGURE_HINTS, ensure_ascii=True), json.dumps(HINTED_BOXES))


def setup(app):
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.add_js_file(None, body=WIDGET_ASSETS, priority=100)
    app.add_js_file(None, body=FIGURE_JS)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
