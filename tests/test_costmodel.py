"""Cost-model counts against the real modules (independent of the formulas)."""
import pytest
import torch

from tokenflow import TokenFlowModel, preset
from tokenflow.analysis.costmodel import active_param_count, param_count


def _counted(model: TokenFlowModel, include_embedding: bool) -> int:
    """Active parameters counted from the module: every tensor, minus the routed experts a
    token does not use ((E - K) / E of each MoE layer's routed expert weights)."""
    c = model.config
    total = sum(p.numel() for p in model.parameters())
    for i, layer in enumerate(model.layers):
        if layer.is_moe:
            routed = sum(p.numel() for n, p in layer.mlp.named_parameters()
                         if n.startswith("experts"))
            total -= routed * (c.num_experts - c.num_experts_per_tok) // c.num_experts
    if not include_embedding and not c.tie_word_embeddings:
        total -= model.embed_tokens.weight.numel()
    return total


@pytest.mark.parametrize("overrides", [
    dict(), dict(num_experts=4, num_experts_per_tok=1), dict(num_experts=16, num_experts_per_tok=4),
    dict(num_shared_experts=0), dict(num_shared_experts=2), dict(first_k_dense_replace=0),
    dict(first_k_dense_replace=2), dict(num_experts=0, num_experts_per_tok=0,
                                        num_shared_experts=0)])
@pytest.mark.parametrize("include_embedding", [True, False])
def test_active_param_count_matches_the_module(overrides, include_embedding):
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny", **overrides))
    assert active_param_count(model.config, include_embedding) == \
        _counted(model, include_embedding)
    assert param_count(model.config) == sum(p.numel() for p in model.parameters())


def test_active_is_less_than_total_exactly_by_the_unused_experts():
    cfg = preset("tiny", num_experts=8, num_experts_per_tok=2)
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    moe_layers = sum(cfg.layer_is_moe(i) for i in range(cfg.num_hidden_layers))
    assert param_count(cfg) - active_param_count(cfg) == moe_layers * 6 * per_expert


# ---- forward FLOPs and bytes (F5): against torch's FLOP counter and the real tensors
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from tokenflow import KVCache  # noqa: E402
from helpers import explicit_attention  # noqa: E402
from tokenflow.analysis.costmodel import expected_experts_touched, forward_bytes  # noqa: E402
from tokenflow.analysis.roofline import forward_flops  # noqa: E402

_DENSE = dict(num_experts=0, num_experts_per_tok=0, num_shared_experts=0)


@pytest.mark.parametrize("overrides", [_DENSE, dict(), dict(tie_word_embeddings=True)])
@pytest.mark.parametrize("B,cached,new", [(1, 0, 6), (2, 5, 3), (3, 9, 1)])
def test_forward_flops_match_torch_flop_counter(overrides, B, cached, new):
    """FlopCounterMode counts every matmul the forward really runs (attention as explicit
    Q K^T and weights @ V matmuls, which the counter sees)."""
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny", **overrides)).eval()
    cfg = model.config
    cache = KVCache(cfg, B, cached + new)
    # gradients on (nothing is backpropagated): the MoE then takes its explicit per-expert
    # matmul path; the counter has no formula for the inference path's grouped matmul
    with torch.enable_grad():
        if cached:
            model(torch.randint(3, cfg.vocab_size, (B, cached)), kv_cache=cache)
        counter = FlopCounterMode(display=False)
        with counter, explicit_attention():
            model(torch.randint(3, cfg.vocab_size, (B, new)), kv_cache=cache)
    assert counter.get_total_flops() == forward_flops(cfg, batch=B, new_tokens=new,
                                                      cached_tokens=cached, causal=False)["total"]


@pytest.mark.parametrize("B,cached,new", [(1, 0, 4), (4, 7, 1)])
def test_forward_bytes_of_a_dense_model_are_its_weights_and_cache(B, cached, new):
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny", **_DENSE))
    cfg = model.config
    weights = sum(p.numel() for n, p in model.named_parameters() if n != "embed_tokens.weight")
    rows = B * new * cfg.hidden_size                          # embedding rows looked up
    cache = KVCache(cfg, B, cached + new)                     # fp32: 4 bytes, every slot used
    assert forward_bytes(cfg, new_tokens=new, cached_tokens=cached, batch=B,
                         bytes_per_element=4) == (weights + rows) * 4 + cache.nbytes()


def test_forward_bytes_of_moe_read_the_experts_the_tokens_touch():
    cfg = preset("tiny")
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    moe_layers = sum(cfg.layer_is_moe(i) for i in range(cfg.num_hidden_layers))
    def kv(n):
        return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * n
    # one token: exactly the active weights (K experts per MoE layer)
    one = active_param_count(cfg, include_embedding=False) + cfg.hidden_size + kv(1)
    assert forward_bytes(cfg, new_tokens=1, cached_tokens=0, batch=1,
                         bytes_per_element=1) == pytest.approx(one)
    # a huge batch touches every expert: all weights but the embedding
    big = 10_000
    everything = param_count(cfg) - cfg.vocab_size * cfg.hidden_size
    assert forward_bytes(cfg, new_tokens=1, cached_tokens=0, batch=big,
                         bytes_per_element=1) == pytest.approx(
        everything + big * cfg.hidden_size + kv(big))
    assert everything - (active_param_count(cfg, False)) == \
        moe_layers * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert


