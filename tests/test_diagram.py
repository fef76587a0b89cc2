"""The token-flow diagram (chapters 00 and 06): one Mermaid source, data/token_flow.mmd.

Checks it against the seed note (its arrow actions and its line of steps, quoted below), the
book's colour code, the trace's own colour groups, and that every trace row of one decode
step, in the library and in chapter 06's stored output, names a node the diagram draws.
"""
import json
from collections import deque
from pathlib import Path

import pytest
import torch

from tokenflow import COLORS, TokenFlowModel, preset
from tokenflow.viz.diagram import (DIAGRAM_PATH, TRACE_NODE, diagram_trace_table, load_diagram,
                               node_of, parse_mermaid, token_flow_diagram, trace_decode_step)
from tokenflow.analysis.trace import TraceEvent

ROOT = Path(__file__).resolve().parents[1]
# Seed, section 1: "底部 Arrow actions 把关键箭头动作单独列出来：lookup、[B,S] -> [B,S,H]、
# read KV、route top-k、project vocab 和 sample。"
SEED_ARROW_ACTIONS = ["lookup", "[B,S] -> [B,S,H]", "read KV", "route top-k", "project vocab",
                      "sample"]
# Seed, sections 1 and 7: token id -> embedding -> hidden state -> Attention / KV cache ->
# FFN or MoE -> final hidden state -> LM Head -> vocab logits -> Sampling -> next token id,
# with the FFN-type branch: Dense FFN, or MoE router -> Dispatch / Expert compute / Combine.
SEED_LINE = ["token_id", "embedding", "hidden", "attention", "ffn_type", "updated", "final",
             "lm_head", "logits", "sampling", "next_token"]
MOE_PATH = ["ffn_type", "router", "dispatch", "expert_compute", "combine", "updated"]


@pytest.fixture(scope="module")
def diagram():
    return load_diagram()


def _reachable(d, a, b) -> bool:
    seen, todo = {a}, deque([a])
    while todo:
        n = todo.popleft()
        if n == b:
            return True
        for e in d.edges:
            if e.src == n and e.dst not in seen:
                seen.add(e.dst)
                todo.append(e.dst)
    return False


def test_diagram_lists_every_arrow_action_of_the_seed(diagram):
    missing = [a for a in SEED_ARROW_ACTIONS if a not in diagram.arrow_actions()]
    assert not missing, f"arrow actions of the seed missing from {DIAGRAM_PATH.name}: {missing}"


def test_diagram_follows_the_seed_line_and_branch(diagram):
    for a, b in zip(SEED_LINE, SEED_LINE[1:]):
        assert _reachable(diagram, a, b), f"no path {a} -> {b}"
    arrows = {(e.src, e.dst) for e in diagram.edges}
    assert {("ffn_type", "dense_ffn"), ("dense_ffn", "updated")} <= arrows
    assert set(zip(MOE_PATH, MOE_PATH[1:])) <= arrows, "MoE branch router->dispatch->...->combine"
    assert ("next_token", "token_id") in arrows, "the decode loop feeds the new token back"
    assert ("kv_cache", "attention") in arrows, "attention reads the KV cache"


def test_colour_roles_follow_the_book_code(diagram):
    fills = {cls: style["fill"] for cls, style in diagram.class_styles.items()}
    assert fills == COLORS
    assert set(diagram.node_class) == set(diagram.nodes), "every node has a colour class"
    moe = {n for n, c in diagram.node_class.items() if c == "moe"}
    assert moe == {"router", "dispatch", "expert_compute", "combine"}
    assert {"sampling", "next_token"} <= {n for n, c in diagram.node_class.items() if c == "token"}
    # arrows: yellow if they touch an MoE node, green between two token nodes, else blue
    for i, e in enumerate(diagram.edges):
        classes = {diagram.node_class[e.src], diagram.node_class[e.dst]}
        want = "moe" if "moe" in classes else "token" if classes == {"token"} else "hidden"
        assert diagram.link_styles[i]["stroke"] == COLORS[want], f"arrow {i} {e.src}->{e.dst}"


def test_trace_actions_sit_on_nodes_of_their_colour(diagram):
    for action, node in TRACE_NODE.items():
        group = TraceEvent(action, "", (), ()).color                 # trace.py's own grouping
        members = diagram.subgraphs[node][1] if node in diagram.subgraphs else [node]
        want = "token" if action == "sample" else group
        assert {diagram.node_class[m] for m in members} == {want}, action


