"""Chapter 1: tokenizer split, embedding lookup, the hidden state and its sizes."""
import math

import matplotlib
import pytest
import torch

from tokenflow import KVCache, Trace
from tokenflow.analysis.costmodel import reference_config, reference_models
from tokenflow.viz import hidden_state_heatmap, residual_stream_plot
from tokenflow.viz import (hidden_size_explorer, hidden_state_sizes, residual_stream_explorer,
                               residual_stream_summary, size_table, tensor_table)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PROMPT = "北京是中国的首"
TEXTS = ["北京是中国的首", "东京是日本的", "巴黎"]


# ------------------------------------------------------------------ tokenizer
def test_tokenizer_split_and_ids(pretrained):
    _, tok = pretrained
    ids = tok.encode(PROMPT)
    assert tok.tokens(PROMPT) == ["北京", "是", "中国", "的", "首"]
    assert [tok.id_to_token(i) for i in ids] == tok.tokens(PROMPT)
    assert tok.decode(ids) == PROMPT
    assert all(0 <= i < tok.vocab_size for i in ids)


ROUND_TRIP = ["a\nb", "北京🙂", "", " ", "\t\r\n", "  two  spaces  ", "Ω≈ç√ 𝄞 ﬁ",
              "北京是中国的首都。\n东京是日本的首都。", "é (composed) vs e\u0301 (combining)",
              "\x00\x01 control", "龘 a rare character", "😀👍🏽🇨🇳", "\ufeffBOM"]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_byte_level_round_trip(pretrained, text):
    """Every string survives encode -> decode exactly (newlines, emoji, unseen characters)."""
    _, tok = pretrained
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_unseen_character_becomes_its_bytes(pretrained):
    _, tok = pretrained
    ids = tok.encode("🙂")                                  # U+1F642, 4 UTF-8 bytes
    assert [tok.token_bytes(i) for i in ids] == [bytes([b]) for b in "🙂".encode("utf-8")]
    assert tok.tokens("🙂") == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    assert [tok.token_to_id(t) for t in tok.tokens("🙂")] == ids


def test_every_token_text_maps_back_to_its_id(pretrained):
    _, tok = pretrained
    for i in range(tok.vocab_size):
        assert tok.token_to_id(tok.id_to_token(i)) == i
    assert tok.vocab_size >= 4 + 256
    with pytest.raises(KeyError):
        tok.token_to_id("北京是中国的首都")                   # not one token
    with pytest.raises(TypeError):
        tok.token_to_id(3)
    with pytest.raises(TypeError):
        tok.id_to_token("3")
    with pytest.raises(ValueError, match="vocab_size"):
        tok.id_to_token(tok.vocab_size)


def test_byte_table_is_gpt2s():
    """Our printable-byte table is the one ``tokenizers``' ByteLevel pre-tokenizer uses."""
    from tokenizers import pre_tokenizers
    from tokenflow.tokenizer import bytes_to_unicode
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


def test_batch_encode_left_pads(pretrained):
    _, tok = pretrained
    ids, mask = tok.batch_encode(TEXTS)
    lengths = [len(tok.encode(t)) for t in TEXTS]
    assert ids.shape == mask.shape == (len(TEXTS), max(lengths))
    for b, n in enumerate(lengths):
        pad = ids.shape[1] - n
        assert mask[b].tolist() == [0] * pad + [1] * n
        assert ids[b, :pad].tolist() == [tok.pad_token_id] * pad
        assert ids[b, pad:].tolist() == tok.encode(TEXTS[b])
    with pytest.raises(ValueError, match="texts"):
        tok.batch_encode([])


# ------------------------------------------------------------------ embedding lookup
@pytest.mark.parametrize("B,S", [(1, 5), (3, 7), (8, 1)])
def test_embedding_is_a_row_lookup(make_model, B, S):
    """The hidden state our forward pass starts from (trace.hidden_states[0]) is row ids[b,s]
    of the embedding table, for every position."""
    model = make_model()
    W = model.embed_tokens.weight                                    # [V, H]
    ids = torch.randint(0, model.config.vocab_size, (B, S))
    trace = Trace(keep_tensors=True)
    with torch.no_grad():
        model(ids, trace=trace)
    h0 = trace.hidden_states[0]                                       # [B, S, H]
    assert h0.shape == (B, S, model.config.hidden_size)
    for b in range(B):
        for s in range(S):
            assert torch.equal(h0[b, s], W[ids[b, s]])
    # the same thing as a one-hot row selection (a matrix product), up to rounding
    one_hot = torch.nn.functional.one_hot(ids, model.config.vocab_size).float()
    torch.testing.assert_close(h0, one_hot @ W.detach(), atol=1e-6, rtol=0)