def test_expected_experts_touched_matches_simulation():
    g = torch.Generator().manual_seed(0)
    E, K, T, trials = 8, 2, 3, 4000
    seen = 0
    for _ in range(trials):
        picks = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
        seen += picks.unique().numel()
    assert expected_experts_touched(E, K, num_tokens=T) == pytest.approx(seen / trials, rel=0.02)
    assert expected_experts_touched(E, K, num_tokens=1) == pytest.approx(K)
    assert expected_experts_touched(E, K, num_tokens=0) == 0


@pytest.mark.parametrize("kwargs", [dict(new_tokens=0), dict(cached_tokens=-1),
                                    dict(batch=0), dict(new_tokens=1.5), dict(batch=True)])
def test_forward_flops_and_bytes_reject_bad_counts(kwargs):
    from tokenflow.analysis.costmodel import arithmetic_intensity
    args = dict(batch=1, new_tokens=1, cached_tokens=0) | kwargs
    for fn in (forward_bytes, forward_flops, arithmetic_intensity):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            fn(preset("tiny"), **args)
    with pytest.raises(ValueError, match="bytes_per_element"):
        forward_bytes(preset("tiny"), new_tokens=1, bytes_per_element=0)
    with pytest.raises(ValueError, match="top_k"):
        expected_experts_touched(8, 9, num_tokens=1)


def test_one_vocabulary_a_positional_count_is_refused_not_misread():
    """Every function of a pass takes (config, *, batch, new_tokens, cached_tokens): a call in
    an old positional order raises TypeError instead of returning another step's number, and
    the keywords give forward_flops and forward_bytes the same step."""
    from tokenflow.analysis.costmodel import (arithmetic_intensity, forward_weight_bytes,
                                              max_batch_size, weight_bytes_per_device)
    cfg = preset("tiny")
    calls = [lambda: forward_flops(cfg, 4, 1, 99), lambda: forward_bytes(cfg, 1, 99, 4),
             lambda: arithmetic_intensity(cfg, 1, 99, 4), lambda: forward_weight_bytes(cfg, 4),
             lambda: kv_cache_bytes(cfg, 4, 100), lambda: weight_bytes_per_device(cfg, 1, 2),
             lambda: max_batch_size(cfg, 100, 80e9),
             lambda: moe_comm_bytes_per_token(cfg, 2, 1, 2)]
    for call in calls:
        with pytest.raises(TypeError, match="positional"):
            call()
    step = dict(batch=4, new_tokens=1, cached_tokens=99)
    intensity = forward_flops(cfg, **step)["total"] / forward_bytes(cfg, **step)
    assert arithmetic_intensity(cfg, **step) == pytest.approx(intensity, rel=1e-12)
    # a different step gives a different number: the keywords are read, not ignored
    assert arithmetic_intensity(cfg, **step) != pytest.approx(
        arithmetic_intensity(cfg, batch=1, new_tokens=4, cached_tokens=99))


# ------------------------------------------------------------------ F9: real configs
import math  # noqa: E402
from math import comb  # noqa: E402

import transformers  # noqa: E402

from tokenflow import ModelConfig  # noqa: E402
from tokenflow.analysis.costmodel import (active_param_breakdown, kv_cache_bytes,  # noqa: E402
                                 expected_nodes_per_token, kv_cache_bytes_per_token,
                                 max_batch_size,
                                 moe_comm_bytes_per_token, param_breakdown, reference_config,
                                 reference_models, weight_bytes_per_device)
from tokenflow.model.config import PRESETS  # noqa: E402


def _published(text: str) -> float:
    """"671B" / "46.7B" / "12.9B per token" / "1.6T" -> parameters."""
    num, unit = text.split()[0][:-1], text.split()[0][-1]
    return float(num) * {"B": 1e9, "T": 1e12}[unit]


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Mixtral-8x7B", "Llama-3-8B", "GPT-3-175B"])
def test_published_totals_within_1_percent(name):
    pub = reference_models()[name]["published"]
    assert abs(param_count(reference_config(name)) / _published(pub["total"]) - 1) < 0.01


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Mixtral-8x7B"])
def test_published_active_within_3_percent(name):
    """Both publishers count the embedding and the LM head (DeepSeek README_WEIGHTS:
    '36.7B including 0.9B for Embedding and 0.9B for the output Head')."""
    pub = reference_models()[name]["published"]
    got = active_param_count(reference_config(name), include_embedding=True,
                             include_lm_head=True)
    assert abs(got / _published(pub["activated"]) - 1) < 0.03


