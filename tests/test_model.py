"""Shapes, KV cache == recompute, and clear errors for bad input."""
import pytest
import torch

from tokenflow import KVCache, ModelConfig, Trace, preset
from tokenflow.analysis.costmodel import param_count

CONFIGS = [
    dict(),                                                        # tiny: dense first, then MoE
    dict(num_experts=0, num_experts_per_tok=0, num_shared_experts=0),   # dense
    dict(num_key_value_heads=4),                                   # MHA
    dict(num_key_value_heads=1, num_shared_experts=0, first_k_dense_replace=0),  # MQA, all MoE
    dict(num_experts=4, num_experts_per_tok=4, tie_word_embeddings=True),  # K == E, tied head
    dict(scoring_func="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5),
]


@pytest.mark.parametrize("overrides", CONFIGS)
@pytest.mark.parametrize("B,S", [(1, 1), (2, 7), (3, 16)])
def test_output_shapes(make_model, overrides, B, S):
    model = make_model(**overrides)
    ids = torch.randint(0, model.config.vocab_size, (B, S))
    logits = model(ids)
    assert logits.shape == (B, S, model.config.vocab_size)
    assert torch.isfinite(logits).all()
    assert model(ids, logits_to_keep=1).shape == (B, 1, model.config.vocab_size)


@pytest.mark.parametrize("overrides", CONFIGS)
def test_param_count_formula_matches_model(make_model, overrides):
    model = make_model(**overrides)
    assert param_count(model.config) == model.num_parameters()


@pytest.mark.parametrize("overrides", CONFIGS)
@pytest.mark.parametrize("B,prompt,steps", [(1, 5, 6), (2, 9, 4), (4, 1, 8)])
def test_prefill_then_decode_equals_full_recompute(make_model, overrides, B, prompt, steps):
    model = make_model(**overrides)
    ids = torch.randint(0, model.config.vocab_size, (B, prompt + steps))
    with torch.no_grad():
        full = model(ids)                                         # [B, S, V]
        cache = KVCache(model.config, B, prompt + steps)
        got = [model(ids[:, :prompt], kv_cache=cache)]
        for t in range(prompt, prompt + steps):
            got.append(model(ids[:, t:t + 1], kv_cache=cache))
        got = torch.cat(got, dim=1)
    assert cache.length == prompt + steps
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-4)


def test_trace_records_the_arrow_actions(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode("北京是中国的首")])
    trace = Trace()
    model(ids, kv_cache=KVCache(model.config, 1, 16), trace=trace)
    actions = trace.actions()
    assert actions[0] == "lookup" and actions[-1] == "project vocab"
    assert trace.events[0].in_shape == (1, 5)
    assert trace.events[0].out_shape == (1, 5, model.config.hidden_size)
    assert trace.events[-1].out_shape == (1, 5, model.config.vocab_size)
    n_layers = model.config.num_hidden_layers
    assert actions.count("read KV") == n_layers and actions.count("write KV") == n_layers
    assert actions.count("route top-k") == sum(layer.is_moe for layer in model.layers)
    assert "route top-k" in repr(trace) and f"{len(trace.events)} events" in repr(trace)
    from tokenflow.viz import trace_table          # the table form lives in viz
    text = str(trace_table(trace))
    assert "route top-k" in text and "[1,\u00a05]" in text


def test_trace_keep_tensors_matches_plain_forward(make_model):
    model = make_model()
    ids = torch.randint(0, model.config.vocab_size, (2, 6))
    t = Trace(keep_tensors=True)
    with torch.no_grad():
        a, b = model(ids), model(ids, trace=t)                     # explicit softmax path
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert len(t.hidden_states) == model.config.num_hidden_layers + 1
    w = t.attention_weights[0]
    assert w.shape == (2, model.config.num_attention_heads, 6, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    assert (w.triu(diagonal=1) == 0).all()                       # causal


# ------------------------------------------------------------------ errors
def test_token_id_out_of_range(make_model):
    model = make_model()
    V = model.config.vocab_size
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, vocab_size"):
        model(torch.tensor([[1, V]]))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[-1, 2]]))


