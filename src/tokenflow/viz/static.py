"""Sliders that work without a kernel: every output of a small control grid, computed when the
notebook runs and embedded in one HTML block, with a few lines of inline JavaScript that show the
output matching the controls.

The static HTML book, a trusted notebook in JupyterLab and an exported HTML file all show it; no
kernel, no widget manager and no network are needed. An untrusted notebook in JupyterLab (whose
stored outputs lose their scripts) shows the default output and "run this cell" instead of
controls that cannot move. The live ``ipywidgets`` version of a chapter's
explorer stays for readers who run the notebook.
"""
from __future__ import annotations

import base64
import functools
import html
import io
import itertools
import json
import numbers

from .fmt import Table, fold
from .lang import tr

_IMPORTED = set(globals())          # the names above are imported, not defined here

MAX_OUTPUTS = 48
"""Most combinations one explorer embeds (each figure adds ~30-80 KB to the page)."""
MAX_HTML_BYTES = 4_000_000
"""Most bytes of HTML one explorer may produce."""
PNG_DPI = 240
"""Resolution the figures are rendered at; they are displayed at half (120 px per inch on the
page, retina-sharp, as the chapters' inline figures), so matplotlib's 10 pt text is 16.7 px,
the size of the book's body text."""

# One handler for every control: read each control's index, update its value label, show the
# output whose data-key is the indices joined by "-", hide the others.
_JS = ("var x=this.closest('.tf-explorer'),k=[];"
       "x.querySelectorAll('[data-tf-ctl]').forEach(function(e){k.push(e.value);"
       "var v=e.parentNode.querySelector('.tf-val');"
       "if(v){v.textContent=JSON.parse(e.getAttribute('data-labels'))[e.value];}});"
       "k=k.join('-');x.querySelectorAll('.tf-out').forEach(function(o){"
       "o.style.display=o.getAttribute('data-key')==k?'':'none';});")


RUN_NOTE = ("Stored output of the default setting. To move the controls, run this cell "
            "(Shift+Enter) or trust the notebook.")
"""What an explorer says where its controls cannot work (an untrusted notebook in JupyterLab)."""

# Run where scripts run: show the controls and the "precomputed" note, hide the "run" note.
_REVEAL = ("(function(){var s=document.currentScript,x=s&&s.closest('.tf-explorer');if(!x)return;"
           "x.querySelector('.tf-controls').style.display='';"
           "x.querySelector('.tf-note-live').style.display='';"
           "x.querySelector('.tf-note-run').style.display='none';})();")


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LIVE_NOTE = ("The live explorer a few cells below replaces this precomputed one while the "
             "kernel runs; the book shows the precomputed one.")
"""What a precomputed explorer with a live one below shows in a running JupyterLab session."""


def _live_note_view() -> dict | None:
    """The widget-view data of an ``ipywidgets.HTML`` holding :data:`LIVE_NOTE`, or None when
    no IPython kernel runs (a plain script, the tests) or ipywidgets is missing."""
    try:
        from IPython import get_ipython
        shell = get_ipython()
        if shell is None or not hasattr(shell, "kernel"):
            return None
        import ipywidgets
    except ImportError:
        return None
    note = ipywidgets.HTML(f'<span class="tf-note">{html.escape(tr(LIVE_NOTE))}</span>')
    return note._repr_mimebundle_().get(WIDGET_VIEW)


def _render(out, kind: str) -> str:
    """One output as an HTML fragment. Figures are closed after capture."""
    from matplotlib.figure import Figure
    if kind == "auto":
        kind = ("png" if isinstance(out, Figure) else "html" if hasattr(out, "_repr_html_")
                else "text")
    if kind in ("png", "svg"):
        if not isinstance(out, Figure):
            raise TypeError(f"kind={kind!r} needs fn to return a matplotlib Figure, "
                            f"got {type(out).__name__}")
        return _figure_html(out, kind)
    if kind == "html":
        if not hasattr(out, "_repr_html_"):
            raise TypeError("kind='html' needs an object with _repr_html_, "
                            f"got {type(out).__name__}")
        return out._repr_html_()
    if kind == "text":
        text = out.to_text() if isinstance(out, Table) else str(out)
        return f'<pre class="tf-pre">{html.escape(text)}</pre>'
    raise ValueError(f"kind must be 'auto', 'png', 'svg', 'html' or 'text', got {kind!r}")


