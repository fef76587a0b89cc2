"""Chapters 00-02: the tables and kernel-less explorers the chapters show.

Each check compares what is shown with a value computed here from the tensors or written out
by hand (shapes, byte formulas, RMS), not with the helpers' own output.
"""
import math

import matplotlib
import pytest
import torch

from tokenflow import Trace
from tokenflow.viz import (attention_static, hidden_size_static, kv_cache_static,
                               residual_stream_static, residual_stream_table, trace_shapes_static,
                               trace_shapes_table, trace_table)
from helpers import random_model

matplotlib.use("Agg")

TOKENS = ["北京", "是", "中国", "的", "首"]


@pytest.fixture(scope="module")
def traced():
    model = random_model()
    trace = Trace(keep_tensors=True)
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7, 8, 9]]), trace=trace)
    return model, trace


def test_trace_table_has_one_row_per_event_with_its_shapes_and_bytes(traced):
    model, trace = traced
    table = trace_table(trace)
    assert len(table.rows) == len(trace.events)
    for row, e in zip(table.rows, trace.events):
        shapes = [str(list(e.in_shape)), str(list(e.out_shape))]
        assert row[1:6] == [
            e.action,
            e.where,
            *[x.replace(" ", "\u00a0") for x in shapes],
            e.nbytes,
        ]
    lm = trace_table(trace, where=("LM head",), note=False)
    assert len(lm.rows) == 1 and len(lm.headers) == 6
    # [B, S, H] fp32 read by the LM head -> [B, S, V]
    assert lm.rows[0][4] == f"[1,\u00a05,\u00a0{model.config.vocab_size}]"
    assert "project vocab" in lm._repr_html_()


def test_trace_shapes_table_router_sees_b_times_s_tokens():
    cfg = random_model().config
    B, S, E = 3, 4, 4
    table = trace_shapes_table(cfg, B, S, E)
    route = [r for r in table.rows if r[1] == "route top-k"]
    K = min(cfg.num_experts_per_tok, E)
    assert route and route[0][4] == f"[{B * S},\u00a0{K}]"
    assert {r[2] for r in table.rows} <= {
        "embedding",
        "layer 1 attention",
        "layer 1 MoE",
        "LM head",
    }
    assert table.rows[-1][4] == f"[{B},\u00a0{S},\u00a0{cfg.vocab_size}]"


def test_trace_shapes_static_embeds_every_combination():
    cfg = random_model().config
    ex = trace_shapes_static(cfg, batch=(1, 2), seq_len=(3,), experts=(2, 4),
                             default={"B": 2, "S": 3, "E": 4})
    assert len(ex.fragments) == 4
    html = ex._repr_html_()
    # the fragment for B=2, S=3 (indices 1-0-x) shows the lookup [2, 3] -> [2, 3, H]
    assert f"[2,\u00a03,\u00a0{cfg.hidden_size}]" in ex.fragments["1-0-1"]
    assert "4 outputs" in repr(ex) and html.count('class="tf-out"') == 4


def test_residual_stream_table_matches_the_tensors(traced):
    model, trace = traced
    hs = trace.hidden_states
    table = residual_stream_table(hs, 4, TOKENS)
    assert len(table.rows) == len(hs)
    for depth, row in enumerate(table.rows):
        h = hs[depth][0, 4]
        assert row[2] == pytest.approx(float(h[0]))
        assert row[-2] == pytest.approx(math.sqrt(float((h * h).mean())), rel=1e-5)
        if depth:
            d = h - hs[depth - 1][0, 4]
            assert row[-1] == pytest.approx(math.sqrt(float((d * d).mean())), rel=1e-5)
    assert table.rows[0][-1] is None
    with pytest.raises(ValueError, match="token_index"):
        residual_stream_table(hs, 5, TOKENS)