def test_input_ids_type_and_shape(make_model):
    model = make_model()
    with pytest.raises(TypeError, match="input_ids"):
        model(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"shape \[B, S\]"):
        model(torch.tensor([1, 2]))


def test_sequence_longer_than_max_positions(make_model):
    model = make_model()
    n = model.config.max_position_embeddings + 1
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, n, dtype=torch.long))


def test_sequence_longer_than_cache(make_model):
    model = make_model()
    cache = KVCache(model.config, 1, max_len=4)
    model(torch.zeros(1, 3, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="max_len=4"):
        model(torch.zeros(1, 2, dtype=torch.long), kv_cache=cache)


def test_cache_batch_mismatch(make_model):
    model = make_model()
    with pytest.raises(ValueError, match="batch size"):
        model(torch.zeros(2, 3, dtype=torch.long), kv_cache=KVCache(model.config, 1, 8))


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_experts=4, num_experts_per_tok=5), "num_experts_per_tok must be in"),
    (dict(hidden_size=66, num_attention_heads=4), "hidden_size .* divisible"),
    (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads"),
    (dict(vocab_size=0), "vocab_size must be >= 1"),
    (dict(scoring_func="relu"), "scoring_func"),
    (dict(n_group=3), "n_group"),
])
def test_bad_config(kwargs, match):
    base = dict(vocab_size=64, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ModelConfig(**base)


def test_config_type_error():
    with pytest.raises(TypeError, match="num_hidden_layers must be an int"):
        ModelConfig(num_hidden_layers=2.0)


def test_kv_cache_capacity_limit():
    cfg = preset("tiny")
    with pytest.raises(ValueError, match="max_len must be in"):
        KVCache(cfg, 1, cfg.max_position_embeddings + 1)
    with pytest.raises(ValueError, match="batch_size"):
        KVCache(cfg, 0, 8)


def test_config_roundtrip():
    cfg = preset("tiny")
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(TypeError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({**cfg.to_dict(), "n_embd": 3})


@pytest.mark.parametrize("mask,match", [
    ([[1, 1, 1, 0, 0]], "left padding only"),                  # right padding
    ([[0, 1, 0, 1, 1]], "left padding only"),                  # a hole
    ([[0, 0, 0, 0, 0]], "no real token"),
    ([[0, 2, 1, 1, 1]], "0 .* or 1"),
])
def test_bad_attention_mask_is_rejected(make_model, mask, match):
    model = make_model()
    with pytest.raises(ValueError, match=match):
        model(torch.ones(1, 5, dtype=torch.long), attention_mask=torch.tensor(mask))


def test_float_attention_mask_is_rejected(make_model):
    model = make_model()
    with pytest.raises(TypeError, match="attention_mask"):
        model(torch.ones(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 3))


def test_padding_after_cached_real_tokens_is_rejected(make_model):
    model = make_model()
    cache = KVCache(model.config, 1, 8)
    model(torch.ones(1, 3, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="already has real tokens"):
        model(torch.ones(1, 2, dtype=torch.long), kv_cache=cache,
              attention_mask=torch.tensor([[0, 1]]))


def test_pad_counts_chinese_as_two_columns():
    from tokenflow.viz.fmt import display_width, pad
    assert display_width("北京") == 4 and display_width("ab") == 2
    assert pad("都", 4) + "|" == "都  |" and pad("x", 3, ">") == "  x"
    with pytest.raises(ValueError, match="align"):
        pad("x", 3, "^")


def test_trace_shapes_follow_batch_seq_and_experts():
    from tokenflow.analysis.trace import trace_shapes
    cfg = preset("tiny")
    t = trace_shapes(cfg, 3, 7, num_experts=16)
    route = next(e for e in t.events if e.action == "route top-k")
    assert t.events[0].out_shape == (3, 7, cfg.hidden_size)
    assert route.out_shape == (21, cfg.num_experts_per_tok) and "of 16 experts" in route.note
    assert t.events[-1].out_shape == (3, 7, cfg.vocab_size)
    with pytest.raises(ValueError, match="seq_len"):
        trace_shapes(cfg, 1, cfg.max_position_embeddings + 1)
    with pytest.raises(ValueError, match="num_experts"):
        trace_shapes(cfg, 1, 4, num_experts=0)
