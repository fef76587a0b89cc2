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


# ------------------------------------------------------------------ sentences in any output
# An English sentence printed into a Chinese notebook is a run of RUN or more prose words in a
# row. Left out of the scan: what the notebook's own code prints with print() (the string
# literals of its print calls: the Chinese notebook runs the English code), printed source code
# (inspect.getsource), the text/plain of a widget (the page shows the widget or its static
# HTML), and the header row of tokenflow.parallel's rank table (below the viz layer, which
# alone translates).
RUN = 4
NOT_PROSE = {"tokens experts rows out local rows in dispatch B formula combine B formula"}
_WORD = re.compile(r"^[(\"'“‘\[]*([A-Za-z][a-z'-]*[a-z])[)\"'”’\].,:;!?]*$")
_NAME = re.compile(r"^[(\"'“‘\[]*[A-Za-z][A-Za-z-]*[)\"'”’\].,:;!?]*$")
_SKIP = {"code", "pre", "script", "style", "kbd", "samp"}


def english_runs(text: str, n: int = RUN) -> list[str]:
    """The runs of ``n`` or more English prose words in a row (whitespace-separated, per
    line) in ``text``: lowercase words of two or more letters (a capital first letter
    allowed, punctuation around them ignored) that are not in ALLOWED. Names between them
    (ALLOWED words, acronyms, mixed case: ``InfiniBand``) neither count nor end a run;
    numbers, code and Chinese end it."""
    found = []
    for line in text.splitlines():
        run, words = [], 0
        for tok in line.split() + ["。"]:
            m = _WORD.match(tok)
            if m and m.group(1).lower() not in ALLOWED:
                run.append(tok)
                words += 1
            elif run and (m or _NAME.match(tok)):
                run.append(tok)
            else:
                if words >= n:
                    found.append(" ".join(run).rstrip())
                run, words = [], 0
    return found


class _Prose(HTMLParser):
    """The text of an HTML output outside <code>, <pre>, <script> and <style>, a line per
    cell, paragraph or line break."""

    def __init__(self):
        super().__init__()
        self.skip, self.out = 0, []

    def handle_starttag(self, tag, attrs):
        self.skip += tag in _SKIP
        if tag in ("td", "th", "p", "div", "li", "br", "tr", "caption", "label"):
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag in _SKIP:
            self.skip = max(0, self.skip - 1)

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


def _printed_literals(code: str) -> list[str]:
    """The string pieces of every print(...) call in ``code`` (f-strings: their fixed text)."""
    import ast
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return [n.value for call in ast.walk(tree) if isinstance(call, ast.Call)
            and getattr(call.func, "id", "") == "print"
            for n in ast.walk(call) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def output_texts(path: Path):
    """(cell index, kind, text) of every stored output a reader sees as text: streams,
    text/plain (of outputs without HTML or a widget) and the HTML's text."""
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if o.get("output_type") == "stream":
                yield i, "stream", "".join(o["text"])
            elif "text/html" in data:
                p = _Prose()
                p.feed("".join(data["text/html"]))
                yield i, "html", "".join(p.out)
            elif "text/plain" in data and not any("widget" in k for k in data):
                yield i, "text/plain", "".join(data["text/plain"])


def _bare(text: str) -> str:
    """``text``'s words without punctuation, one space apart."""
    return " ".join(re.sub(r"[^\w\s'-]", " ", text).split())


def english_sentences(path: Path) -> list[tuple[int, str]]:
    """(cell index, run) of every English run in the notebook's outputs that its own print()
    calls do not write (see the note above RUN)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    left = []
    for i, kind, text in output_texts(path):
        code = "".join(cells[i]["source"])
        if "getsource(" in code:
            continue
        printed = " " + _bare(" ".join(_printed_literals(code))) + " "
        for run in english_runs(text):
            words = _bare(run).split()
            if run in NOT_PROSE or any(f" {' '.join(words[k:k + 3])} " in printed
                                       for k in range(len(words) - 2)):
                continue
            left.append((i, run))
    return left


def test_english_runs_finds_sentences_and_keeps_names():
    """The sentences a reader found English are caught, names and short labels are not."""
    assert english_runs("Over the run a contiguous reservation of 128 slots") == [
        "Over the run a contiguous reservation of"]
    assert english_runs("解码 all-to-all, direct over InfiniBand, per token and MoE layer") == [
        "all-to-all, direct over InfiniBand, per token and MoE layer"]
    assert english_runs("都 is the top token from depth 0 (embedding) on") == [
        "is the top token from depth"]
    assert english_runs("request 0: 23 prompt tokens, 15 new, arrives at step 0") == [
        "new, arrives at step"]
    assert english_runs("DeepSeek-V3 MoE logits top-k InfiniBand vLLM 专家 H = 7168") == []
    assert english_runs("三个 English words here") == []
    assert english_runs("logit lens 只读到“首”本身的嵌入；equal within 1e-5: True") == []


@pytest.mark.parametrize("path", ZH, ids=lambda p: p.stem)
def test_zh_outputs_have_no_english_sentences(path):
    """No stored output of the Chinese notebook (streams, text/plain, the text of HTML
    outside code) has a run of RUN English prose words that the viz layer wrote: each such
    sentence, table cell or title has its Chinese form in outputs_zh.json (or the model
    page's zh table)."""
    left = sorted(set(english_sentences(path)))
    assert not left, f"English in {path.name} (add to outputs_zh.json, rebuild): {left}"


@pytest.mark.parametrize("path", ZH, ids=lambda p: p.stem)
def test_zh_outputs_write_no_measure_word_twice(path):
    """No stored output text of the Chinese notebook doubles a measure word ("888 个个
    logits"), the mark of a template translating its own output again."""
    from helpers import doubled_measure_words
    left = [(i, w, t[max(0, t.find(w) - 20):t.find(w) + 20])
            for i, _, t in output_texts(path) for w in doubled_measure_words(t)]
    assert not left, left