def test_kv_cache_static_shows_the_formula_for_each_setting():
    cfg = random_model().config
    ex = kv_cache_static(cfg, seq_len=(16, 128))
    divisors = [
        d for d in range(1, cfg.num_attention_heads + 1) if cfg.num_attention_heads % d == 0
    ]
    assert len(ex.fragments) == 2 * len(divisors)
    for j, n_kv in enumerate(divisors):
        per_token = 2 * cfg.num_hidden_layers * n_kv * cfg.head_dim * 2          # bf16, by hand
        assert f"{per_token * 128:,} B" in ex.fragments[f"1-{j}"]
    assert ex.default == {"S": 1, "kv_heads": divisors.index(cfg.num_key_value_heads)}


def test_hidden_size_static_tables_scale_with_b_and_s():
    ex = hidden_size_static(64, 100, batch=(1, 2), seq_len=(3, 5))
    # hidden_states_l0 [B, S, H] elements, written out
    for i, B in enumerate((1, 2)):
        for j, S in enumerate((3, 5)):
            assert f"{B * S * 64:,}" in ex.fragments[f"{i}-{j}"]


@pytest.mark.filterwarnings("ignore:Glyph")
def test_figure_explorers_embed_one_image_per_setting(traced):
    model, trace = traced
    open_before = matplotlib.pyplot.get_fignums()
    att = attention_static(trace.attention_weights, TOKENS, TOKENS, default={"layer": 1, "head": 0})
    n = model.config.num_hidden_layers * model.config.num_attention_heads
    assert len(att.fragments) == n
    # PNG, which the book's figure checks measure (tests/test_browser.py FIGURES_JS)
    assert all(f.startswith('<img src="data:image/png;base64,') for f in att.fragments.values())
    res = residual_stream_static(trace.hidden_states, TOKENS)
    assert len(res.fragments) == len(TOKENS) and res.default == {"token": len(TOKENS) - 1}
    assert all(f.startswith('<img src="data:image/png;base64,') for f in res.fragments.values())
    assert matplotlib.pyplot.get_fignums() == open_before  # figures closed, not shown twice


# ---- issue 26 item 15: chapter 06's formatting cells folded into viz helpers
def test_step_bytes_table_weights_add_up_to_the_cost_model(traced):
    """Every param_breakdown part belongs to one diagram node, so the weight column of a traced
    decode step adds up to forward_weight_bytes; the bytes produced are the trace's."""
    from tokenflow import load_pretrained
    from tokenflow.analysis.costmodel import PARTS, forward_weight_bytes
    from tokenflow.viz import WEIGHT_PARTS, step_bytes_table, trace_decode_step
    assert sorted(p for parts in WEIGHT_PARTS.values() for p in parts) == sorted(PARTS)
    model, tok = load_pretrained()
    import torch
    trace, _ = trace_decode_step(model, torch.tensor([tok.encode("北京是中国的首")]))
    table = step_bytes_table(trace, model.config, 4)
    rows = {r[0]: r for r in table.rows}
    assert sum(r[3] for r in rows.values()) == pytest.approx(
        forward_weight_bytes(model.config, new_tokens=1, bytes_per_element=4)["total"])
    assert sum(r[2] for r in rows.values()) == sum(e.nbytes for e in trace.events)
    assert rows["sampling"][3] == 0 and rows["MoE experts"][3] > rows["MoE router"][3]


def test_logit_lens_by_depth_matches_token_rank(traced):
    from tokenflow import load_pretrained
    from tokenflow.analysis.logit_lens import logit_lens, token_rank
    from tokenflow.viz import logit_lens_by_depth
    import torch
    model, tok = load_pretrained()
    lens = logit_lens(model, torch.tensor([tok.encode("北京是中国的首")]))
    du = tok.token_to_id("都")
    table = logit_lens_by_depth(lens, tok, [du])
    assert len(table.rows) == lens.shape[0]
    assert [r[3] for r in table.rows] == [int(token_rank(lens[d, 0, -1], du))
                                         for d in range(lens.shape[0])]
    with pytest.raises(ValueError, match="position"):
        logit_lens_by_depth(lens, tok, [du], position=99)
