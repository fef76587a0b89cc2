"""The book's token-flow diagram, and the trace rows tied to its nodes.

One text source, ``data/token_flow.mmd`` (a Mermaid flowchart), is the diagram of chapters 00
and 06: :func:`load_diagram` reads it and the returned :class:`Diagram` displays itself in
Jupyter as a fenced ```` ```mermaid ```` block (JupyterLab 4.1+ draws it; the HTML book turns
the fence into a diagram with a vendored ``mermaid.min.js``, see ``scripts/mermaid_offline.py``).

The labels written on its arrows are the arrow actions: ``lookup``,
``[B,S] -> [B,S,H]``, ``read KV``, ``route top-k``, ``project vocab``, ``sample``. Every
:class:`~tokenflow.analysis.trace.TraceEvent` belongs to one node of the diagram
(:data:`TRACE_NODE`), so a trace prints as "which box of the figure did what, to which shapes,
moving how many bytes" (:func:`diagram_trace_table`, :func:`trace_decode_step`).

Only the Mermaid subset the file uses is parsed (:func:`parse_mermaid`): ``flowchart``, one
node or one arrow per line, ``subgraph``/``end``, ``classDef``, ``class``, ``style``,
``linkStyle``; anything else raises, so the file cannot drift out of what the tests check.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenflow.analysis.trace import COLORS, Trace, TraceEvent

from .fmt import display_width, pad
from .lang import language, tr

_IMPORTED = set(globals())          # the names above are imported, not defined here

DIAGRAM_PATH = Path(__file__).parent.parent / "data" / "token_flow.mmd"
"""The Mermaid source of the token-flow diagram (shipped with the package)."""

TRACE_NODE = {"lookup": "embedding", "write KV": "attention", "read KV": "attention",
              "FFN": "dense_ffn", "route top-k": "router", "dispatch/combine": "experts",
              "project vocab": "lm_head", "sample": "sampling"}
"""Trace action -> id of the diagram node (or subgraph) that performs it."""

_SHAPES = [("([", "])"), ("[(", ")]"), ("((", "))"), ("[", "]"), ("{", "}"), ("(", ")")]
_NODE = re.compile(r'^(\w+)\s*(\(\[|\[\(|\(\(|\[|\{|\()"([^"]*)"(\]\)|\)\]|\)\)|\]|\}|\))$')
_EDGE = re.compile(r'^(\w+)\s*(-->|-\.->)\s*(?:\|"([^"]*)"\|\s*)?(\w+)$')
_SUBGRAPH = re.compile(r'^subgraph\s+(\w+)\s*\["([^"]*)"\]$')


@dataclass(frozen=True)
class Edge:
    """One arrow: ``src -> dst`` with its action ``label`` ("" if none); ``dotted`` for the
    arrows that go back (decode loop, next block, KV write)."""

    src: str
    dst: str
    label: str
    dotted: bool


@dataclass
class Diagram:
    """A parsed Mermaid flowchart.

    Attributes:
        source: the Mermaid text. direction: ``TD``, ``LR``, ...
        nodes: node id -> label (``<br/>`` separates lines).
        subgraphs: subgraph id -> (label, member node ids).
        edges: the arrows in source order (their index is Mermaid's ``linkStyle`` index).
        node_class: node id -> class name (``hidden``, ``moe``, ``token``).
        class_styles / link_styles: ``{"fill": "#3b7dd8", ...}`` per class / per edge index.
    """

    source: str
    direction: str = "TD"
    nodes: dict[str, str] = field(default_factory=dict)
    subgraphs: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    node_class: dict[str, str] = field(default_factory=dict)
    class_styles: dict[str, dict[str, str]] = field(default_factory=dict)
    link_styles: dict[int, dict[str, str]] = field(default_factory=dict)

    def name(self, node_id: str) -> str:
        """The first line of a node's (or subgraph's) label, e.g. ``"MoE router"``.

        Raises:
            KeyError: if ``node_id`` is neither a node nor a subgraph.
        """
        if node_id in self.nodes:
            return self.nodes[node_id].split("<br/>")[0]
        if node_id in self.subgraphs:
            return self.subgraphs[node_id][0]
        raise KeyError(f"{node_id!r} is not a node or subgraph of the diagram")

    def arrow_actions(self) -> list[str]:
        """The labels written on the arrows, in source order (unlabelled arrows skipped)."""
        return [e.label for e in self.edges if e.label]

    def text(self) -> str:
        """The diagram as text, one arrow a line (``token id --lookup--> embedding``)."""
        lines = [f"token-flow diagram ({len(self.nodes)} nodes, {len(self.edges)} arrows; "
                 f"source {DIAGRAM_PATH.name}):"]
        for e in self.edges:
            arrow = f"--{e.label}-->" if e.label else "-->"
            lines.append(f"  {self.name(e.src)} {arrow} {self.name(e.dst)}")
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return f"```mermaid\n{_translated_labels(self.source.strip())}\n```\n"

    def __repr__(self) -> str:
        return self.text()


def _translated_labels(source: str) -> str:
    """Mermaid ``source`` with each quoted label's lines looked up with
    :func:`~tokenflow.viz.lang.tr` (the source itself in English)."""
    def label(m):
        return '"' + "<br/>".join(tr(part) for part in m.group(1).split("<br/>")) + '"'
    return source if language() == "en" else re.sub(r'"([^"\n]*)"', label, source)


def _style(spec: str) -> dict[str, str]:
    return dict(item.split(":", 1) for item in spec.rstrip(";").split(",") if ":" in item)


def _parse_line(d: Diagram, line: str, stack: list[str]) -> bool:
    """Apply one non-empty, non-comment line to ``d``; False if it is not understood."""
    words = line.split(None, 2)
    if m := _NODE.match(line):
        d.nodes[m[1]] = m[3]
        if stack:
            d.subgraphs[stack[-1]][1].append(m[1])
    elif m := _EDGE.match(line):
        d.edges.append(Edge(m[1], m[4], m[3] or "", m[2] == "-.->"))
    elif m := _SUBGRAPH.match(line):
        d.subgraphs[m[1]] = (m[2], [])
        stack.append(m[1])
    elif line == "end" and stack:
        stack.pop()
    elif words[0] == "classDef" and len(words) == 3:
        d.class_styles[words[1]] = _style(words[2])
    elif words[0] == "class" and len(words) == 3:
        d.node_class.update({n: words[2] for n in words[1].split(",")})
    elif words[0] == "linkStyle" and len(words) == 3:
        d.link_styles.update({int(i): _style(words[2]) for i in words[1].split(",")})
    elif words[0] == "style" and len(words) == 3 and words[1] in d.subgraphs:
        pass                                                    # subgraph box colour only
    else:
        return False
    return True


def parse_mermaid(text: str) -> Diagram:
    """Parse the Mermaid flowchart subset of ``data/token_flow.mmd`` (see the module doc).

    Raises:
        ValueError: on a line outside that subset (with its line number), an arrow to an
            undeclared node, a ``class`` of an unknown node, a ``linkStyle`` index past the
            last arrow, or a missing ``flowchart`` header.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    lines = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1)]
    lines = [(i, ln) for i, ln in lines if ln and not ln.startswith("%%")]
    if not lines or not lines[0][1].startswith("flowchart"):
        raise ValueError("text must start with a 'flowchart TD|LR|...' line (after comments)")
    d = Diagram(source=text, direction=(lines[0][1].split() + ["TD"])[1])
    stack: list[str] = []
    for i, line in lines[1:]:
        if not _parse_line(d, line, stack):
            raise ValueError(f"line {i}: not in the supported Mermaid subset: {line!r}")
    known = set(d.nodes)
    bad = [f"{e.src}->{e.dst}" for e in d.edges if not {e.src, e.dst} <= known]
    bad += [f"class of {n}" for n in d.node_class if n not in known]
    bad += [f"linkStyle {i}" for i in d.link_styles if not 0 <= i < len(d.edges)]
    if bad or stack:
        raise ValueError(f"undeclared nodes, bad indices or unclosed subgraph: {bad or stack}")
    return d