def _figure_html(fig, kind: str) -> str:
    """A figure as an ``<img>`` (PNG at :data:`PNG_DPI`, shown at half size, compacted by
    :func:`~tokenflow.viz.style.compact_png`) or inline SVG.
    Both are written without dates or random ids, so the same figure gives the same bytes."""
    import matplotlib
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    try:
        if kind == "png":
            fig.savefig(buf, format="png", dpi=PNG_DPI, bbox_inches="tight",
                        metadata={"Software": None})
        else:
            with matplotlib.rc_context({"svg.hashsalt": "tokenflow"}):
                fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    finally:
        plt.close(fig)
    if kind == "svg":
        svg = buf.getvalue().decode()
        return svg[svg.index("<svg"):]
    from .style import compact_png
    png = compact_png(buf.getvalue())
    width = _png_width(png) // 2
    alt = html.escape(_figure_alt(fig))
    data = base64.b64encode(png).decode()
    return (f'<img src="data:image/png;base64,{data}" width="{width}" alt="{alt}" '
            f'style="max-width:100%;height:auto">')


def _png_width(png: bytes) -> int:
    return int.from_bytes(png[16:20], "big")  # IHDR width, PNG spec section 11.2.2


def _figure_alt(fig) -> str:
    """Alt text: the figure's suptitle or its axes titles."""
    sup = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else ""
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    return sup or "; ".join(titles) or "figure"


def _controls_html(controls: dict, default: dict) -> str:
    """One labelled control per entry: a range over the value indices for numbers, a select
    otherwise. Each control's value is an index into its list."""
    js = html.escape(_JS, quote=True)
    parts = []
    for name, values in controls.items():
        labels = [str(v) for v in values]
        shown = html.escape(tr(name))
        i = default[name]
        data = html.escape(json.dumps(labels, ensure_ascii=False), quote=True)
        if all(isinstance(v, numbers.Number) and not isinstance(v, bool) for v in values):
            ctl = (f'<input type="range" data-tf-ctl min="0" max="{len(values) - 1}" step="1" '
                   f'value="{i}" data-labels="{data}" aria-label="{shown}" '
                   f'oninput="{js}">'
                   f' <span class="tf-val">{html.escape(labels[i])}</span>')
        else:
            opts = "".join(f'<option value="{k}"{" selected" if k == i else ""}>'
                           f"{html.escape(s)}</option>" for k, s in enumerate(labels))
            ctl = (f'<select data-tf-ctl data-labels="{data}" aria-label="{shown}" '
                   f'oninput="{js}" onchange="{js}">{opts}</select>')
        parts.append(f'<label class="tf-ctl">{shown} {ctl}</label>')
    return "\n".join(parts)


def _check_controls(controls, default, max_outputs: int | None = MAX_OUTPUTS) -> dict:
    """Validate ``controls`` / ``default`` (at most ``max_outputs`` combinations, None: no
    limit); return each control's default index."""
    if not isinstance(controls, dict) or not controls:
        raise TypeError("controls must be a non-empty dict name -> list of values, "
                        f"got {controls!r}")
    n = 1
    for name, values in controls.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"controls[{name!r}] must be a non-empty list of values, "
                             f"got {values!r}")
        n *= len(values)
    if max_outputs is not None and n > max_outputs:
        sizes = " x ".join(str(len(v)) for v in controls.values())
        raise ValueError(f"the control grid has {sizes} = {n} combinations; precomputed_explorer "
                         f"embeds at most MAX_OUTPUTS = {MAX_OUTPUTS} (use fewer values, or a live "
                         f"widget and say next to it that it needs a running kernel)")
    default = dict(default or {})
    unknown = set(default) - set(controls)
    if unknown:
        raise ValueError(f"default names controls that do not exist: {sorted(unknown)}")
    index = {}
    for name, values in controls.items():
        if name in default and default[name] not in list(values):
            raise ValueError(f"default[{name!r}] = {default[name]!r} is not one of {list(values)}")
        index[name] = list(values).index(default[name]) if name in default else 0
    return index


def _summary(title: str | None, kind: str, controls: dict, tail: str) -> str:
    """An explorer's text form, ``title: kind name (n values) x ... tail``, on one line or
    folded to 90 columns between its parts (continuation lines indented by two); a ``tail``
    starting with ``;`` is joined to the last control."""
    words = (f"{title}:".split() if title else []) + [kind]
    for k, (name, values) in enumerate(controls.items()):
        words.append(f"{'x ' if k else ''}{name} ({len(values)} values)")
    if tail.startswith(";"):
        words[-1] += ";"
    return "\n".join(fold(words + [tail.lstrip("; ")], 90, "  "))


