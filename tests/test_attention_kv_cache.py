"""Chapter 2: attention reads the KV cache; the cache's size; cached == recomputed;
the causal mask when the query is shorter than the keys (decode, chunked prefill)."""
import math

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from tokenflow import KVCache, TokenFlowModel, Trace, decode_step, prefill
from tokenflow.model.kv_cache import attention_mask_for
from tokenflow.explain.attention import attention_steps, trace_attention_step
from tokenflow.model.config import preset
from tokenflow.model.kv_cache import CacheStep
from tokenflow.analysis.costmodel import (kv_cache_bytes_per_token, mla_kv_cache_bytes_per_token,
                                 reference_config, reference_models)
from tokenflow.viz.fmt import format_bytes
from tokenflow.analysis.attention_kinds import kv_cache_size
from tokenflow.viz import (attention_context_plot, attention_head_heatmap,
                             kv_cache_growth_plot, shape_flow)
from tokenflow.viz import attention_explorer, kv_cache_explorer, kv_cache_summary
from helpers import random_model

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PROMPT = "北京是中国的首"
ATTN_CONFIGS = [dict(), dict(num_key_value_heads=4), dict(num_key_value_heads=1),
                dict(num_experts=0, num_experts_per_tok=0, num_shared_experts=0)]


def _expected_kv_bytes(cfg, itemsize, tokens):
    """K and V, every layer, every KV head, D numbers each (written out, not the library)."""
    per_layer_per_token = cfg.num_key_value_heads * cfg.head_dim * itemsize
    return 2 * cfg.num_hidden_layers * per_layer_per_token * tokens