def load_diagram(path: str | Path | None = None) -> Diagram:
    """Read and parse the token-flow diagram (default :data:`DIAGRAM_PATH`).

    Raises:
        FileNotFoundError: if ``path`` does not exist. ValueError: as :func:`parse_mermaid`.
    """
    return parse_mermaid(Path(path or DIAGRAM_PATH).read_text(encoding="utf-8"))


def token_flow_diagram() -> Diagram:
    """The figure of chapters 00 and 06: evaluate it as the last line of a cell to draw it
    (JupyterLab and the HTML book draw the Mermaid source; plain-text front ends print
    :meth:`Diagram.text`)."""
    return load_diagram()


def node_of(event: TraceEvent) -> str:
    """The id of the diagram node that performed a trace row (:data:`TRACE_NODE`).

    Raises:
        ValueError: if the event's action has no node in the diagram.
    """
    if event.action not in TRACE_NODE:
        raise ValueError(f"trace action {event.action!r} has no diagram node; known actions: "
                         f"{sorted(TRACE_NODE)}")
    return TRACE_NODE[event.action]


COLOUR_NAMES = {COLORS["hidden"]: "blue", COLORS["moe"]: "yellow", COLORS["token"]: "green"}
"""The book's colour code (:data:`tokenflow.analysis.trace.COLORS`) by hex value -> its name."""