class PrecomputedExplorer:
    """What :func:`precomputed_explorer` returns: shows as HTML (controls + all outputs) in the
    book and JupyterLab, and as a summary in text (what nbval compares): one line, or folded
    to 90 columns.

    With ``live_below`` (a live ``ipywidgets`` explorer of the same thing follows a few cells
    below) and a running kernel, the output also carries a small widget, :data:`LIVE_NOTE`:
    JupyterLab draws a widget in preference to HTML in a running session, so after "Run All"
    this cell says where the live controls are instead of showing a second set. The book
    (_config.yml ranks widget views below HTML) and an untrusted notebook (which draws no
    widget) show the precomputed HTML."""

    def __init__(self, controls: dict, fragments: dict, default: dict, title: str | None,
                 live_below: bool = False):
        self.controls = {k: list(v) for k, v in controls.items()}
        self.fragments = fragments   # "i-j-..." (value indices) -> HTML fragment
        self.default = default       # control name -> default index
        self.title = title
        self.live_below = live_below

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """text/plain and text/html; plus the :data:`LIVE_NOTE` widget's view when
        ``live_below`` and a kernel with ipywidgets is running (see the class docstring)."""
        bundle = {"text/plain": repr(self), "text/html": self._repr_html_()}
        view = _live_note_view() if self.live_below else None
        if view is not None:
            bundle[WIDGET_VIEW] = view
        return bundle

    def __repr__(self) -> str:
        return _summary(self.title, "precomputed explorer:", self.controls,
                        f"= {len(self.fragments)} outputs")

    def _repr_html_(self) -> str:
        """The controls, the notes and every output. The controls and the "precomputed" note
        start hidden, next to a "run this cell" note; the inline :data:`_REVEAL` script swaps
        them. It runs wherever the controls can work (the book, an exported page, JupyterLab
        once the notebook is trusted or the cell ran); JupyterLab's sanitizer drops scripts and
        event handlers of an untrusted notebook's stored outputs, leaving the stored default
        output and the note, and no control that cannot move."""
        shown = "-".join(str(i) for i in self.default.values())
        hide = ' style="display:none"'
        outs = "\n".join(
            f'<div class="tf-out" data-key="{key}"{"" if key == shown else hide}>{frag}</div>'
            for key, frag in self.fragments.items())
        title = (f'<div class="tf-title">{html.escape(tr(self.title))}</div>' if self.title
                 else "")
        note = (f'<div class="tf-note tf-note-live"{hide}>' + tr(
                'Precomputed when the notebook ran: moving a control shows the stored output '
                'for that setting (no kernel needed).') + '</div>')
        run = (f'<div class="tf-note tf-note-run">{html.escape(tr(RUN_NOTE))}</div>')
        return (f'<div class="tf-explorer">{title}\n<div class="tf-controls"{hide}>\n'
                f"{_controls_html(self.controls, self.default)}\n</div>\n{note}\n{run}\n"
                f"{outs}\n<script>{_REVEAL}</script>\n</div>")


def precomputed_explorer(fn, controls: dict, *, title: str | None = None, kind: str = "auto",
                         default: dict | None = None,
                         live_below: bool = False) -> PrecomputedExplorer:
    """Call ``fn(**combo)`` for every combination of the control values now, and return an
    object that shows all outputs behind one control per entry of ``controls`` (a slider for
    numeric values, a drop-down otherwise), with inline JavaScript that shows the output for
    the selected values: works in the static HTML book and JupyterLab without a kernel.

    Args:
        fn: called with one keyword per control; returns a matplotlib Figure, a
            :class:`~tokenflow.viz.fmt.Table` (or anything with ``_repr_html_``) or a str.
        controls: control name -> list of values, e.g. ``{"head": [0, 1, 2, 3]}``.
        title: a line above the controls, also the start of the text repr.
        kind: ``"auto"`` (Figure -> PNG, ``_repr_html_`` -> HTML, else text), or force
            ``"png"``, ``"svg"``, ``"html"``, ``"text"``.
        default: control name -> value shown first (default: each control's first value).
        live_below: a code cell further down shows a live ``ipywidgets`` explorer of the same
            thing;
            in a running JupyterLab session this one then shows a note instead of a second set
            of controls (:class:`PrecomputedExplorer`).

    Figures are saved (PNG at :data:`PNG_DPI`, or SVG with a fixed hash salt) and closed, so
    the notebook does not show them a second time.

    Raises:
        TypeError: if ``controls`` is not a non-empty dict, or an output does not fit ``kind``.
        ValueError: if a control has no values, the grid has more than :data:`MAX_OUTPUTS`
            combinations, the HTML exceeds :data:`MAX_HTML_BYTES`, or ``default`` names an
            unknown control or value.
    """
    index = _check_controls(controls, default)
    names = list(controls)
    fragments = {}
    for idx in itertools.product(*(range(len(controls[n])) for n in names)):
        combo = {n: controls[n][i] for n, i in zip(names, idx)}
        fragments["-".join(map(str, idx))] = _render_call(fn, combo, kind)
    size = sum(len(f) for f in fragments.values())
    if size > MAX_HTML_BYTES:
        raise ValueError(f"the explorer's outputs take {size:,} bytes; at most MAX_HTML_BYTES = "
                         f"{MAX_HTML_BYTES:,} (use fewer values or smaller figures)")
    return PrecomputedExplorer(controls, fragments, index, title, live_below)