def _ragged(vocab, lengths, seed=0):
    """Left-padded ids [B,S] and mask for prompts of the given lengths (pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.zeros(len(lengths), S, dtype=torch.long)
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    prompts = []
    for b, n in enumerate(lengths):
        p = torch.randint(3, vocab, (n,), generator=g)
        prompts.append(p)
        ids[b, S - n:], mask[b, S - n:] = p, 1
    return ids, mask, prompts


# ------------------------------------------------------------------ attention step by step
def _layer_inputs(model, B, S, past, seed=0):
    """Random normalised inputs for layer 0, with ``past`` tokens already in a cache."""
    torch.manual_seed(seed)
    cfg = model.config
    cache = KVCache(cfg, B, past + S)
    attn = model.layers[0].self_attn
    if past:
        x0 = torch.randn(B, past, cfg.hidden_size)
        step = cache.begin_step(torch.ones(B, past, dtype=torch.long), B, past)
        cos, sin = model.rotary(step.positions)
        attn(x0, cos, sin, step, cache)
    x = torch.randn(B, S, cfg.hidden_size)
    step = cache.begin_step(torch.ones(B, S, dtype=torch.long), B, S)
    cos, sin = model.rotary(step.positions)
    return attn, x, cos, sin, step, cache


@pytest.mark.parametrize("overrides", ATTN_CONFIGS)
@pytest.mark.parametrize("B,S,past", [(1, 1, 5), (2, 3, 4), (3, 6, 0)])
def test_attention_steps_equal_the_module(make_model, overrides, B, S, past):
    model = make_model(**overrides)
    attn, x, cos, sin, step, cache = _layer_inputs(model, B, S, past)
    mask, start = step.mask, step.start
    before = cache.k[0].clone()
    with torch.no_grad():
        steps = attention_steps(attn, x, cos, sin, mask, cache, start)
        assert torch.equal(cache.k[0], before)                  # steps do not write the cache
        want = attn(x, cos, sin, step, cache)                   # the module does
    torch.testing.assert_close(steps["out"], want, atol=1e-6, rtol=1e-5)
    nh, nkv, D = attn.n_heads, attn.n_kv, attn.head_dim
    L = start + S
    assert steps["q_proj"].shape == (B, S, nh, D)
    assert steps["k_past"].shape == (B, nkv, start, D)
    assert steps["k"].shape == steps["v"].shape == (B, nkv, L, D)
    assert steps["weights"].shape == (B, nh, S, L)
    assert steps["out"].shape == x.shape
    # K/V read back from the cache are the ones the module stored
    torch.testing.assert_close(steps["k"], cache.k[0][:, :, :L], atol=0, rtol=0)
    # an independent attention implementation (PyTorch SDPA with GQA) gives the same heads
    ref = F.scaled_dot_product_attention(steps["q"], steps["k"], steps["v"],
                                         attn_mask=mask, enable_gqa=nkv != nh)
    torch.testing.assert_close(steps["heads"], ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(steps["weights"].sum(-1), torch.ones(B, nh, S),
                               atol=1e-6, rtol=0)
    assert (steps["weights"][~mask.expand_as(steps["weights"])] == 0).all()


def test_attention_steps_bad_input(make_model):
    model = make_model()
    attn, x, cos, sin, step, cache = _layer_inputs(model, 1, 1, 3)
    mask, start = step.mask, step.start
    with pytest.raises(ValueError, match="x must have shape"):
        attention_steps(attn, x[..., :5], cos, sin, mask, cache, start)
    with pytest.raises(ValueError, match="mask must have shape"):
        attention_steps(attn, x, cos, sin, mask[..., :-1], cache, start)
    with pytest.raises(ValueError, match="start must be 0 without a kv_cache"):
        attention_steps(attn, x, cos, sin, mask, None, start)
    with pytest.raises(ValueError, match="start must be >= 0"):
        attention_steps(attn, x, cos, sin, mask, cache, -1)


def test_trace_attention_step_is_one_real_decode_step(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)])                      # [1, 5]
    S = ids.shape[1]
    full_trace = Trace(keep_tensors=True)
    with torch.no_grad():
        full = model(ids, trace=full_trace)                       # recompute everything
    for layer in range(model.config.num_hidden_layers):
        cache = KVCache(model.config, 1, S)
        prefill(model, ids[:, :-1], cache)
        k_before = cache.k[layer][:, :, :S - 1].clone()
        seen = {}
        hook = model.layers[layer].post_attention_layernorm.register_forward_pre_hook(
            lambda mod, args: seen.setdefault("h_after_attn", args[0].detach().clone()))
        try:
            logits, st = trace_attention_step(model, ids[:, -1:], cache, layer)
        finally:
            hook.remove()
        assert cache.length == S
        torch.testing.assert_close(logits[:, -1], full[:, -1], atol=1e-5, rtol=1e-4)
        assert torch.equal(st["k_past"], k_before)                # read from the cache
        assert int(st["start"]) == S - 1
        torch.testing.assert_close(st["hidden_in"][:, -1],
                                   full_trace.hidden_states[layer][:, -1], atol=1e-5, rtol=0)
        torch.testing.assert_close(st["weights"][:, :, -1],
                                   full_trace.attention_weights[layer][:, :, -1],
                                   atol=1e-6, rtol=0)
        assert st["hidden_out"].shape == st["hidden_in"].shape == (1, 1, model.config.hidden_size)
        # hidden_out is the residual stream the real block carried on with after attention
        # (captured from the model's own forward, at the input of post_attention_layernorm)
        torch.testing.assert_close(st["hidden_out"], seen["h_after_attn"], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="layer_idx"):
        trace_attention_step(model, ids[:, -1:], KVCache(model.config, 1, 8), 99)
    with pytest.raises(ValueError, match="kv_cache"):
        trace_attention_step(model, ids[:, -1:], None, 0)


# ------------------------------------------------------------------ KV cache size
@pytest.mark.parametrize("overrides", [
    dict(), dict(num_key_value_heads=4), dict(num_key_value_heads=1),
    dict(num_hidden_layers=5, hidden_size=96, num_attention_heads=6, num_key_value_heads=3),
    dict(head_dim=32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,L", [(1, 7), (3, 32)])
def test_kv_bytes_formula_equals_tensor_nbytes(overrides, dtype, B, L):
    cfg = preset("tiny", **overrides)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    cache = KVCache(cfg, B, L, dtype=dtype)
    # what the tensors really hold (elements x element size) vs the hand-written formula
    actual = sum(t.numel() * t.element_size() for t in cache.k + cache.v)
    assert actual == _expected_kv_bytes(cfg, itemsize, B * L)
    assert cache.nbytes() == _expected_kv_bytes(cfg, itemsize, B * L)
    assert cache.bytes_per_token() == _expected_kv_bytes(cfg, itemsize, 1)
    assert kv_cache_bytes_per_token(cfg, itemsize) == cache.bytes_per_token()
    r = kv_cache_size(cfg, B, L, dtype=dtype)                     # meta device: no memory
    assert r["nbytes"] == r["formula_nbytes"] == actual
    assert r["shape"] == [B, cfg.num_key_value_heads, L, cfg.head_dim]


def test_kv_cache_fills_as_tokens_arrive(make_model):
    model = make_model()
    cache = KVCache(model.config, 2, 10)
    per_token = _expected_kv_bytes(model.config, 4, 1)
    with torch.no_grad():
        prefill(model, torch.randint(3, 500, (2, 4)), cache)
        assert cache.nbytes_used() == 2 * 4 * per_token
        decode_step(model, torch.tensor([5, 6]), cache)
    assert cache.length == 5 and cache.nbytes_used() == 2 * 5 * per_token


def test_gqa_vs_mha_cache_size(make_model):
    gqa, mha = make_model(), make_model(num_key_value_heads=4)
    ratio = gqa.config.num_attention_heads // gqa.config.num_key_value_heads
    assert ratio == 2
    a, b = KVCache(gqa.config, 2, 16), KVCache(mha.config, 2, 16)
    assert b.nbytes() == ratio * a.nbytes()
    assert kv_cache_size(gqa.config, 2, 16, num_key_value_heads=4)["nbytes"] == b.nbytes()
    with pytest.raises(ValueError, match="num_key_value_heads"):
        kv_cache_size(gqa.config, 2, 16, num_key_value_heads=3)
    with pytest.raises(ValueError, match="seq_len"):
        kv_cache_size(gqa.config, 2, 10_000)


@pytest.mark.parametrize("name", ["Llama-3-8B", "Mixtral-8x7B"])
def test_real_scale_gqa_cache(name):
    raw = reference_models()[name]["config"]
    cfg = reference_config(name)
    per_token = 2 * raw["num_hidden_layers"] * raw["num_key_value_heads"] * raw["head_dim"] * 2
    assert kv_cache_bytes_per_token(cfg, 2) == per_token == 128 * 1024     # 128 KiB in bf16
    r = kv_cache_size(cfg, 1, 4096, dtype=torch.bfloat16)
    assert r["nbytes"] == per_token * 4096 == 2**29                        # 512 MiB
    mha = kv_cache_size(cfg, 1, 4096, num_key_value_heads=raw["num_attention_heads"],
                        dtype=torch.bfloat16)
    assert mha["nbytes"] // r["nbytes"] == raw["num_attention_heads"] // raw["num_key_value_heads"]


def test_deepseek_mla_cache_matches_v2_table1():
    raw = reference_models()["DeepSeek-V3"]["config"]
    layers, d_c, d_r = raw["num_hidden_layers"], raw["kv_lora_rank"], raw["qk_rope_head_dim"]
    d_h = raw["qk_nope_head_dim"]
    got = mla_kv_cache_bytes_per_token(layers, d_c, d_r, 2)
    assert got == (d_c + d_r) * layers * 2
    # DeepSeek-V2 report Table 1: (d_c + d_h^R) * l ~= 9/2 * d_h * l, i.e. GQA with 2.25 groups
    assert (d_c + d_r) / d_h == 4.5 and (d_c + d_r) / (2 * d_h) == 2.25
    with pytest.raises(ValueError, match="kv_lora_rank"):
        mla_kv_cache_bytes_per_token(layers, 0, d_r)


def test_format_bytes():
    assert format_bytes(1000) == "1000 B"
    assert format_bytes(128 * 1024) == "128.00 KiB"
    assert format_bytes(3 * 2**30 // 2) == "1.50 GiB"
    with pytest.raises(ValueError, match="n must be"):
        format_bytes(-1)


# ------------------------------------------------------------------ cached == recomputed
@pytest.mark.parametrize("overrides", ATTN_CONFIGS)
@pytest.mark.parametrize("B,prompt,steps", [(1, 1, 4), (2, 6, 3), (3, 11, 5)])
def test_cached_decode_equals_full_recompute(make_model, overrides, B, prompt, steps):
    model = make_model(**overrides)
    ids = torch.randint(3, model.config.vocab_size, (B, prompt + steps))
    cache = KVCache(model.config, B, prompt + steps)
    with torch.no_grad():
        full = model(ids)                                          # no cache at all
        got = [model(ids[:, :prompt], kv_cache=cache)]
        for t in range(prompt, prompt + steps):
            got.append(model(ids[:, t:t + 1], kv_cache=cache))
    torch.testing.assert_close(torch.cat(got, 1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("lengths,steps", [([5, 2, 8], 4), ([1, 6], 3), ([4, 4, 1, 7], 2)])
def test_left_padded_batch_equals_each_prompt_alone(make_model, lengths, steps):
    model = make_model()
    ids, mask, prompts = _ragged(model.config.vocab_size, lengths)
    B, S = ids.shape
    cache = KVCache(model.config, B, S + steps)
    with torch.no_grad():
        logits = model(ids, kv_cache=cache, attention_mask=mask)   # [B, S, V]
        new = [logits[:, -1].argmax(-1)]
        step_logits = []
        for _ in range(steps):
            lg = decode_step(model, new[-1], cache)                # [B, V]
            step_logits.append(lg)
            new.append(lg.argmax(-1))
        for b, p in enumerate(prompts):
            seq = torch.cat([p, torch.stack(new[:steps])[:, b]])[None]   # alone, unpadded
            ref = model(seq)[0]                                    # [n + steps, V]
            n = len(p)
            # RoPE positions count from the row's first real token: the rotated keys stored
            # for the padded row equal those of the prompt run alone (position 0 first)
            alone = KVCache(model.config, 1, n)
            model(p[None], kv_cache=alone)
            for layer in range(model.config.num_hidden_layers):
                torch.testing.assert_close(cache.k[layer][b, :, S - n:S], alone.k[layer][0],
                                           atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(logits[b, S - n:], ref[:n], atol=1e-5, rtol=1e-4)
            for t in range(steps):
                torch.testing.assert_close(step_logits[t][b], ref[n + t], atol=1e-5, rtol=1e-4)


def test_left_padded_real_prompts_equal_each_alone(pretrained):
    model, tok = pretrained
    texts = [PROMPT, "东京是日本的", "巴黎"]
    ids, mask = tok.batch_encode(texts)
    cache = KVCache(model.config, len(texts), ids.shape[1] + 3)
    with torch.no_grad():
        last = prefill(model, ids, cache, attention_mask=mask)
        steps = [last]
        for _ in range(3):
            steps.append(decode_step(model, steps[-1].argmax(-1), cache))
        for b, text in enumerate(texts):
            seq = torch.tensor([tok.encode(text)])
            for t in range(4):
                ref = model(seq)[0, -1]
                torch.testing.assert_close(steps[t][b], ref, atol=1e-5, rtol=1e-4)
                seq = torch.cat([seq, ref.argmax()[None, None]], 1)
    assert tok.decode([int(steps[0][0].argmax())]) == "都"


# ------------------------------------------------------------------ the causal mask
def _mask_by_loops(valid, start, S):
    B, L = valid.shape[0], start + S
    m = torch.zeros(B, 1, S, L, dtype=torch.bool)
    for b in range(B):
        for i in range(S):
            q = start + i
            for k in range(L):
                m[b, 0, i, k] = k == q or (k < q and bool(valid[b, k]))
    return m


@pytest.mark.parametrize("start,S", [(0, 5), (4, 1), (3, 4), (7, 2)])
def test_mask_when_query_is_shorter_than_keys(start, S):
    g = torch.Generator().manual_seed(start * 10 + S)
    valid = torch.rand(3, start + S + 2, generator=g) > 0.3
    assert torch.equal(attention_mask_for(valid, start, S), _mask_by_loops(valid, start, S))


@pytest.mark.parametrize("overrides", ATTN_CONFIGS)
@pytest.mark.parametrize("chunks", [[3, 4], [2, 3, 5], [1, 1, 6]])
def test_chunked_prefill_equals_one_prefill(make_model, overrides, chunks):
    model = make_model(**overrides)
    ids = torch.randint(3, model.config.vocab_size, (2, sum(chunks)))
    one, parts = KVCache(model.config, 2, sum(chunks)), KVCache(model.config, 2, sum(chunks))
    traces = []
    with torch.no_grad():
        want = model(ids, kv_cache=one)
        got, s = [], 0
        for c in chunks:
            traces.append(Trace(keep_tensors=True))
            got.append(model(ids[:, s:s + c], kv_cache=parts, trace=traces[-1]))
            s += c
    torch.testing.assert_close(torch.cat(got, 1), want, atol=1e-5, rtol=1e-4)
    for layer in range(model.config.num_hidden_layers):
        torch.testing.assert_close(parts.k[layer], one.k[layer], atol=1e-5, rtol=1e-4)
    # inside each chunk, no query gives any weight to a later position: exactly zero
    s = 0
    for c, tr in zip(chunks, traces):
        for w in tr.attention_weights.values():                   # [B, nh, c, s + c]
            assert w.shape[-2:] == (c, s + c)
            for i in range(c):
                assert (w[..., i, s + i + 1:] == 0).all()
                assert (w[..., i, : s + i + 1] > 0).all()
        s += c


def test_chunked_prefill_with_left_padding(make_model):
    model = make_model()
    ids, mask, prompts = _ragged(model.config.vocab_size, [9, 4, 6], seed=3)
    cache = KVCache(model.config, 3, ids.shape[1])
    with torch.no_grad():
        got = torch.cat([model(ids[:, a:b], kv_cache=cache, attention_mask=mask[:, a:b])
                         for a, b in [(0, 3), (3, 7), (7, 9)]], 1)
        for b, p in enumerate(prompts):
            ref = model(p[None])[0]
            torch.testing.assert_close(got[b, -len(p):], ref, atol=1e-5, rtol=1e-4)


def test_padding_and_future_keys_get_zero_weight(make_model):
    model = make_model()
    ids, mask, _ = _ragged(model.config.vocab_size, [6, 3], seed=1)
    trace = Trace(keep_tensors=True)
    with torch.no_grad():
        model(ids, attention_mask=mask, trace=trace)
    for w in trace.attention_weights.values():                   # [2, nh, 6, 6]
        assert (w.triu(diagonal=1) == 0).all()
        assert (w[1, :, 3:, :3] == 0).all()                       # real queries ignore padding


def test_decode_never_reads_future_cache_slots(make_model):
    model = make_model()
    ids = torch.randint(3, model.config.vocab_size, (2, 6))
    clean, dirty = KVCache(model.config, 2, 12), KVCache(model.config, 2, 12)
    for t in dirty.k + dirty.v:
        t.fill_(1e4)                                              # garbage in unfilled slots
    with torch.no_grad():
        a = [prefill(model, ids[:, :5], clean), decode_step(model, ids[:, 5], clean)]
        b = [prefill(model, ids[:, :5], dirty), decode_step(model, ids[:, 5], dirty)]
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_changing_a_later_token_does_not_change_earlier_logits(make_model):
    model = make_model()
    ids = torch.randint(3, model.config.vocab_size, (1, 8))
    other = ids.clone()
    other[0, 5:] = (other[0, 5:] + 1) % model.config.vocab_size
    with torch.no_grad():
        a, b = model(ids), model(other)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-6, rtol=0)
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-3


# ------------------------------------------------------------------ summaries, plots, widgets
def test_kv_cache_summary_text():
    cfg = reference_config("Llama-3-8B")
    text = kv_cache_summary(cfg, 1, 8192, 8, "bf16")
    per = 2 * 32 * 8 * 128 * 2
    assert f"formula {per:,}, tensors {per:,}" in text
    assert f"{per * 8192:,} B" in text and "GQA" in text and "4x more" in text
    assert "MHA" in kv_cache_summary(cfg, 1, 16, 32, "fp32")
    with pytest.raises(ValueError, match="dtype_name"):
        kv_cache_summary(cfg, 1, 16, 8, "int3")


@pytest.mark.filterwarnings("ignore:Glyph")
def test_plots_and_widgets_build(traced_prompt):
    model, tok, tokens, trace = traced_prompt
    fig = attention_context_plot(trace.attention_weights, tokens)
    assert len(fig.axes) == model.config.num_hidden_layers
    fig = attention_head_heatmap(trace.attention_weights[0][0, 1], tokens, tokens)
    assert fig.axes[0].get_images()[0].get_array().shape == (5, 5)
    assert len(shape_flow([("a", "hidden"), ("b", "cache")]).axes) == 1
    kv_cache_growth_plot(model.config, 128, [1, 2, 4])
    with pytest.raises(ValueError, match="kv_heads"):
        kv_cache_growth_plot(model.config, 128, [3])
    with pytest.raises(ValueError, match="kind"):
        shape_flow([("a", "purple")])
    with pytest.raises(ValueError, match="tokens"):
        attention_context_plot(trace.attention_weights, tokens[:3])
    plt.close("all")
    w = kv_cache_explorer(model.config)
    assert list(w.children[1].options) == [1, 2, 4]
    w = attention_explorer(trace.attention_weights, tokens, tokens)
    assert list(w.children[1].options) == list(range(model.config.num_attention_heads))
    plt.close("all")
    assert math.isclose(float(trace.attention_weights[0][0, 0, -1].sum()), 1.0, abs_tol=1e-6)


# ------------------------------------------------------------------ speed paths == plain paths
# (moved from test_interop.py: they need no transformers)
@pytest.mark.parametrize("start,S,pad", [(0, 12, False), (12, 1, False), (0, 12, True),
                                         (12, 1, True), (5, 4, False)])
def test_sdpa_fast_paths_equal_the_masked_call(start, S, pad):
    """Masks that only encode causality carry ``sdpa_hint``; the hinted SDPA call (no mask
    tensor / ``is_causal``) gives the masked call's values."""
    from tokenflow.model.attention import attention_mask_for
    model = random_model()
    attn = model.layers[0].self_attn
    B, L = 2, start + S
    valid = torch.ones(B, L + 3, dtype=torch.bool)
    if pad:
        valid[1, :3] = False
    mask = attention_mask_for(valid, start, S)
    hint = getattr(mask, "sdpa_hint", None)
    assert hint == (None if pad or (start and S > 1) else ("none" if S == 1 else "causal"))
    torch.manual_seed(0)
    x = torch.randn(B, S, model.config.hidden_size)
    cos, sin = model.rotary(torch.arange(start, L).expand(B, S))
    cache_a, cache_b = KVCache(model.config, B, L), KVCache(model.config, B, L)
    past = torch.randn(B, model.config.num_key_value_heads, start, model.config.head_dim)
    for c in (cache_a, cache_b):
        c.k[0][:, :, :start] = past
        c.v[0][:, :, :start] = -past
    pos = torch.arange(start, L).expand(B, S)
    with torch.no_grad():
        fast = attn(x, cos, sin, CacheStep(start, pos, mask), cache_a)
        plain = attn(x, cos, sin, CacheStep(start, pos, mask.clone()), cache_b)  # no hint
    assert not hasattr(mask.clone(), "sdpa_hint")
    torch.testing.assert_close(fast, plain, atol=1e-6, rtol=1e-5)