def test_trace_hidden_states_are_the_residual_stream(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)])
    trace = Trace(keep_tensors=True)
    with torch.no_grad():
        logits = model(ids, trace=trace)
        hs = trace.hidden_states
        assert len(hs) == model.config.num_hidden_layers + 1
        assert all(h.shape == (1, ids.shape[1], model.config.hidden_size) for h in hs)
        assert torch.equal(hs[0][0], model.embed_tokens.weight[ids[0]])   # layer 0 = lookup
        # the last entry is what the final norm and the LM head turn into logits
        torch.testing.assert_close(model.lm_head(model.norm(hs[-1])), logits,
                                   atol=1e-5, rtol=0)
    # each block changes the hidden state of the last token
    for a, b in zip(hs[:-1], hs[1:]):
        assert (a[0, -1] - b[0, -1]).abs().max() > 1e-3


def test_prefill_and_decode_shapes(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)] * 2)
    B, S, H = ids.shape[0], ids.shape[1], model.config.hidden_size
    cache = KVCache(model.config, B, S + 1)
    pre, dec = Trace(keep_tensors=True), Trace(keep_tensors=True)
    with torch.no_grad():
        logits = model(ids, kv_cache=cache, trace=pre)
        model(logits[:, -1].argmax(-1, keepdim=True), kv_cache=cache, trace=dec)
    assert pre.events[0].action == "lookup"
    assert pre.events[0].in_shape == (B, S) and pre.events[0].out_shape == (B, S, H)
    assert dec.events[0].in_shape == (B, 1) and dec.events[0].out_shape == (B, 1, H)
    assert all(h.shape == (B, 1, H) for h in dec.hidden_states)