def test_deepseek_v3_kv_and_mtp_by_hand():
    raw = reference_models()["DeepSeek-V3"]["config"]
    v3 = reference_config("DeepSeek-V3")
    assert kv_cache_bytes_per_token(v3, 2) == 70_272 == \
        raw["num_hidden_layers"] * (raw["kv_lora_rank"] + raw["qk_rope_head_dim"]) * 2
    # README: MTP = 11.5B unique parameters besides the shared embedding and head
    assert abs(param_breakdown(v3)["mtp"] / 11.5e9 - 1) < 0.02


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_param_count_equals_module_for_every_preset(name):
    model = TokenFlowModel(preset(name))
    assert param_count(model.config) == sum(p.numel() for p in model.parameters())


_T = dict(vocab_size=96, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
          num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64)
_MLA = dict(kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
            moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1, num_key_value_heads=4)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8, head_dim=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, attention_bias=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(moe_intermediate_size=16, shared_expert_intermediate_size=32,
                       num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0])),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                       head_dim=16, mlp_only_layers=[0])),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(_MLA, q_lora_rank=None)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(_MLA, q_lora_rank=12, n_group=2, topk_group=1)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=8,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=96, n_embd=32, n_layer=3, n_head=4, n_positions=64,
                  bos_token_id=1, eos_token_id=2)),
}


def _hf_model(family: str):
    cfg_cls, model_cls, kw = FAMILIES[family]
    base = {} if family == "gpt2" else _T
    torch.manual_seed(0)
    hf_cfg = getattr(transformers, cfg_cls)(**{**base, **kw})
    return hf_cfg, getattr(transformers, model_cls)(hf_cfg)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_param_count_equals_hf_module_of_each_family(family):
    """Total and active counts of a tiny real HF module of each family, from its
    config.json dict alone (active: all parameters minus (E-K)/E of the routed experts,
    found by module name)."""
    hf_cfg, model = _hf_model(family)
    cfg = ModelConfig.from_hf_config(hf_cfg.to_dict())
    assert cfg.unsupported_fields == ()
    assert param_count(cfg) == sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for n, p in model.named_parameters()
                 if ".experts." in n and "shared" not in n)
    unused = routed * (cfg.num_experts - cfg.num_experts_per_tok) // max(cfg.num_experts, 1)
    assert active_param_count(cfg) == sum(p.numel() for p in model.parameters()) - unused


def test_breakdown_parts_add_up_and_name_the_families_extras():
    b = param_breakdown(ModelConfig.from_hf_config(_hf_model("qwen2_moe")[0]))
    assert b["total"] == sum(v for k, v in b.items() if k not in ("total", "mtp"))
    # shared expert (3 * 32 * 32) plus its gate (32) in the two MoE layers
    assert b["shared_experts"] == 2 * (3 * 32 * 32 + 32)
    gpt2 = ModelConfig.from_hf_config(_hf_model("gpt2")[0])
    assert (gpt2.norm_type, gpt2.position_embedding_type, gpt2.gated_mlp) == \
        ("layernorm", "absolute", False)
    a = active_param_breakdown(gpt2, include_embedding=False, include_lm_head=False)
    assert a["embedding"] == a["lm_head"] == 0


def test_unsupported_fields_raise_naming_them():
    raw = dict(reference_models()["DeepSeek-V4-Flash"]["config"])
    with pytest.raises(ValueError, match="o_groups"):
        ModelConfig.from_hf_config(raw)
    with pytest.raises(ValueError, match="sqrtsoftplus"):
        ModelConfig.from_hf_config(raw)
    d = _hf_model("llama")[0].to_dict()
    with pytest.raises(ValueError, match="my_new_field"):
        ModelConfig.from_hf_config({**d, "my_new_field": 3})
    with pytest.raises(ValueError, match="model_type 'deepseek_v4'"):
        ModelConfig.from_hf_config({**d, "model_type": "deepseek_v4"})
    v4 = reference_config("DeepSeek-V4-Pro")          # shapes usable, counts refuse
    assert "o_groups" in v4.unsupported_fields and v4.num_experts == 384
    for count in (param_count, kv_cache_bytes_per_token):
        with pytest.raises(ValueError, match="o_groups"):
            count(v4)
    with pytest.raises(ValueError, match="sliding_window"):
        TokenFlowModel(preset("tiny", sliding_window=8))


def test_rope_scaling_and_windows_are_kept():
    hf_cfg, _ = _hf_model("gpt_oss")
    cfg = ModelConfig.from_hf_config(hf_cfg.to_dict())
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.sliding_window == 8
    assert [cfg.layer_is_sliding(i) for i in range(3)] == [True, False, True]
    per_layer = 2 * 2 * 16 * 2                          # K and V, 2 heads of 16, bf16
    # 100 tokens: the two sliding layers keep 8, the full one 100
    assert kv_cache_bytes(cfg, batch=3, context_len=100) == 3 * per_layer * (8 + 100 + 8)
    assert kv_cache_bytes_per_token(cfg) == 3 * per_layer
    mistral = ModelConfig.from_hf_config(_hf_model("mistral")[0])
    assert kv_cache_bytes_per_token(mistral, context_len=80) == 3 * per_layer * 8 // 80


