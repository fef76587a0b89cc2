"""Multi-head latent attention (issue F10): ours == Hugging Face ``DeepseekV3ForCausalLM``, the
absorbed decode == the naive form, cached == recomputed, and the compressed cache's size.

The tiny DeepSeek-V3-shaped model has MLA (with and without the query low-rank path, plain and
YaRN RoPE), a dense first layer, then sigmoid-routed MoE layers with expert groups, a
selection bias, a routed scaling factor and a shared expert. All fp32.
"""
import pytest
import torch
import transformers

from tokenflow import KVCache, ModelConfig, Trace, TokenFlowModel, decode_step, prefill
from tokenflow import interop
from tokenflow.analysis import costmodel
from tokenflow.analysis.attention_kinds import kv_cache_size

ATOL = 1e-4
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def ds_config(**kw) -> ModelConfig:
    base = dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32,
                num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
                first_k_dense_replace=1, scoring_func="sigmoid", norm_topk_prob=True,
                routed_scaling_factor=2.5, n_group=4, topk_group=2, q_lora_rank=24,
                kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10,
                max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    base.update(kw)
    return ModelConfig(**base)


CONFIGS = {"q-lora": dict(), "no-q-lora": dict(q_lora_rank=None),
           "yarn": dict(rope_scaling=YARN), "dense-mla": dict(num_experts=0,
                                                              num_experts_per_tok=0)}


def random_mla(cfg: ModelConfig, seed: int = 0) -> TokenFlowModel:
    """Wide random weights (clear-cut greedy choices) and a non-zero selection bias."""
    torch.manual_seed(seed)
    model = TokenFlowModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08) if p.dim() == 2 else p.uniform_(0.8, 1.2)
        for layer in model.layers:
            if layer.is_moe:
                layer.mlp.gate.e_score_correction_bias.copy_(torch.linspace(0.0, 0.3, 8))
    return model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request):
    ours = random_mla(ds_config(**CONFIGS[request.param]))
    hf = interop.to_hf_model(ours)
    assert type(hf).__name__ == "DeepseekV3ForCausalLM"
    hf.generation_config.eos_token_id = None
    return ours, hf


