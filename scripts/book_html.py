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

Loaded by _config.yml (``sphinx: local_extensions: {book_html: scripts/}``).
"""
from __future__ import annotations


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


def setup(app):
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.add_js_file(None, body=WIDGET_ASSETS, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