def test_weights_per_device_and_max_batch_by_hand():
    llama = reference_config("Llama-3-8B")
    raw = reference_models()["Llama-3-8B"]["config"]
    total = param_count(llama)
    assert weight_bytes_per_device(llama)["total"] == 2 * total
    kv_seq = 2 * raw["num_hidden_layers"] * raw["num_key_value_heads"] * raw["head_dim"] \
        * 2 * 8192                                    # 1 GiB per 8,192-token sequence
    assert max_batch_size(llama, context_len=8192,
                          device_memory_bytes=80e9) == math.floor((0.9 * 80e9 - 2 * total) / kv_seq)
    assert kv_cache_bytes(llama, batch=1, context_len=8192, tp_size=4) == kv_seq // 4
    mix = reference_config("Mixtral-8x7B")
    w1, w8 = weight_bytes_per_device(mix), weight_bytes_per_device(mix, ep_size=8)
    assert math.isclose(w8["expert_parallel"] * 8, w1["expert_parallel"])
    with pytest.raises(ValueError, match="ep_size"):
        weight_bytes_per_device(mix, ep_size=3)


def test_node_limited_all_to_all_by_hand():
    """Node-limited routing (V3 report 2.1.2), EP64 = 8 nodes of 32 experts: a token's K = 8
    experts are drawn from the 128 on its 4 chosen nodes, so a chosen node is missed with
    probability C(96, 8) / C(128, 8): 4 is the most, not the expected number."""
    v3 = reference_config("DeepSeek-V3")
    m = moe_comm_bytes_per_token(v3, ep_size=64, gpus_per_node=8, max_nodes_per_token=4)
    n = 4 * (1 - comb(96, 8) / comb(128, 8))
    assert m["nodes_per_token"] == pytest.approx(n, rel=1e-12) and 3.6 < n < 3.7
    assert m["scale_out"] == pytest.approx(n * 7 / 8 * 7168 * (2 + 2), rel=1e-12)
    one_node = moe_comm_bytes_per_token(v3, ep_size=8, gpus_per_node=8)
    assert one_node["scale_out"] == 0 and math.isclose(one_node["scale_up"],
                                                       8 * 7 / 8 * 7168 * 4)


def test_group_limited_routing_reaches_more_than_four_nodes_at_ep128():
    """DeepSeek-V3's config limits a token to topk_group = 4 of n_group = 8 groups of 32
    experts. At EP128 a node holds 16 experts, so a group spans 2 nodes: the 4 groups lie on
    8 nodes of 16 experts each, and a token reaches 8 * (1 - C(112, 8) / C(128, 8)) = 5.34
    of them on average (up to 8)."""
    v3 = reference_config("DeepSeek-V3")
    n = expected_nodes_per_token(v3, 128, gpus_per_node=8)
    assert n == pytest.approx(8 * (1 - comb(112, 8) / comb(128, 8)), rel=1e-12)
    assert 5.3 < n < 5.4
    # EP32: 4 nodes of 64 experts, 2 groups per node. Of the C(8, 4) = 70 choices of groups,
    # 6 fill 2 nodes (64 + 64 experts), 48 fill 3 (64 + 32 + 32), 16 fill 4 (32 each)
    miss64, miss32 = comb(64, 8) / comb(128, 8), comb(96, 8) / comb(128, 8)
    want = (6 * 2 * (1 - miss64) + 48 * ((1 - miss64) + 2 * (1 - miss32))
            + 16 * 4 * (1 - miss32)) / 70
    assert expected_nodes_per_token(v3, 32, gpus_per_node=8) == pytest.approx(want, rel=1e-12)
    # without a limit: K distinct experts of 256 over 4 nodes of 64
    free = v3.replace(n_group=1, topk_group=1)
    assert expected_nodes_per_token(free, 32, gpus_per_node=8) == pytest.approx(
        4 * (1 - comb(192, 8) / comb(256, 8)), rel=1e-12)
    with pytest.raises(ValueError, match="max_nodes_per_token"):
        expected_nodes_per_token(v3, 32, gpus_per_node=8, max_nodes_per_token=0)