def _ragged(vocab, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.zeros(len(lengths), S, dtype=torch.long)
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, S - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[b, S - n:] = 1
    return ids, mask


# ------------------------------------------------------------------ ours == Hugging Face
@pytest.mark.parametrize("lengths", [[9, 9], [9, 4, 6]])
def test_prefill_and_16_greedy_steps_equal_hf(pair, lengths):
    ours, hf = pair
    ids, mask = _ragged(ours.config.vocab_size, lengths)
    B, S, N = len(lengths), ids.shape[1], 16
    padded = min(lengths) < S
    cache = KVCache(ours.config, B, S + N)
    with torch.no_grad():
        full = ours(ids, kv_cache=cache, attention_mask=mask if padded else None)
        hf_full = hf(ids, attention_mask=mask,
                     position_ids=interop.hf_position_ids(mask)).logits
        real = mask.bool()
        d = (full[real] - hf_full[real]).abs().max().item()
        assert d <= ATOL, f"prefill logits differ by {d}"
        steps, tok = [full[:, -1]], full[:, -1].argmax(-1)
        new = [tok]
        for _ in range(N - 1):
            steps.append(decode_step(ours, tok, cache))           # absorbed form (S == 1)
            tok = steps[-1].argmax(-1)
            new.append(tok)
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=N, do_sample=False,
                          output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    assert len(out.logits) == N
    for t, (a, b) in enumerate(zip(steps, out.logits)):
        d = (a - b).abs().max().item()
        assert d <= ATOL, f"decode step {t}: logits differ by {d}"
    assert torch.equal(out.sequences[:, S:], torch.stack(new, dim=1))
    assert full.std() > 0.1                                       # not trivially equal


@pytest.mark.parametrize("interleave", [True, False])
def test_hf_initialised_model_maps_to_ours(interleave):
    """An HF model with its own random weights, in either RoPE layout, read into ours."""
    hf_cfg = interop.to_hf_config(ds_config(rope_scaling=YARN))
    hf_cfg.rope_interleave = interleave
    torch.manual_seed(1)
    hf = transformers.DeepseekV3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    ours = interop.from_hf_model(hf)
    ids = torch.randint(3, 256, (2, 11))
    with torch.no_grad():
        d = (ours(ids) - hf(ids).logits).abs().max().item()
    assert d <= ATOL
    back = interop.state_dict_to_hf(ours)                         # interleaved layout
    if interleave:
        for k, v in back.items():
            assert torch.equal(v, hf.state_dict()[k]), k


def test_config_round_trip_and_reference_config():
    cfg = ds_config(rope_scaling=YARN, rope_theta=5e4)
    assert interop.from_hf_config(interop.to_hf_config(cfg)) == cfg
    v3 = costmodel.reference_config("DeepSeek-V3")
    raw = costmodel.reference_models()["DeepSeek-V3"]["config"]
    assert v3.is_mla and v3.head_dim == raw["qk_rope_head_dim"]
    assert (v3.kv_lora_rank, v3.q_lora_rank, v3.qk_nope_head_dim, v3.v_head_dim) == (
        raw["kv_lora_rank"], raw["q_lora_rank"], raw["qk_nope_head_dim"], raw["v_head_dim"])
    assert v3.rope_scaling["rope_type"] == "yarn" and v3.rope_scaling["factor"] == 40


# ------------------------------------------------------------------ absorbed == naive, cached
@pytest.mark.parametrize("name", ["q-lora", "yarn"])
@pytest.mark.parametrize("S,pad", [(1, False), (1, True), (4, False), (3, True)])
def test_absorbed_equals_naive(name, S, pad):
    model = random_mla(ds_config(**CONFIGS[name]))
    ids, mask = _ragged(256, [7, 5 if pad else 7])
    cache = KVCache(model.config, 2, 7 + S)
    with torch.no_grad():
        model(ids, kv_cache=cache, attention_mask=mask)
        step = cache.begin_step(None, 2, S)
        cos, sin = model.rotary(step.positions)
        x = torch.randn(2, S, model.config.hidden_size)
        outs = {}
        for absorb in (True, False):
            attn = model.layers[1].self_attn
            attn.absorb = absorb
            outs[absorb] = attn(x, cos, sin, step, cache)   # same entries written twice
            attn.absorb = None
    torch.testing.assert_close(outs[True], outs[False], atol=1e-5, rtol=0)
    assert outs[True].abs().max() > 0.05


@pytest.mark.parametrize("absorb", [None, True, False])
def test_cached_decode_equals_recompute(absorb):
    model = random_mla(ds_config(rope_scaling=YARN))
    for layer in model.layers:
        layer.self_attn.absorb = absorb
    ids = torch.randint(3, 256, (2, 12))
    cache = KVCache(model.config, 2, 12)
    with torch.no_grad():
        full = model(ids)
        got = [prefill(model, ids[:, :5], cache)[:, None]]
        got.append(model(ids[:, 5:8], kv_cache=cache)[:, -1:])     # a chunk
        for t in range(8, 12):
            got.append(decode_step(model, ids[:, t], cache)[:, None])
    want = full[:, [4, 7, 8, 9, 10, 11]]
    torch.testing.assert_close(torch.cat(got, 1), want, atol=1e-5, rtol=1e-4)


def test_trace_records_mla_steps():
    model = random_mla(ds_config())
    trace = Trace(keep_tensors=True)
    with torch.no_grad():
        model(torch.randint(3, 256, (1, 6)), trace=trace)
    for w in trace.attention_weights.values():                     # [1, nh, 6, 6]
        torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, 6))
        assert (w.triu(diagonal=1) == 0).all()
    assert any("MLA" in e.where for e in trace.events)


# ------------------------------------------------------------------ sizes and counts
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cache_bytes_per_token_equal_the_formula(name, dtype):
    cfg = ds_config(**CONFIGS[name])
    itemsize = torch.tensor([], dtype=dtype).element_size()
    cache = KVCache(cfg, 3, 20, dtype=dtype)
    by_hand = cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * itemsize
    assert cache.nbytes() == sum(t.nbytes for t in cache.latent + cache.k_rope) == by_hand * 60
    assert cache.bytes_per_token() == by_hand == costmodel.kv_cache_bytes_per_token(cfg, itemsize)
    assert cache.latent[0].shape == (3, 1, 20, cfg.kv_lora_rank)
    with pytest.raises(AttributeError, match="latent"):
        cache.k


def test_deepseek_v3_cache_on_meta_tensors():
    raw = costmodel.reference_models()["DeepSeek-V3"]["config"]
    r = kv_cache_size(costmodel.reference_config("DeepSeek-V3"), 1, 4096, dtype=torch.bfloat16)
    by_hand = raw["num_hidden_layers"] * (raw["kv_lora_rank"] + raw["qk_rope_head_dim"]) * 2
    assert r["bytes_per_token"] == r["formula_bytes_per_token"] == by_hand == 70_272
    assert r["shape"] == [1, 1, 4096, 512] and r["nbytes"] == by_hand * 4096


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_param_count_counts_mla(name):
    cfg = ds_config(**CONFIGS[name])
    model = TokenFlowModel(cfg)
    assert costmodel.param_count(cfg) == sum(p.numel() for p in model.parameters())