def test_one_decode_step_has_a_row_for_every_claimed_node(diagram):
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny")).eval()
    c = model.config
    B, S = 2, 6
    ids = torch.randint(0, c.vocab_size, (B, S))
    trace, nxt = trace_decode_step(model, ids)
    nodes = [node_of(e) for e in trace.events]
    assert set(nodes) == set(TRACE_NODE.values())
    assert all(n in diagram.nodes or n in diagram.subgraphs for n in nodes)
    ev = {e.action: e for e in trace.events}
    assert ev["lookup"].in_shape == (B, 1) and ev["lookup"].out_shape == (B, 1, c.hidden_size)
    assert ev["project vocab"].out_shape == (B, 1, c.vocab_size)
    assert ev["sample"].out_shape == (B,) and nxt.shape == (B,)
    # read KV: K and V of all S positions (S-1 cached + the new one), fp32, every layer
    reads = [e for e in trace.events if e.action == "read KV"]
    assert len(reads) == c.num_hidden_layers
    assert all(e.nbytes == 2 * B * c.num_key_value_heads * S * c.head_dim * 4 for e in reads)
    table = diagram_trace_table(trace, diagram)
    assert all(diagram.name(n) in table for n in set(nodes))


def test_chapter06_stored_trace_names_every_claimed_node(diagram):
    nb = json.loads((ROOT / "notebooks" / "06_big_picture.ipynb").read_text(encoding="utf-8"))
    texts = ["".join(o.get("text", "")) for cell in nb["cells"] if cell["cell_type"] == "code"
             for o in cell.get("outputs", []) if o.get("output_type") == "stream"]
    tables = [t for t in texts if "diagram node" in t and "project vocab" in t and "sample" in t]
    assert tables, "chapter 06 prints no decode-step trace table"
    rows = [line for line in tables[0].splitlines()[2:] if line.strip()]
    named = {diagram.name(n) for n in TRACE_NODE.values()}
    missing = [name for name in named if not any(f"  {name}  " in r for r in rows)]
    assert not missing, f"chapter 06's trace has no row for {missing}"


@pytest.mark.parametrize("chapter", ["00_token_flow", "06_big_picture"])
def test_both_chapters_show_the_diagram_from_the_one_source(chapter):
    nb = json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    shown = ["".join(o["data"]["text/markdown"]) for cell in nb["cells"]
             if cell["cell_type"] == "code" for o in cell.get("outputs", [])
             if "text/markdown" in o.get("data", {})]
    assert token_flow_diagram()._repr_markdown_() in shown, (
        f"{chapter}: stored diagram differs from {DIAGRAM_PATH.name}; re-execute the notebook")


def test_markdown_repr_is_a_mermaid_fence_of_the_file():
    md = token_flow_diagram()._repr_markdown_()
    assert md.startswith("```mermaid\n") and md.rstrip().endswith("```")
    assert DIAGRAM_PATH.read_text(encoding="utf-8").strip() in md


def test_parser_rejects_what_it_does_not_understand():
    with pytest.raises(ValueError, match="flowchart"):
        parse_mermaid("graph TD\n  a --> b")
    with pytest.raises(ValueError, match="line 3"):
        parse_mermaid('flowchart TD\n  a["A"]\n  a ==> a')
    with pytest.raises(ValueError, match="undeclared"):
        parse_mermaid('flowchart TD\n  a["A"]\n  a --> b')
    with pytest.raises(ValueError, match="action"):
        node_of(TraceEvent("teleport", "", (), ()))
    with pytest.raises(ValueError, match="S >= 2"):
        trace_decode_step(None, torch.tensor([[1]]))


def test_arrow_actions_are_what_the_trace_records_on_an_arrow(diagram):
    """ARROW_ACTIONS is the trace's word for them: every one labels exactly one arrow and a
    traced decode step records each; the trace's other actions label no arrow; chapters 0 and
    6 name exactly these (six), and chapter 6's table lists them."""
    import re
    from tokenflow.explain.trace import ARROW_ACTIONS
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny")).eval()
    trace, _ = trace_decode_step(model, torch.randint(0, model.config.vocab_size, (1, 5)))
    recorded = {e.action for e in trace.events}
    labels = [e.label for e in diagram.edges]
    assert set(ARROW_ACTIONS) <= recorded
    assert all(labels.count(a) == 1 for a in ARROW_ACTIONS)
    assert not [a for a in recorded - set(ARROW_ACTIONS) if a in labels]
    assert len(ARROW_ACTIONS) == 6
    ch0 = json.loads((ROOT / "notebooks" / "00_token_flow.ipynb").read_text(encoding="utf-8"))
    prose = " ".join("".join(c["source"]) for c in ch0["cells"] if c["cell_type"] == "markdown")
    listed = re.search(r"Six words on the arrows of the diagram below \(([^;]*);", prose)
    assert listed and [w.strip() for w in re.sub(r"\s+", " ", listed[1]).split(",")] == \
        list(ARROW_ACTIONS)
    ch6 = (ROOT / "notebooks" / "06_big_picture.ipynb").read_text(encoding="utf-8")
    assert "all 6 arrow actions" in ch6 or "all six arrow actions" in ch6
