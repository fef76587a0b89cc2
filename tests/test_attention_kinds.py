"""Cache per attention kind (tokenflow.analysis.attention_kinds): hand computations, Hugging Face
Qwen3-Next's real cache tensors and gated-delta-rule reference, and chapter 8's stored table."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
from transformers.models.qwen3_next.modeling_qwen3_next import (
    torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule)

from tokenflow.analysis import costmodel
from tokenflow.analysis.attention_kinds import (CacheLayout, example_layouts, gated_delta_rule,
                                       gated_deltanet_state_elements, hybrid_layout,
                                       kv_per_token_table, sparse_decode_reads, with_kv_heads)

ROOT = Path(__file__).resolve().parents[1]
CONTEXTS = [1024, 8192, 32768, 131072]


def test_mha_gqa_mqa_by_hand():
    llama = costmodel.reference_config("Llama-3-8B")          # 32 layers, 32 q heads, D 128
    for n_kv in (32, 8, 1):
        lay = CacheLayout("x", with_kv_heads(llama, n_kv))
        assert lay.bytes_per_token(4096) == 2 * 32 * n_kv * 128 * 2      # K and V, bf16


def test_with_kv_heads_rejects_bad_counts_and_mla():
    llama = costmodel.reference_config("Llama-3-8B")
    for bad in (0, 3, 64, True):
        with pytest.raises(ValueError, match="num_key_value_heads"):
            with_kv_heads(llama, bad)
    with pytest.raises(ValueError, match="MLA"):
        with_kv_heads(costmodel.reference_config("DeepSeek-V3"), 1)


def test_sliding_window_by_hand():
    """Mistral-7B-v0.1: every layer keeps at most 4,096 tokens; gpt-oss-120b: 18 layers keep
    128 tokens, 18 keep everything (8 KV heads of 64)."""
    mistral = CacheLayout("m", costmodel.reference_config("Mistral-7B-v0.1"))
    per_tok = 2 * 32 * 8 * 128 * 2
    assert mistral.bytes(1000) == 1000 * per_tok
    assert mistral.bytes(32768) == 4096 * per_tok
    oss = CacheLayout("o", costmodel.reference_config("gpt-oss-120b"))
    layer_tok = 2 * 8 * 64 * 2
    assert oss.bytes(10_000) == 18 * (128 + 10_000) * layer_tok


def test_qwen3_next_hybrid_by_hand():
    lay = hybrid_layout("Qwen3-Next-80B-A3B")
    assert (lay.kv_config.num_hidden_layers, lay.num_state_layers) == (12, 36)
    state = 32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3      # conv width 4: 3 past inputs
    assert lay.state_elements_per_layer == state
    L = 50_000
    assert lay.bytes(L, batch=3) == 3 * (12 * L * 2 * 2 * 256 + 36 * state) * 2
    with pytest.raises(ValueError, match="hybrid"):
        hybrid_layout("Llama-3-8B")


def _tiny_qwen3_next():
    cfg = Qwen3NextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16)
    torch.manual_seed(0)
    return cfg, Qwen3NextForCausalLM(cfg).eval()


@torch.no_grad()
def test_state_size_equals_hf_qwen3_next_cache_and_does_not_grow():
    cfg, model = _tiny_qwen3_next()
    want = gated_deltanet_state_elements(cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                                         cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                                         cfg.linear_conv_kernel_dim,
                                         conv_inputs_kept=cfg.linear_conv_kernel_dim)
    for S in (3, 17):
        cache = model(torch.randint(0, 64, (1, S)), use_cache=True).past_key_values
        linear = [layer for t, layer in zip(cfg.layer_types, cache.layers)
                  if t == "linear_attention"]
        assert len(linear) == 3
        for layer in linear:
            assert layer.recurrent_states[0].numel() == want["recurrent"]
            assert layer.conv_states[0].numel() == want["conv"]


def test_a_causal_conv_of_width_k_needs_only_k_minus_1_past_inputs():
    """Streaming the conv one token at a time, keeping the last k - 1 inputs, gives the
    whole-sequence causal conv exactly: the layer's need, which the default counts (HF's
    cache keeps k columns, one more)."""
    torch.manual_seed(0)
    C, k, S = 6, 4, 11
    w = torch.randn(C, 1, k)
    x = torch.randn(1, C, S)
    whole = torch.nn.functional.conv1d(torch.nn.functional.pad(x, (k - 1, 0)), w, groups=C)
    kept, outs = torch.zeros(1, C, k - 1), []
    for t in range(S):
        window = torch.cat([kept, x[:, :, t:t + 1]], dim=-1)               # [1, C, k]
        outs.append(torch.nn.functional.conv1d(window, w, groups=C))
        kept = window[:, :, 1:]
    torch.testing.assert_close(torch.cat(outs, dim=-1), whole, rtol=0, atol=1e-6)
    n = gated_deltanet_state_elements(2, 4, 8, 6, k)["conv"]
    assert n == (2 * 2 * 8 + 4 * 6) * (k - 1) == kept.shape[-1] * (2 * 2 * 8 + 4 * 6)
    with pytest.raises(ValueError, match="conv_inputs_kept"):
        gated_deltanet_state_elements(2, 4, 8, 6, k, conv_inputs_kept=k + 1)


def test_state_elements_rejects_bad_heads():
    with pytest.raises(ValueError, match="multiple"):
        gated_deltanet_state_elements(3, 4, 8, 8, 4)
    with pytest.raises(ValueError, match="conv_kernel_dim"):
        gated_deltanet_state_elements(2, 4, 8, 8, 0)


def _gdn_inputs(S=24, H=3, Dk=8, Dv=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, S, H, Dk, generator=g)
    k = torch.nn.functional.normalize(torch.randn(1, S, H, Dk, generator=g), dim=-1)
    v = torch.randn(1, S, H, Dv, generator=g)
    decay = -torch.rand(1, S, H, generator=g)                  # log of a decay in (e^-1, 1]
    beta = torch.rand(1, S, H, generator=g)
    return q, k, v, decay, beta


def test_gated_delta_rule_matches_hf_recurrent_and_chunked_kernels():
    q, k, v, decay, beta = _gdn_inputs()
    ours, state = gated_delta_rule(q, k, v, decay, beta)
    rec, rec_state = torch_recurrent_gated_delta_rule(q, k, v, decay, beta,
                                                      output_final_state=True)
    chunk, chunk_state = torch_chunk_gated_delta_rule(q, k, v, decay, beta, chunk_size=8,
                                                      output_final_state=True)
    torch.testing.assert_close(ours, rec, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, rec_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, chunk, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, chunk_state, rtol=1e-4, atol=1e-4)


def test_gated_delta_rule_chunks_carry_the_state_exactly():
    q, k, v, decay, beta = _gdn_inputs()
    whole, final = gated_delta_rule(q, k, v, decay, beta)
    state, outs = None, []
    for s in range(0, 24, 7):                                   # chunks 7, 7, 7, 3
        sl = slice(s, s + 7)
        out, state = gated_delta_rule(q[:, sl], k[:, sl], v[:, sl], decay[:, sl], beta[:, sl],
                                      state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, final, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="state"):
        gated_delta_rule(q, k, v, decay, beta, torch.zeros(1, 3, 8, 4))


def test_sparse_decode_reads_by_hand():
    v3 = costmodel.reference_config("DeepSeek-V3")             # 61 layers, latent 512 + 64
    r = sparse_decode_reads(v3, 131072, index_topk=2048, index_head_dim=128)
    entry = 61 * (512 + 64) * 2
    assert r["dense"] == 131072 * entry
    # FlashMLA's sparse kernel reads an FP8 entry: 512 FP8 + 4 FP32 scales + 64 BF16 = 656 B
    assert r["selected"] == 2048 * 61 * (512 + 16 + 128)
    assert sparse_decode_reads(v3, 131072, 2048, 128, sparse_entry_bytes=None)["selected"] \
        == 2048 * entry
    assert r["indexer"] == 61 * 131072 * 128
    # a BF16 indexer key costs twice the FP8 one
    assert sparse_decode_reads(v3, 131072, 2048, 128, index_bytes_per_element=2)["indexer"] \
        == 2 * 61 * 131072 * 128
    assert r["sparse"] == r["indexer"] + r["selected"]
    short = sparse_decode_reads(v3, 100, index_topk=2048, index_head_dim=128,
                                sparse_entry_bytes=None)
    assert short["selected"] == short["dense"]                 # fewer tokens than top-k
    with pytest.raises(ValueError, match="sparse_entry_bytes"):
        sparse_decode_reads(v3, 100, 2048, 128, sparse_entry_bytes=0)


def test_new_reference_configs_match_published_totals():
    """gpt-oss-120b: 116.8B parameters (OpenAI model card); Mistral-7B-v0.1: 7.24B (the count
    of its safetensors, 7,241,732,096)."""
    oss = costmodel.param_count(costmodel.reference_config("gpt-oss-120b"))
    assert abs(oss / 116.83e9 - 1) < 0.005
    assert costmodel.param_count(costmodel.reference_config("Mistral-7B-v0.1")) == 7_241_732_096


def test_chapter8_table_is_the_library_output():
    """The KV-per-token table stored in notebooks/08_further.ipynb is the library's output,
    not typed in: its text form (what nbval compares) and its rows, recomputed here from
    each layout's bytes() at each context."""
    from tokenflow.viz import kv_per_token_view
    nb = json.loads((ROOT / "notebooks" / "08_further.ipynb").read_text(encoding="utf-8"))
    texts = ["".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
             for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    view = kv_per_token_view(example_layouts(), CONTEXTS)
    assert any(view.to_text() in t for t in texts)
    for lay, row in zip(example_layouts(), view.rows):
        assert row == [lay.name] + [lay.bytes(n) // n for n in CONTEXTS]
    assert kv_per_token_table(example_layouts(), CONTEXTS).splitlines()[1].split()[-1] == \
        f"{view.rows[0][-1]:,}"