@pytest.mark.parametrize("ep", [128, 144])
def test_decode_all_to_all_is_direct_over_infiniband(ep):
    """V3 report 3.4.2 and DeepEP's low-latency kernels: in decode every (token, expert) pair
    off the token's GPU goes point to point over IB. EP128, FP8 dispatch, BF16 combine:
    8 * 127/128 * 7168 * (1 + 2) = 170,688 B per token per MoE layer, nothing over NVLink
    (EP144: 143/144)."""
    v3 = reference_config("DeepSeek-V3")
    m = moe_comm_bytes_per_token(v3, ep, dispatch_bytes_per_element=1, combine_bytes_per_element=2,
                                 gpus_per_node=8, path="direct")
    want = 8 * (ep - 1) / ep * 7168 * 3
    assert m["scale_out"] == pytest.approx(want, rel=1e-12) and m["scale_up"] == 0
    assert m["scale_out_dispatch"] == pytest.approx(8 * (ep - 1) / ep * 7168, rel=1e-12)
    assert m["total"] == pytest.approx(want, rel=1e-12)
    if ep == 128:
        assert round(want / 1e3, 1) == 170.7
    # the hierarchical path (prefill) sends fewer IB bytes and forwards over NVLink
    h = moe_comm_bytes_per_token(v3, ep, dispatch_bytes_per_element=1, combine_bytes_per_element=2,
                                 gpus_per_node=8)
    assert h["scale_out"] < m["scale_out"] and h["scale_up"] == pytest.approx(
        8 * 7 / 8 * 7168 * 3, rel=1e-12)
    # on one node both paths are NVLink only
    one = moe_comm_bytes_per_token(v3, 8, dispatch_bytes_per_element=1, combine_bytes_per_element=2,
                                   gpus_per_node=8, path="direct")
    assert one["scale_out"] == 0 and one["total"] == pytest.approx(
        moe_comm_bytes_per_token(v3, 8, dispatch_bytes_per_element=1,
                                 combine_bytes_per_element=2)["total"])
    with pytest.raises(ValueError, match="path"):
        moe_comm_bytes_per_token(v3, ep, gpus_per_node=8, path="ring")


# ---- found by planting bugs (R1 review): each test names a neighbour the suite missed
def test_active_params_without_embedding_keep_a_tied_lm_head():
    untied = preset("tiny")
    tied = untied.replace(tie_word_embeddings=True)
    H, V = untied.hidden_size, untied.vocab_size
    assert active_param_count(untied, True) - active_param_count(untied, False) == V * H
    assert active_param_count(tied, False) == active_param_count(tied, True)


# ---- found by planting bugs (review of F9)
def test_forward_bytes_with_ep_counts_the_whole_ep_groups_tokens():
    """ep_size=4, tp_size=1, one token per device: the device's E/4 experts serve the 4 tokens
    of the EP group, so each is untouched with probability (1 - K/E)**4 (hand formula)."""
    from tokenflow import preset
    cfg = preset("tiny")
    E, K, H, ep = cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size, 4
    moe_layers = sum(cfg.layer_is_moe(i) for i in range(cfg.num_hidden_layers))
    routed = moe_layers * E * 3 * H * cfg.moe_intermediate_size
    kv1 = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    device_weights = param_count(cfg) - cfg.vocab_size * H - routed * (ep - 1) / ep
    untouched = (routed / ep) * (1 - K / E) ** ep
    expected = device_weights - untouched + H + kv1
    assert forward_bytes(cfg, new_tokens=1, cached_tokens=0, batch=1, bytes_per_element=1,
                         ep_size=ep) == pytest.approx(expected, rel=1e-12)


# ---- C1: what the sources say (issue 26)
def test_dense_reads_all_weights_moe_only_the_experts_its_tokens_touch():
    """Item 1: a dense pass reads every weight (but the embedding table) whatever the tokens;
    the tiny MoE's decode step reads 2 of 8 experts per layer, its 5-token prefill more, and a
    huge batch all of them."""
    from tokenflow.analysis.costmodel import forward_weight_bytes, param_breakdown
    dense, moe = preset("tiny-dense"), preset("tiny")
    for T in (1, 5, 1000):
        w = forward_weight_bytes(dense, new_tokens=T, bytes_per_element=4)
        table = dense.vocab_size * dense.hidden_size
        assert w["total"] == (param_count(dense) - table + T * dense.hidden_size) * 4
    b = param_breakdown(moe)
    E, K = moe.num_experts, moe.num_experts_per_tok
    one, five, many = (forward_weight_bytes(moe, new_tokens=T, bytes_per_element=4) for T in (1, 5,
                                                                                              100_000))
    assert one["routed_experts"] == pytest.approx(b["routed_experts"] * K / E * 4)
    assert one["experts_touched"] == pytest.approx(K)
    assert one["total"] < five["total"] < many["total"]
    assert many["routed_experts"] == pytest.approx(b["routed_experts"] * 4)
    whole = param_count(moe) * 4
    assert one["total"] < 0.55 * whole           # about 0.83 MB of 1.64 MB
    assert forward_weight_bytes(moe, new_tokens=5,
                                bytes_per_element=4)["total"] + 0 == pytest.approx(
        forward_bytes(moe, new_tokens=5, cached_tokens=0, batch=1,
                      bytes_per_element=4) - kv_cache_bytes(moe, batch=1, context_len=5,
                                                            bytes_per_element=4))


def test_activated_parameters_quoted_precisely():
    """Item 8: README_WEIGHTS gives 36.7B; the count without the embedding lookup is 36.6B."""
    pub = reference_models()["DeepSeek-V3"]["published"]
    assert pub["activated_precise"] == "36.7B" and "0.9B" in pub["activated_precise_note"]
    v3 = reference_config("DeepSeek-V3")
    assert round(active_param_count(v3, include_embedding=False) / 1e9, 1) == 36.6
    assert abs(active_param_count(v3) / _published(pub["activated_precise"]) - 1) < 0.03