def test_rmsnorm_fast_path_is_bit_identical():
    model = TokenFlowModel(preset("small-dense"))
    norm = model.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.uniform_(0.8, 1.2)
    x = torch.randn(3, 17, 512) * 4
    slow = norm(x)                                                       # grad on: explicit form
    with torch.no_grad():
        fast = norm(x)                                                   # fused F.rms_norm
    assert torch.equal(fast, slow.detach())


def test_begin_step_without_mask_equals_a_mask_of_ones():
    """The decode loop's shortcut (no attention_mask: all tokens real) claims the same slots,
    positions and mask as an explicit mask of ones."""
    cfg = preset("tiny")
    a, b = KVCache(cfg, 3, 20), KVCache(cfg, 3, 20)
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    a.begin_step(mask, 3, 4), b.begin_step(mask, 3, 4)
    for S in (1, 5, 1):
        sa = a.begin_step(torch.ones(3, S), 3, S)
        sb = b.begin_step(None, 3, S)
        assert sa.start == sb.start and torch.equal(sa.positions, sb.positions)
        assert torch.equal(sa.mask, sb.mask)
        assert torch.equal(a.valid, b.valid) and torch.equal(a.num_real, b.num_real)
        assert a.length == b.length
    with pytest.raises(ValueError, match="max_len"):
        b.begin_step(None, 3, 20)