def arrow_actions_table(diagram: Diagram, actions):
    """The arrows that carry the given action labels, as a :class:`tokenflow.viz.Table`: one
    row per action with the names of the boxes it goes from and to (:meth:`Diagram.name`) and
    the colour of its stroke (``linkStyle``) by name (:data:`COLOUR_NAMES`: blue, yellow,
    green), the stroke as written if it is another colour, empty if the arrow has no style.

    Args:
        diagram: a parsed :class:`Diagram` (e.g. :func:`token_flow_diagram`).
        actions: arrow labels, e.g. chapter 0's ``["lookup", ..., "sample"]``.

    Raises:
        ValueError: if an action labels no arrow or more than one.
    """
    from .fmt import Table
    rows = []
    for action in actions:
        hits = [i for i, e in enumerate(diagram.edges) if e.label == action]
        if len(hits) != 1:
            raise ValueError(f"action {action!r} must label exactly one arrow, found {len(hits)}")
        e = diagram.edges[hits[0]]
        stroke = diagram.link_styles.get(hits[0], {}).get("stroke", "")
        rows.append((action, diagram.name(e.src), diagram.name(e.dst),
                     COLOUR_NAMES.get(stroke.lower(), stroke)))
    return Table(rows, ["arrow action", "from", "to", "colour"])


def _layer(where: str) -> str:
    m = re.match(r"layer (\d+)", where)
    return m[1] if m else "-"


def diagram_trace_table(trace: Trace, diagram: Diagram | None = None,
                        layers=None) -> str:
    """``trace`` as a table whose first column is the diagram node of each row (its name as
    drawn), then the layer, the action, the input and output shapes and the bytes
    (:attr:`TraceEvent.nbytes`: the output tensor, or K and V read for ``read KV``,
    K and V written for ``write KV``). Fits in 90 columns for the tiny model.
    ``layers``: show only the rows of these block indices (plus the rows outside blocks).

    Raises:
        ValueError: as :func:`node_of`, for an action with no node.
    """
    d = diagram or load_diagram()
    rows = [tuple(tr(h) for h in ("#", "diagram node", "layer", "action", "in shape",
                                  "out shape", "bytes"))]
    for i, e in enumerate(trace.events):
        if layers is not None and _layer(e.where) not in ("-", *map(str, layers)):
            continue
        rows.append((str(i), tr(d.name(node_of(e))), _layer(e.where), tr(e.action),
                     str(list(e.in_shape)), str(list(e.out_shape)), f"{e.nbytes:,}"))
    widths = [max(display_width(r[c]) for r in rows) for c in range(len(rows[0]))]
    right = {0, 2, 6}
    lines = ["  ".join(pad(cell, w, ">" if c in right else "<")
                       for c, (cell, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@torch.inference_mode()
def trace_decode_step(model, input_ids: torch.Tensor, temperature: float = 0.0,
                      generator: torch.Generator | None = None, keep_tensors: bool = False):
    """Prefill ``input_ids[:, :-1]`` untraced, then trace ONE decode step end to end: the
    last token ``[B,1]`` through embedding, every block (reading the cache) and the LM head,
    then ``sample`` -- the green arrow that produces the next token.

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel`.
        input_ids: ``[B, S]`` int64 with ``S >= 2`` (the prompt; its last token is decoded).
        temperature, generator: as :func:`tokenflow.inference.sampling.sample` (0 = greedy).
        keep_tensors: keep hidden states etc. in the trace (see :class:`Trace`).

    Returns:
        ``(trace, next_ids [B])``.

    Raises:
        ValueError: if ``input_ids`` is not ``[B, S]`` with ``S >= 2``; as the model's forward.
    """
    from tokenflow.inference.generate import decode_step, prefill
    from tokenflow.inference.sampling import is_greedy, sample
    from tokenflow.model.kv_cache import KVCache
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] < 2:
        shape = list(input_ids.shape) if isinstance(input_ids, torch.Tensor) else input_ids
        raise ValueError(f"input_ids must be a [B, S] tensor with S >= 2, got {shape}")
    B, S = input_ids.shape
    cache = KVCache(model.config, B, S, dtype=next(model.parameters()).dtype)
    prefill(model, input_ids[:, :-1], cache)                           # S-1 cached positions
    trace = Trace(keep_tensors=keep_tensors)
    logits = decode_step(model, input_ids[:, -1], cache, trace)          # [B, V]
    nxt = sample(logits, temperature, generator=generator)               # [B]
    trace.record("sample", "sampler", logits, nxt,
                 note="greedy argmax" if is_greedy(temperature) else f"T={temperature}")
    return trace, nxt


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