def test_node_arguments_are_honoured_and_the_a2a_table_reconciles():
    """With gpus_per_node, ``total`` is what crosses the two links; the table's rows are the
    function's numbers; on one node the hierarchical and the flat counts agree."""
    from tokenflow.analysis.costmodel import A2A_TABLE_COLUMNS, moe_a2a_table
    v3 = reference_config("DeepSeek-V3")
    K, H = v3.num_experts_per_tok, v3.hidden_size
    m = moe_comm_bytes_per_token(v3, 32, dispatch_bytes_per_element=1, combine_bytes_per_element=2,
                                 gpus_per_node=8, max_nodes_per_token=4)
    assert math.isclose(m["total"], m["scale_out"] + m["scale_up"])
    assert math.isclose(m["scale_out_dispatch"] * 2, m["scale_out_combine"])   # fp8 vs bf16
    n = 4 * (1 - comb(192, 8) / comb(256, 8))        # 4 nodes of 64, all 4 allowed, K = 8
    assert m["scale_out"] == pytest.approx(n * 3 / 4 * H * 3, rel=1e-12)
    assert math.isclose(m["scale_up"], K * 7 / 8 * H * 3)
    assert m["total"] != pytest.approx(moe_comm_bytes_per_token(v3, 32,
                                                                dispatch_bytes_per_element=1,
                                                                combine_bytes_per_element=2)["total"])
    one = moe_comm_bytes_per_token(v3, 8, dispatch_bytes_per_element=1, combine_bytes_per_element=2,
                                   gpus_per_node=8)
    assert math.isclose(one["total"],
                        moe_comm_bytes_per_token(v3, 8, dispatch_bytes_per_element=1,
                                                 combine_bytes_per_element=2)["total"])
    rows = moe_a2a_table(v3, 144)
    assert all(len(r) == len(A2A_TABLE_COLUMNS) for r in rows)
    got = {(r[0], r[1]): r[4] for r in rows}
    assert got[("flat, all remote, bf16", "any")] == pytest.approx(2 * K * H * 2 / 2**10)
    assert got[("flat, all remote, fp8 dispatch, bf16 combine", "any")] == \
        pytest.approx(K * H * 3 / 2**10)
    lim = moe_comm_bytes_per_token(v3, 144, dispatch_bytes_per_element=1,
                                   combine_bytes_per_element=2, gpus_per_node=8)
    grouped = "EP144, 8 GPUs/node, hierarchical, 4 of 8 groups"
    assert got[(grouped, "InfiniBand")] == pytest.approx(lim["scale_out"] / 2**10)
    assert got[(grouped, "both")] == pytest.approx(lim["total"] / 2**10)
    assert got[("EP144, 8 GPUs/node, direct (decode)", "InfiniBand")] == \
        pytest.approx(K * 143 / 144 * H * 3 / 2**10)


# ---- the one-KV-head-per-device floor (tp > num_key_value_heads) ----
@pytest.mark.parametrize("name, tp", [("Llama-3-8B", 16), ("Llama-3-8B", 32),
                                      ("Llama-3-8B", 8), ("Llama-3-8B", 4)])