@pytest.mark.parametrize("start,S", [(0, 1), (0, 7), (6, 1)])
def test_unpadded_masks_follow_the_rule(start, S):
    """The no-padding shortcuts of attention_mask_for build the same mask as the rule
    "a query sees keys at or before its own slot"."""
    from tokenflow.model.attention import attention_mask_for
    valid = torch.ones(2, start + S + 2, dtype=torch.bool)
    L = start + S
    want = torch.tensor([[k <= start + i for k in range(L)] for i in range(S)])
    got = attention_mask_for(valid, start, S)
    assert got.shape == (2, 1, S, L) and torch.equal(got, want.expand(2, 1, S, L))


# ------------------------------------------------------------------ using a cache (R1 items 4, 5)
def test_second_prefill_into_a_used_cache_raises(make_model):
    model = make_model()
    ids = torch.randint(3, model.config.vocab_size, (2, 5))
    cache = KVCache(model.config, 2, 12)
    with torch.no_grad():
        first = prefill(model, ids, cache)
        with pytest.raises(ValueError, match="empty kv_cache.*reset.*model\\(ids, kv_cache"):
            prefill(model, ids, cache)
        assert cache.length == 5                                  # untouched by the refusal
        cache.reset()
        assert cache.length == 0 and int(cache.num_real.sum()) == 0
        again = prefill(model, ids, cache)                         # a new sequence
        more = model(ids[:, :2], kv_cache=cache)                   # explicit continuation
        assert cache.length == 7
        want = model(torch.cat([ids, ids[:, :2]], 1))[:, -2:]
    assert torch.equal(first, again)
    torch.testing.assert_close(more, want, atol=1e-5, rtol=1e-4)


