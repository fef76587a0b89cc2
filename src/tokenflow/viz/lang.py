"""The language of the words the viz layer prints and draws: English, or Chinese for the
Chinese notebooks (``notebooks/zh/``, written by ``scripts/zh_notebooks.py``).

``set_language("zh")`` (the first code cell of every Chinese notebook) makes :func:`tr` look
each English string up in ``data/outputs_zh.json``; numbers, code and names stay as they are.
An entry is either a whole string (``"what it does"``) or a template whose ``{}`` stand for
any text (``"{} tokens"``), its translation naming them ``{0}``, ``{1}``, ... in the order they
appear in the English; where several templates match, the one with the most fixed text wins;
a string with no entry stays English; a text :func:`tr` has already given back is given back
as it is (``"{} logits"`` gives ``"888 个 logits"``, which the same template would otherwise
match again: ``"888 个 个 logits"``). :func:`tr` is the one lookup:
:func:`~tokenflow.viz.fmt.say` (the "what you can now say" sentences), table headers and
titles, the explorers' titles and notes, the diagram's labels, and every text matplotlib draws
(titles, axis labels, legends, annotations: each is looked up as it is drawn).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

_IMPORTED = set(globals())          # the names above are imported, not defined here

LANGUAGES = ("en", "zh")
CATALOG = Path(__file__).parent.parent / "data" / "outputs_zh.json"
_state = {"lang": "en"}
_given: set[str] = set()            # the translations tr has given back (never looked up again)


def set_language(lang: str) -> None:
    """Print and draw in ``lang`` from now on in this process: ``"en"`` or ``"zh"``.

    Raises:
        ValueError: if ``lang`` is not one of :data:`LANGUAGES`.
    """
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    _state["lang"] = lang
    if lang != "en":
        _translate_drawn_text()


def language() -> str:
    """The language set by :func:`set_language` (``"en"`` by default)."""
    return _state["lang"]


@lru_cache(maxsize=None)
def _catalog(path: Path = CATALOG) -> tuple[dict, list]:
    """(whole strings, [(compiled template, translation)]) of the Chinese catalog."""
    entries = json.loads(path.read_text(encoding="utf-8"))["messages"]
    exact = {k: v for k, v in entries.items() if "{}" not in k}
    # the most specific first: "layer {}, head {}" before "layer {}"
    keys = sorted((k for k in entries if "{}" in k), key=lambda k: -len(k.replace("{}", "")))
    templates = [(re.compile("(.+?)".join(map(re.escape, k.split("{}"))), re.S), entries[k])
                 for k in keys]
    return exact, templates


def tr(text):
    """``text`` in the language set by :func:`set_language`: its catalog entry, or ``text``
    itself (also for anything that is not a str, and in English)."""
    if _state["lang"] == "en" or not isinstance(text, str) or not text.strip():
        return text
    exact, templates = _catalog()
    if text in exact:
        _given.add(exact[text])
        return exact[text]
    if text in _given:
        return text
    for pattern, zh in templates:
        m = pattern.fullmatch(text)
        if m:
            out = zh.format(*m.groups())
            _given.add(out)
            return out
    return text


def _translate_drawn_text() -> None:
    """Look every matplotlib text up with :func:`tr` as it is drawn (titles, labels, legends,
    tick labels, annotations), once, for all figures of this process."""
    from matplotlib.text import Text
    if getattr(Text.draw, "_tokenflow_tr", False):
        return
    draw = Text.draw

    def translated_draw(self, renderer, *args, **kwargs):
        text = self.get_text()
        zh = tr(text)
        if zh != text:
            self.set_text(zh)
        return draw(self, renderer, *args, **kwargs)

    translated_draw._tokenflow_tr = True
    Text.draw = translated_draw


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