def test_kv_cache_keeps_one_head_per_device_beyond_the_kv_heads(name, tp):
    """Llama-3-8B has 8 KV heads: tp=16 or 32 still stores one whole head per device (each
    head is replicated tp/8 times), the same bytes as tp=8; below 8 the heads split."""
    c = reference_config(name)
    nkv, D, L = c.num_key_value_heads, c.head_dim, c.num_hidden_layers
    per_token = 2 * L * max(nkv // tp, 1) * D * 2
    assert kv_cache_bytes(c, batch=2, context_len=4096, tp_size=tp) == 2 * 4096 * per_token
    if tp > nkv:
        assert kv_cache_bytes(c, batch=2, context_len=4096, tp_size=tp) == \
            kv_cache_bytes(c, batch=2, context_len=4096, tp_size=nkv)
    # max_batch_size divides by the floored per-sequence bytes (weights: free memory huge)
    free = 1e15
    assert max_batch_size(c, context_len=4096, device_memory_bytes=free / 0.9, tp_size=tp,
                          ep_size=1) == int(
        (free - weight_bytes_per_device(c, tp_size=tp)["total"]) // (4096 * per_token))


def test_mqa_and_sliding_layers_keep_the_floor():
    mqa = preset("tiny-dense", num_key_value_heads=1)
    one = kv_cache_bytes(mqa, batch=1, context_len=32)
    for tp in (2, 4):                                    # one K/V head: never split
        assert kv_cache_bytes(mqa, batch=1, context_len=32, tp_size=tp) == one
    win = preset("tiny-dense", sliding_window=8, num_key_value_heads=2)
    assert kv_cache_bytes(win, batch=1, context_len=32, tp_size=4) == kv_cache_bytes(win, batch=1,
                                                                                     context_len=32,
                                                                                     tp_size=2) \
        == kv_cache_bytes(win, batch=1, context_len=32) // 2 == 3 * 8 * 2 * 32 * 2
    with pytest.raises(ValueError, match="tp_size"):
        # neither divides the other
        kv_cache_bytes(win, batch=1, context_len=32, tp_size=3)
    # MLA's latent is replicated on every device whatever tp
    v3 = reference_config("DeepSeek-V3")
    assert kv_cache_bytes(v3, batch=1, context_len=100, tp_size=8) == kv_cache_bytes(v3, batch=1,
                                                                                     context_len=100)


# ---- issue C1r item 5: a value flagged UNVERIFIED is never labelled published ----------------
def test_every_flagged_value_of_models_json_is_reported_unverified():
    """Over every field of every bundled config: flagged when the entry's sources or the value
    itself say UNVERIFIED (GPT-3's vocab_size is the value-level kind an entry-level check
    misses), and only then."""
    from tokenflow.analysis.costmodel import reference_value_unverified
    models = reference_models()
    for name, entry in models.items():
        whole = "unverified" in " ".join(entry["config_source"]).lower()
        for field, value in entry["config"].items():
            assert reference_value_unverified(name, field) == (
                whole or "unverified" in str(value).lower()), (name, field)
    assert reference_value_unverified("GPT-3-175B", "vocab_size")
    assert not reference_value_unverified("GPT-3-175B", "hidden_size")
    assert reference_value_unverified("DeepSeek-V4-Pro", "n_routed_experts")
    assert not reference_value_unverified("DeepSeek-V3", "n_routed_experts")
    with pytest.raises(ValueError, match="name"):
        reference_value_unverified("GPT-5", "vocab_size")
    with pytest.raises(ValueError, match="field"):
        reference_value_unverified("GPT-3-175B", "n_routed_experts")


# ---- K/V projection weights follow the KV cache's one-head-per-device rule -------------------
MiB = 2 ** 20


def _attn_only(nkv, H=8192, nh=64, L=1, **kw):
    """Dense config whose other parts are tiny (V = I = 128), head_dim 128."""
    from tokenflow import ModelConfig
    return ModelConfig(vocab_size=128, hidden_size=H, num_hidden_layers=L,
                       num_attention_heads=nh, num_key_value_heads=nkv, intermediate_size=128,
                       num_experts=0, num_experts_per_tok=0, num_shared_experts=0,
                       max_position_embeddings=8192, pad_token_id=0, bos_token_id=0,
                       eos_token_id=0, **kw)


@pytest.mark.parametrize("nkv, H, nh, tp, mib", [
    # 8 KV heads, H 8192, 64 heads of 128 (Llama-3-70B's attention), bf16. q_proj + o_proj:
    # 2 * 8192 * 8192 * 2 B = 256 MiB split over tp; k_proj + v_proj: 32 MiB, one head of
    # 4 MiB is the least a device holds.
    (8, 8192, 64, 1, 256 + 32), (8, 8192, 64, 4, 64 + 8), (8, 8192, 64, 8, 32 + 4),
    (8, 8192, 64, 16, 16 + 4), (8, 8192, 64, 32, 8 + 4),
    # MQA, H 4096, 32 heads: q, o 64 MiB; its one K/V head 2 MiB sits on every device
    (1, 4096, 32, 1, 64 + 2), (1, 4096, 32, 8, 8 + 2), (1, 4096, 32, 32, 2 + 2)])
def test_kv_projection_weights_are_replicated_beyond_the_kv_heads(nkv, H, nh, tp, mib):
    """tp 16 with 8 KV heads holds 20 MiB of attention per layer (it reported 18: the K/V
    weights were divided by 16 as if a head could be split); MQA at tp 8 holds 10 MiB
    (reported 8.25)."""
    from tokenflow.analysis.costmodel import forward_weight_bytes
    c = _attn_only(nkv, H, nh)
    assert forward_weight_bytes(c, new_tokens=1, bytes_per_element=2,
                                tp_size=tp)["attention"] == mib * MiB
    rest = (2 * 128 * H + 3 * H * 128) * 2 / tp                # embedding, lm_head, FFN
    assert weight_bytes_per_device(c, tp_size=tp)["tensor_parallel"] == mib * MiB + rest
    assert weight_bytes_per_device(c, tp_size=tp)["replicated"] == 3 * H * 2          # 3 RMSNorms


def test_max_batch_size_counts_the_replicated_kv_weights():
    """Llama-3-70B's shape (80 layers, H 8192, 64 heads, 8 KV heads, I 28672, V 128256) at
    tp 16, bf16, 8,192-token sequences on 80 GB at 90 %. Per device: attention 80 * 20 MiB,
    FFN 80 * 3 * 8192 * 28672 * 2 / 16 B = 80 * 84 MiB, embedding + head
    2 * 128256 * 8192 * 2 / 16 = 262,668,288 B, norms 161 * 8192 * 2 = 2,637,824 B:
    8,989,458,432 B. KV per sequence: 80 * 8192 * 2 * 128 * 2 = 335,544,320 B (one head).
    (72e9 - 8,989,458,432) / 335,544,320 = 187.8 -> 187 (it said 188: 160 MiB of K/V
    weights too few)."""
    from tokenflow import ModelConfig
    c = ModelConfig(vocab_size=128256, hidden_size=8192, num_hidden_layers=80,
                    num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672,
                    num_experts=0, num_experts_per_tok=0, num_shared_experts=0,
                    max_position_embeddings=8192, pad_token_id=0, bos_token_id=0,
                    eos_token_id=0)
    assert weight_bytes_per_device(c, tp_size=16)["total"] == 8_989_458_432
    assert kv_cache_bytes(c, batch=1, context_len=8192, tp_size=16) == 335_544_320
    assert max_batch_size(c, context_len=8192, device_memory_bytes=80e9, tp_size=16) == 187


def test_mla_latent_projection_is_replicated_like_its_cache():
    """MLA, H 64, 4 heads, no q LoRA, kv_lora_rank 32, RoPE 8, nope 16, v 16, per layer:
    q_proj 64*4*24 = 6144, kv_b 32*4*32 = 4096, o 4*16*64 = 4096 split over tp 4 (3584);
    kv_a_proj_with_mqa 64*40 = 2560 and kv_a_layernorm 32 on every device: 6176."""
    from tokenflow import ModelConfig
    from tokenflow.analysis.costmodel import forward_weight_bytes
    c = ModelConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, intermediate_size=32, num_experts=0,
                    num_experts_per_tok=0, num_shared_experts=0, kv_lora_rank=32,
                    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
    assert forward_weight_bytes(c, new_tokens=1, bytes_per_element=1,
                                tp_size=4)["attention"] == 2 * 6176
    assert forward_weight_bytes(c, new_tokens=1,
                                bytes_per_element=1)["attention"] == 2 * (6144 + 4096 + 4096 + 2592)


def test_kv_heads_split_that_is_neither_divisor_nor_multiple_is_refused_for_weights_too():
    c = _attn_only(6, H=768, nh=12)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        weight_bytes_per_device(c, tp_size=4)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        kv_cache_bytes(c, batch=1, context_len=8, tp_size=4)
    assert weight_bytes_per_device(c, tp_size=3)["total"] > 0 and weight_bytes_per_device(c,
                                                                                          tp_size=12)


# ---- expert-parallel groups smaller than a node: NVLink over the GPUs in use --------------
@pytest.mark.parametrize("ep, scale_up_elems, scale_out_elems", [
    (1, 0, 0), (2, 8 * 1 / 2 * 7168, 0), (4, 8 * 3 / 4 * 7168, 0), (8, 8 * 7 / 8 * 7168, 0),
    # two nodes, no group limit: a token's 8 distinct experts of 256 reach
    # 2 * (1 - C(128, 8) / C(256, 8)) nodes, half of them remote
    (16, 8 * 7 / 8 * 7168, 2 * (1 - comb(128, 8) / comb(256, 8)) / 2 * 7168)])
def test_ep_group_within_a_node_counts_nvlink_over_the_gpus_in_use(ep, scale_up_elems,
                                                                   scale_out_elems):
    """DeepSeek-V3 (K = 8, H = 7168), 8 GPUs per node. EP over 4 GPUs of one node: a pair
    stays on its GPU with probability 1/4 (not 1/8): NVLink carries 8 * 3/4 * 7168 =
    43,008 elements per direction, nothing crosses InfiniBand; FP8 dispatch (1 B), BF16
    combine (2 B)."""
    v3 = reference_config("DeepSeek-V3").replace(n_group=1, topk_group=1)
    m = moe_comm_bytes_per_token(v3, ep, dispatch_bytes_per_element=1, combine_bytes_per_element=2,
                                 gpus_per_node=8)
    assert m["scale_up_dispatch"] == pytest.approx(scale_up_elems)
    assert m["scale_up_combine"] == pytest.approx(2 * scale_up_elems)
    assert m["scale_out_dispatch"] == pytest.approx(scale_out_elems)
    assert m["total"] == pytest.approx(3 * (scale_up_elems + scale_out_elems))
    if ep <= 8:                             # one node: the flat numbers, uniform routing
        flat = moe_comm_bytes_per_token(v3, ep, dispatch_bytes_per_element=1,
                                        combine_bytes_per_element=2)
        assert m["total"] == pytest.approx(flat["total"]) and m["nodes_per_token"] == 1
    from tokenflow.analysis.costmodel import moe_a2a_table
    rows = {(r[0], r[1]): r[2:] for r in moe_a2a_table(v3, ep)}
    nv = rows[(f"EP{ep}, 8 GPUs/node, hierarchical, no routing limit", "NVLink")]
    assert nv[0] == pytest.approx(scale_up_elems / 2**10) and \
        nv[1] == pytest.approx(2 * scale_up_elems / 2**10)


def test_ep_group_that_does_not_tile_a_node_is_refused():
    v3 = reference_config("DeepSeek-V3")
    for ep, g in ((3, 8), (12, 8), (4, 6)):
        with pytest.raises(ValueError, match="gpus_per_node"):
            moe_comm_bytes_per_token(v3, ep, gpus_per_node=g)
    with pytest.raises(ValueError, match="gpus_per_node"):
        moe_comm_bytes_per_token(v3, 8, gpus_per_node=0)