def test_reset_after_padding_forgets_it(make_model):
    model = make_model()
    ids, mask, prompts = _ragged(model.config.vocab_size, [3, 6])
    cache = KVCache(model.config, 2, 10)
    with torch.no_grad():
        prefill(model, ids, cache, attention_mask=mask)
        cache.reset()
        a = prefill(model, ids[:, :4], cache)
        b = prefill(model, ids[:, :4], KVCache(model.config, 2, 10))
    assert torch.equal(a, b) and not (~cache.valid[:, :4]).any()


def test_cache_dtype_and_device_are_checked_once_naming_both(make_model):
    model = make_model()
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match="kv_cache dtype torch.bfloat16 .*torch.float32"):
        prefill(model, ids, KVCache(model.config, 1, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="kv_cache device meta .*cpu"):
        model(ids, kv_cache=KVCache(model.config, 1, 8, device="meta"))
    with pytest.raises(ValueError, match="another model"):
        model(ids, kv_cache=KVCache(preset("tiny", num_key_value_heads=4), 1, 8))
    with pytest.raises(TypeError, match="kv_cache must be"):
        model(ids, kv_cache="cache")
    bf16 = make_model().to(torch.bfloat16)                          # matching dtypes work
    with torch.no_grad():
        out = prefill(bf16, ids, KVCache(bf16.config, 1, 8, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16


def test_check_runs_once_per_forward(make_model, monkeypatch):
    model = make_model()
    cache = KVCache(model.config, 1, 8)
    calls = []
    orig = KVCache.check_model
    monkeypatch.setattr(KVCache, "check_model", lambda self, *a: calls.append(1) or orig(self, *a))
    with torch.no_grad():
        prefill(model, torch.tensor([[3, 4, 5]]), cache)
    assert len(calls) == 1 and model.config.num_hidden_layers > 1


# ---- found by planting bugs (R1 review): each test names a neighbour the suite missed
def test_cache_dtype_of_the_same_size_is_still_refused(make_model):
    model = make_model().to(torch.float16)
    with pytest.raises(ValueError, match="kv_cache dtype torch.bfloat16 .*torch.float16"):
        prefill(model, torch.tensor([[3, 4, 5]]),
                KVCache(model.config, 1, 8, dtype=torch.bfloat16))


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1), (8, 2), (4, 4)])
@pytest.mark.parametrize("pad", [False, True])
def test_decode_attention_equals_repeated_kv_heads(heads, kv_heads, pad):
    """A decode step's attention (GQA: the query heads of one KV head stacked as rows of one
    SDPA call) equals the textbook form: every KV head repeated for its query heads, scores,
    masked softmax, weighted sum; with left padding (mask tensor) and without (no mask)."""
    model = random_model(num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=8, hidden_size=32)
    ids, mask, _ = _ragged(model.config.vocab_size, [6, 4 if pad else 6])
    cache = KVCache(model.config, 2, 7)
    attn, nh, D = model.layers[0].self_attn, heads, 8
    with torch.no_grad():
        model(ids, kv_cache=cache, attention_mask=mask)
        step = cache.begin_step(None, 2, 1)
        assert (getattr(step.mask, "sdpa_hint", None) == "none") == (not pad)
        cos, sin = model.rotary(step.positions)
        x = torch.randn(2, 1, model.config.hidden_size)
        out = attn(x, cos, sin, step, cache)                        # writes slot 6 of layer 0
        q = F.linear(x, attn.q_proj.weight).view(2, 1, nh, D).transpose(1, 2)
        q = q * cos + torch.cat([-q[..., D // 2:], q[..., :D // 2]], -1) * sin
        k = cache.k[0][:, :, :7].repeat_interleave(nh // kv_heads, dim=1)   # [2, nh, 7, D]
        v = cache.v[0][:, :, :7].repeat_interleave(nh // kv_heads, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)                    # [2, nh, 1, 7]
        weights = scores.masked_fill(~step.mask, float("-inf")).softmax(-1)
        heads_out = (weights @ v).transpose(1, 2).reshape(2, 1, nh * D)
        ref = attn.o_proj(heads_out)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert out.abs().max() > 1e-3
    if pad:                                       # the padded slots got no weight in row 1
        assert weights[1, :, :, :2].abs().max() == 0


def test_rotate_half_equals_the_concatenated_form_and_its_gradient():
    """``_rotate_half`` (one roll, one product with +-1) is ``cat([-x2, x1])`` exactly, in
    and out of inference mode, and passes the same gradient back."""
    from tokenflow.model.rope import _rotate_half
    for D in (2, 8, 64):
        x = torch.randn(2, 3, 5, D, dtype=torch.float64, requires_grad=True)
        ref = torch.cat([-x[..., D // 2:], x[..., :D // 2]], dim=-1)
        out = _rotate_half(x)
        assert torch.equal(out, ref)
        g = torch.randn_like(ref)
        (ga,) = torch.autograd.grad(out, x, g)
        (gb,) = torch.autograd.grad(ref, x, g)
        assert torch.equal(ga, gb)
        with torch.inference_mode():
            y = torch.randn(1, 2, 1, D)
            assert torch.equal(_rotate_half(y), torch.cat([-y[..., D // 2:], y[..., :D // 2]], -1))


def test_half_signs_follow_each_dtype_and_device(monkeypatch):
    """The cached +-1 signs of ``_rotate_half`` are built per kind of input: the same D in
    another dtype or on another device gets its own signs (``[-1]*(D/2) + [1]*(D/2)``, in the
    input's dtype and on its device), and the rotation stays ``cat([-x2, x1])`` for each."""
    from tokenflow.model import rope
    monkeypatch.setattr(rope, "_SIGNS", {})                 # this test builds every entry
    D = 12
    m = rope._half_signs(torch.empty(1, 2, 1, D, device="meta"))    # a device without data
    assert m.device.type == "meta" and m.shape == (D,)
    expected = torch.tensor([-1.0] * (D // 2) + [1.0] * (D // 2))
    for dtype in (torch.float16, torch.float64, torch.bfloat16, torch.float32):
        x = torch.randn(2, 3, 1, D).to(dtype)
        signs = rope._half_signs(x)
        assert signs.dtype == dtype and signs.device == x.device
        assert torch.equal(signs.float(), expected)
        out = rope._rotate_half(x)
        assert out.dtype == dtype
        assert torch.equal(out, torch.cat([-x[..., D // 2:], x[..., :D // 2]], dim=-1))


def test_rotate_half_gradient_after_signs_built_in_inference_mode(monkeypatch):
    """Signs first built inside ``torch.inference_mode`` (generation) are still usable by
    autograd afterwards (training the same model): the rotation's gradient is the
    concatenated form's."""
    from tokenflow.model import rope
    monkeypatch.setattr(rope, "_SIGNS", {})
    D = 10
    with torch.inference_mode():
        y = torch.randn(1, 2, 1, D)
        assert torch.equal(rope._rotate_half(y), torch.cat([-y[..., D // 2:], y[..., :D // 2]], -1))
    x = torch.randn(2, 3, 4, D, requires_grad=True)
    g = torch.randn(2, 3, 4, D)
    (ga,) = torch.autograd.grad(rope._rotate_half(x), x, g)
    (gb,) = torch.autograd.grad(torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1), x, g)
    assert torch.equal(ga, gb) and ga.abs().sum() > 0


def test_a_trace_leaves_the_forward_numbers_unchanged():
    """The trace records through hooks: traced and untraced logits are bit-identical, and the
    hooks are gone after the call."""
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny")).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 5))
    with torch.no_grad():
        plain = model(ids)
        t = Trace(keep_tensors=True)
        traced = model(ids, trace=t)
    assert torch.equal(plain, traced)
    assert t.actions()[0] == "lookup" and t.actions()[-1] == "project vocab"
    assert len(t.hidden_states) == model.config.num_hidden_layers + 1
    assert not any(m._forward_hooks for m in model.modules())
