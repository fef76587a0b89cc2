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
lets the box scroll sideways, and shows the hint while the box has more to scroll to. Without
scripts, figures scale with the column as before.

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


# The hint's text per edition (the Chinese one uses only characters of the book's web font).
FIGURE_HINTS = {"en": "← scroll sideways to see the whole figure →",
                "zh": "← 左右滑动查看整幅图 →"}

FIGURE_JS = """
document.addEventListener("DOMContentLoaded", function () {
  var hints = %s;
  var hint = hints[document.documentElement.lang.slice(0, 2)] || hints.en;
  var seen = window.ResizeObserver && new ResizeObserver(function (boxes) {
    boxes.forEach(function (b) {
      var box = b.target;
      box.classList.toggle("tf-figure-wide", box.scrollWidth > box.clientWidth + 1);
    });
  });
  document.querySelectorAll(".bd-article div.cell_output img, .bd-article .tf-out img")
    .forEach(function (img) {
      var width = parseFloat(img.style.width) || parseFloat(img.getAttribute("width"));
      if (!width || img.closest(".tf-figure")) return;
      var item = img.parentNode.matches("a.image-reference") ? img.parentNode : img;
      var box = document.createElement("div"), note = document.createElement("div");
      box.className = "tf-figure";
      note.className = "tf-figure-hint";
      note.setAttribute("aria-hidden", "true");
      note.textContent = hint;
      item.parentNode.insertBefore(box, item);
      box.appendChild(item);
      box.after(note);
      img.style.setProperty("--tf-figure-width", width + "px");
      if (seen) seen.observe(box);
    });
});
""" % json.dumps(FIGURE_HINTS, ensure_ascii=True)


def setup(app):
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.add_js_file(None, body=WIDGET_ASSETS, priority=100)
    app.add_js_file(None, body=FIGURE_JS)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