def _render_call(fn, combo: dict, kind: str) -> str:
    """``fn(**combo)`` rendered; any other figure fn opened is closed too."""
    import matplotlib.pyplot as plt
    before = set(plt.get_fignums())
    try:
        return _render(fn(**combo), kind)
    finally:
        for num in set(plt.get_fignums()) - before:
            plt.close(num)


def _live_controls(controls: dict, index: dict) -> dict:
    """One ``ipywidgets`` control per entry, over the same values: a ``SelectionSlider`` for
    numbers, a ``Dropdown`` otherwise; each starts at its default."""
    import ipywidgets as widgets
    out = {}
    for name, values in controls.items():
        values = list(values)
        numeric = all(isinstance(v, numbers.Number) and not isinstance(v, bool) for v in values)
        kw = dict(options=values, value=values[index[name]], description=tr(name),
                  style={"description_width": "initial"})
        out[name] = (widgets.SelectionSlider(continuous_update=False, **kw) if numeric
                     else widgets.Dropdown(**kw))
    return out


def default_in(controls: dict, preferred: dict) -> dict:
    """The entries of ``preferred`` (control name -> value) that ``controls`` offers: an
    explorer's chosen starting point, kept only where a caller's grid still has it."""
    return {k: v for k, v in preferred.items() if k in controls and v in list(controls[k])}


def explore(fn, controls: dict, *, live: bool = False, title: str | None = None,
            kind: str = "auto", default: dict | None = None, live_below: bool = False):
    """One explorer of ``fn`` over a grid of control values, in either of two forms.

    ``live=False``: :func:`precomputed_explorer` (every output computed now and embedded:
    works in the book and without a kernel). ``live=True``: an ``ipywidgets.interactive`` (whose
    text form names the title and the controls, within 90 columns) with
    the same controls (a slider over the numeric values, a drop-down otherwise), calling
    ``fn(**values)`` when a control moves and displaying what it returns (a figure, a table,
    a str).

    Args:
        fn: called with one keyword per control name.
        controls: control name -> list of values.
        live, title, kind, default, live_below: as above and as in :func:`precomputed_explorer`
            (``kind`` and ``live_below`` apply to the precomputed form only).

    Raises:
        TypeError, ValueError: as :func:`precomputed_explorer` (bad controls or default).
    """
    if not live:
        return precomputed_explorer(fn, controls, title=title, kind=kind, default=default,
                                    live_below=live_below)
    index = _check_controls(controls, default, max_outputs=None)   # a live grid may be large
    from IPython.display import display

    def show(**values):
        import matplotlib.pyplot as plt
        from matplotlib.figure import Figure
        out = fn(**values)
        if isinstance(out, Figure):
            display(out)
            plt.close(out)
        elif isinstance(out, str):
            print(out)
        elif out is not None:
            display(out)
    explorer = _live_explorer_class()(show, **_live_controls(controls, index))
    explorer.summary = _summary(title, "live explorer:", controls,
                                "; needs a running kernel")
    return explorer


@functools.cache
def _live_explorer_class():
    """``ipywidgets.interactive`` with a short text form (:func:`_summary`) instead of the
    widget tree's repr, which ipywidgets cuts at 110 characters."""
    import ipywidgets as widgets

    class LiveExplorer(widgets.interactive):
        """What ``explore(..., live=True)`` returns: the controls and their output, shown as
        ``title: live explorer: name (n values) x ...; needs a running kernel`` where no
        widget is drawn (a terminal, nbval, a plain-text viewer)."""
        summary = ""

        def __repr__(self) -> str:
            return self.summary

        def _repr_mimebundle_(self, **kwargs):
            data = super()._repr_mimebundle_(**kwargs)
            if data is not None:
                data["text/plain"] = self.summary
            return data

    return LiveExplorer


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