def test_deepseek_v3_param_count_matches_the_published_total():
    pub = costmodel.reference_models()["DeepSeek-V3"]["published"]["total"]        # "671B"
    total = costmodel.param_count(costmodel.reference_config("DeepSeek-V3"))
    assert abs(total / (float(pub.rstrip("B")) * 1e9) - 1) < 1e-3


# ------------------------------------------------------------------ bad configs
@pytest.mark.parametrize("kw,field", [
    (dict(kv_lora_rank=0), "kv_lora_rank"), (dict(q_lora_rank=0), "q_lora_rank"),
    (dict(qk_nope_head_dim=0), "qk_nope_head_dim"), (dict(v_head_dim=-1), "v_head_dim"),
    (dict(kv_lora_rank=2.5), "kv_lora_rank"),
    (dict(qk_rope_head_dim=7), "qk_rope_head_dim must be even"),
    (dict(qk_rope_head_dim=0), "qk_rope_head_dim"),
    (dict(head_dim=16), "head_dim must equal qk_rope_head_dim"),
    (dict(kv_lora_rank=None), "is an MLA field")])
def test_bad_mla_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        ds_config(**kw)


def test_hf_head_dims_that_do_not_add_up():
    d = interop.to_hf_config(ds_config()).to_dict()
    d["qk_head_dim"] = 99
    with pytest.raises(ValueError, match="qk_head_dim"):
        ModelConfig.from_hf_config(d)


def test_cache_of_another_kind_is_rejected():
    model = random_mla(ds_config())
    gqa = ds_config(kv_lora_rank=None, q_lora_rank=None, qk_rope_head_dim=None,
                    qk_nope_head_dim=None, v_head_dim=None, head_dim=None)
    with pytest.raises(ValueError, match="kv_cache was built for another model"):
        model(torch.tensor([[3, 4]]), kv_cache=KVCache(gqa, 1, 8))


def test_generate_and_gqa_only_helpers():
    from tokenflow import generate
    from tokenflow.model.attention import trace_attention_step
    model = random_mla(ds_config())
    ids = torch.randint(3, 256, (2, 5))
    out = generate(model, ids, max_new_tokens=6, stop_at_eos=False)
    with torch.no_grad():
        want = ids
        for _ in range(6):                                         # recompute, no cache
            want = torch.cat([want, model(want)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, want)
    with pytest.raises(ValueError, match="MLA"):
        trace_attention_step(model, ids[:, :1], KVCache(model.config, 2, 8), 0)


@pytest.mark.parametrize("L", [1, 9, 30])
def test_decode_costs_formula_equals_counted_flops(L):
    """The cost formula of both forms against PyTorch's FLOP counter on the real module."""
    from torch.utils.flop_counter import FlopCounterMode
    model = random_mla(ds_config())
    attn = model.layers[0].self_attn
    torch.manual_seed(0)
    q_nope, q_rope = torch.randn(1, 4, 1, 12), torch.randn(1, 4, 1, 8)
    latent, k_rope = torch.randn(1, 1, L, 16), torch.randn(1, 1, L, 8)
    mask = torch.ones(1, 1, 1, L, dtype=torch.bool)
    counted = {}
    with torch.no_grad():
        for form in ("naive", "absorbed"):
            with FlopCounterMode(display=False) as fc:
                if form == "naive":
                    out, _ = attn.attend_naive(q_nope, q_rope, latent, k_rope, mask, True)
                else:
                    out, _ = attn.attend_absorbed(q_nope, q_rope, latent, k_rope, mask)
            counted[form] = fc.get_total_flops()
    costs = costmodel.mla_decode_attention_costs(model.config, L, bytes_per_element=4)
    assert {k: v["flops"] for k, v in costs.items()} == counted
    w = attn.kv_b_proj.weight.nbytes
    assert costs["absorbed"]["bytes_read"] == latent.nbytes + k_rope.nbytes + w
    expanded = L * 4 * (12 + 8 + 10) * 4                          # K [4, L, 20], V [4, L, 10]
    assert costs["naive"]["bytes_read"] == latent.nbytes + k_rope.nbytes + w + expanded
    with pytest.raises(ValueError, match="MLA"):
        costmodel.mla_decode_attention_costs(ModelConfig(), 4)
