"""Sphinx extension: draw ```` ```mermaid ```` blocks in the HTML book with no network access.

The token-flow diagram (``src/tokenflow/data/token_flow.mmd``) reaches the book as a notebook
output: ``tokenflow.viz.diagram.Diagram`` displays itself as markdown holding a ```` ```mermaid ````
fence (which JupyterLab 4.1+ draws itself). _config.yml renders notebook markdown outputs as
MyST (``nb_render_markdown_format: myst``) and maps the fence to the ``mermaid`` directive
(``myst_fence_as_directive``); this extension defines that directive. It writes the source
into ``<pre class="mermaid tokenflow-mermaid">`` and, on those pages only, loads the vendored
``mermaid.min.js`` (npm ``mermaid``, the self-contained IIFE build, fetched by
scripts/fetch_widget_js.sh into ``_static/tokenflow-mermaid/``) plus a small start-up script.
A classic script, not the ES-module build: browsers refuse module imports on ``file://`` pages.

Loaded by _config.yml (``sphinx: local_extensions: {mermaid_offline: scripts/}``).
"""
from __future__ import annotations

import html

from docutils import nodes
from docutils.parsers.rst import Directive

MERMAID_JS = "tokenflow-mermaid/mermaid.min.js"   # relative to _static/
START = """
document.addEventListener("DOMContentLoaded", function () {
  if (typeof mermaid === "undefined") { return; }   // source text stays visible
  var dark = document.documentElement.dataset.theme === "dark";
  // labels in Chinese (the zh edition's diagram) drawn with its web font, as the text is
  // drawn at its natural size (16 px labels; the page scrolls a narrow column's box sideways,
  // _static/tokenflow.css) and with less space between its ranks and around its labels:
  // 1,617 px tall at 1280 px, not 2,150 (the subgraph's title keeps room under it)
  mermaid.initialize({startOnLoad: false, securityLevel: "strict",
                      theme: dark ? "dark" : "default",
                      flowchart: {useMaxWidth: false, rankSpacing: 26, nodeSpacing: 30,
                                  padding: 8, subGraphTitleMargin: {top: 0, bottom: 12}},
                      themeVariables: {fontFamily:
                        '"trebuchet ms", verdana, arial, "Tokenflow CJK", sans-serif'}});
  mermaid.run({querySelector: "pre.tokenflow-mermaid"});
});
"""


class mermaid_node(nodes.General, nodes.Element):
    """A Mermaid diagram; ``node["code"]`` holds its source."""


class MermaidDirective(Directive):
    """``mermaid`` directive: its content is the Mermaid source (no options)."""

    has_content = True

    def run(self):
        node = mermaid_node()
        node["code"] = "\n".join(self.content)
        return [node]


def _visit_html(self, node):
    code = html.escape(node["code"])               # mermaid decodes the entities itself
    self.body.append(f'<pre class="mermaid tokenflow-mermaid">{code}</pre>\n')
    raise nodes.SkipNode


def _visit_other(self, node):
    raise nodes.SkipNode


def _add_js(app, pagename, templatename, context, doctree):
    if doctree is not None and doctree.next_node(mermaid_node) is not None:
        app.add_js_file(MERMAID_JS, priority=200)      # before require.js (widgets)
        app.add_js_file(None, body=START, priority=201)


def setup(app):
    app.add_node(mermaid_node, html=(_visit_html, None), latex=(_visit_other, None),
                 text=(_visit_other, None), man=(_visit_other, None),
                 texinfo=(_visit_other, None))
    app.add_directive("mermaid", MermaidDirective)
    app.connect("html-page-context", _add_js)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