def test_left_padded_hidden_states_equal_unpadded(pretrained):
    model, tok = pretrained
    ids, mask = tok.batch_encode(TEXTS)
    trace = Trace(keep_tensors=True)
    with torch.no_grad():
        model(ids, kv_cache=KVCache(model.config, len(TEXTS), ids.shape[1]),
              attention_mask=mask, trace=trace)
        for b, text in enumerate(TEXTS):
            alone = Trace(keep_tensors=True)
            model(torch.tensor([tok.encode(text)]), trace=alone)
            n = alone.hidden_states[0].shape[1]
            for got, want in zip(trace.hidden_states, alone.hidden_states):
                torch.testing.assert_close(got[b, -n:], want[0], atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------ sizes at real scale
def test_hidden_state_sizes_seed_numbers():
    B, S, H, V = 8, 4096, 12288, 129280                             # the seed's illustration
    rows = {r["name"]: r for r in hidden_state_sizes(B, S, H, V)}
    assert rows["input_ids"]["shape"] == [B, S]
    assert rows["input_ids"]["int64"] == B * S * 8
    assert rows["embedding_table"]["shape"] == [V, H]
    assert rows["hidden_states_l0"]["shape"] == [B, S, H]
    assert rows["decode hidden"]["shape"] == [B, 1, H]
    for name, shape in (("embedding_table", (V, H)), ("hidden_states_l0", (B, S, H)),
                        ("decode hidden", (B, 1, H))):
        n = math.prod(shape)
        assert rows[name]["elements"] == n
        assert rows[name]["bf16"] == 2 * n and rows[name]["fp32"] == 4 * n
    assert rows["hidden_states_l0"]["bf16"] == 768 * 2**20           # 768 MiB
    assert not any(isinstance(v, torch.Tensor) for r in rows.values() for v in r.values())
    table = size_table(list(rows.values()))
    text, html = str(table), table._repr_html_()
    for shown in (text, html):
        assert "[8, 4096, 12288]" in shown and f"{B * S * H:,}" in shown and "768.00 MiB" in shown


def test_deepseek_v3_embedding_is_the_published_0_9B():
    cfg = reference_config("DeepSeek-V3")
    raw = reference_models()["DeepSeek-V3"]["config"]
    assert (cfg.vocab_size, cfg.hidden_size) == (raw["vocab_size"], raw["hidden_size"])
    rows = {r["name"]: r for r in hidden_state_sizes(1, 1, cfg.hidden_size, cfg.vocab_size)}
    # README_WEIGHTS.md of DeepSeek-V3: "0.9B for Embedding"
    assert round(rows["embedding_table"]["elements"] / 1e9, 1) == 0.9


@pytest.mark.parametrize("kwargs,name", [
    (dict(batch_size=0, seq_len=1, hidden_size=4, vocab_size=8), "batch_size"),
    (dict(batch_size=1, seq_len=-2, hidden_size=4, vocab_size=8), "seq_len"),
    (dict(batch_size=1, seq_len=1, hidden_size=2.5, vocab_size=8), "hidden_size"),
    (dict(batch_size=1, seq_len=1, hidden_size=4, vocab_size=True), "vocab_size"),
])
def test_hidden_state_sizes_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        hidden_state_sizes(**kwargs)


# ------------------------------------------------------------------ summaries, plots, widgets
def test_residual_stream_summary_numbers(traced_prompt):
    model, tok, tokens, trace = traced_prompt
    hs = trace.hidden_states
    text = residual_stream_summary(hs, 4, tokens, 2)
    h, prev = hs[2][0, 4], hs[1][0, 4]
    assert f"RMS {torch.sqrt(torch.mean(h * h)).item():.4f}" in text
    assert f"RMS {torch.sqrt(torch.mean((h - prev) ** 2)).item():.4f}" in text
    assert f"{h[0].item():.4f}" in text and "'首'" in text
    with pytest.raises(ValueError, match="layer"):
        residual_stream_summary(hs, 4, tokens, len(hs))
    with pytest.raises(ValueError, match="token_index"):
        residual_stream_summary(hs, 5, tokens, 0)


@pytest.mark.filterwarnings("ignore:Glyph")
def test_plots_and_widgets_build(traced_prompt):
    model, tok, tokens, trace = traced_prompt
    fig = hidden_state_heatmap(trace.hidden_states[0][0], tokens)
    assert fig.axes[0].get_images()[0].get_array().shape == (5, model.config.hidden_size)
    fig2 = residual_stream_plot(trace.hidden_states, 4, tokens, layer=1)
    assert len(fig2.axes) == 2
    with pytest.raises(ValueError, match="row_labels"):
        hidden_state_heatmap(trace.hidden_states[0][0], tokens[:2])
    with pytest.raises(ValueError, match="hidden"):
        hidden_state_heatmap(trace.hidden_states[0], tokens)
    with pytest.raises(ValueError, match="token_index"):
        residual_stream_plot(trace.hidden_states, 9, tokens)
    plt.close("all")
    w = hidden_size_explorer(64, 512)
    assert [c.description for c in w.children[:2]] == ["B", "S"]
    w2 = residual_stream_explorer(trace.hidden_states, tokens)
    assert len(w2.children[0].options) == len(tokens)
    plt.close("all")


def test_tensor_table_rounds_and_labels():
    t = torch.tensor([[0.123456, -0.00001, 2.0], [1.5, -1.23456, 0.0]])
    table = tensor_table(t, ["北京", "b"], ["x", "y", "z"], max_cols=2)
    lines = str(table).splitlines()        # title, header, rule, rows
    assert "1 more columns" in lines[0]
    assert lines[1].split() == ["x", "y", "..."]
    assert lines[3].split() == ["北京", "0.1235", "0.0000", "..."]          # no "-0.0000"
    assert lines[4].split() == ["b", "1.5000", "-1.2346", "..."]
    assert "<td style=\"text-align:right\">-1.2346</td>" in table._repr_html_()
    assert str(tensor_table(t, ["a", "b"], decimals=1)).splitlines()[2].split() == [
        "a",
        "0.1",
        "0.0",
        "2.0",
    ]
    with pytest.raises(ValueError, match="row_labels"):
        tensor_table(t, ["a"])
    with pytest.raises(ValueError, match="t must be a 2-D"):
        tensor_table(t[0], ["a"])


# ---- found by planting bugs (R1 review): each test names a neighbour the suite missed
def test_decode_drops_special_tokens(pretrained):
    _, tok = pretrained
    ids = [tok.bos_token_id] + tok.encode("北京") + [tok.eos_token_id, tok.pad_token_id]
    assert tok.decode(ids) == "北京"
    assert tok.decode(torch.tensor(ids)) == "北京"
