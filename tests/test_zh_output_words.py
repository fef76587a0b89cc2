"""The stored Chinese notebooks (notebooks/zh/) name their table columns and explorer controls
in Chinese: every table header (<th>), explorer title and control label in their stored HTML
outputs is scanned for English prose words. Code names, field names, units, model and
hardware names and acronyms stay as they are (the allow-list below); a new untranslated
header fails until ``src/tokenflow/data/outputs_zh.json`` has its entry and the Chinese
notebook is rebuilt (``make zh-notebooks``)."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ZH = sorted((ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb"))
# words that are names, not prose: units, acronyms in mixed case, the samplers' knobs
ALLOWED = {"logit", "logits", "top-k", "top-p", "min-p", "nvlink", "infiniband", "gloo",
           "vllm", "deepseek", "flops", "gflop", "tflop", "gib", "mib", "kib", "moe",
           "kb", "gb", "ms", "tok/s", "qwen", "llama", "mixtral", "gpt", "rope", "swiglu",
           "rmsnorm", "softmax", "rank", "ranks", "lens"}
# whole texts that are code expressions
CODE = {"decode(encode(text)) == text", "W[row] . h"}
VOID = {"input", "img", "br", "hr", "meta", "link", "source", "col", "wbr"}
TOKEN = re.compile(r"[A-Za-z0-9_./\\+|'-]+")


def prose_words(text: str) -> list[str]:
    """The English prose words of ``text``: tokens with three lowercase letters in a row that
    hold no digit, ``_``, ``.`` or ``/`` (code and model names) and are not in ALLOWED."""
    if text.strip() in CODE:
        return []
    return [t for t in TOKEN.findall(text)
            if re.search(r"[a-z]{3}", t) and not re.search(r"[0-9_./]", t)
            and t.lower().strip("'-") not in ALLOWED]


class _Labels(HTMLParser):
    """Texts of <th>, <label class="tf-ctl"> (its own text, before the control), explorer
    titles (<div class="tf-title">) and controls' aria-labels."""

    def __init__(self):
        super().__init__()
        self.stack, self.found = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class") or ""
        kind = ("th" if tag == "th" else "label" if tag == "label" and "tf-ctl" in cls
                else "title" if tag == "div" and "tf-title" in cls else None)
        if tag not in VOID:
            self.stack.append(kind)
        if a.get("aria-label") and a.get("data-tf-ctl") is not None:
            self.found.append(("aria-label", a["aria-label"]))

    def handle_endtag(self, tag):
        if self.stack and tag not in VOID:
            self.stack.pop()

    def handle_data(self, data):
        kind = next((k for k in reversed(self.stack) if k), None)
        if kind and data.strip():
            self.found.append((kind, data.strip()))


def labels(path: Path) -> list[tuple[int, str, str]]:
    """(cell index, kind, text) of every header, explorer title and control label stored in
    the notebook's HTML outputs."""
    out = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        for o in cell.get("outputs", []):
            page = "".join(o.get("data", {}).get("text/html", ""))
            if page:
                p = _Labels()
                p.feed(page)
                out += [(i, k, t) for k, t in p.found]
    return out


def test_the_allow_list_keeps_names_and_catches_prose():
    """Names, units and acronyms pass; the headers a reader found English are caught."""
    assert prose_words("hidden_size H") == []
    assert prose_words("DeepSeek-V3 on H800 SXM, decode") == ["decode"]
    assert prose_words("decode(encode(text)) == text") == []
    assert prose_words("TTFT ms") == [] and prose_words("top-k K") == []
    assert prose_words("解码 rows per step") == ["rows", "per", "step"]
    assert prose_words("ids in") == ["ids"]
    assert prose_words("experts E") == ["experts"]


@pytest.mark.parametrize("path", ZH, ids=lambda p: p.stem)
def test_zh_headers_and_explorer_labels_are_chinese(path):
    """No stored <th>, explorer title or control label of the Chinese notebook has an
    English prose word."""
    left = sorted({(k, t) for i, k, t in labels(path) if prose_words(t)})
    assert not left, f"English in {path.name} (add to outputs_zh.json, rebuild): {left}"
