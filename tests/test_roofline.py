"""FLOPs and roofline time against independent values (torch's FLOP counter, hand sums)."""
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tokenflow import KVCache, TokenFlowModel, preset
from tokenflow.analysis.costmodel import param_breakdown, reference_config
from tokenflow.analysis.roofline import (
    HARDWARE,
    Deployment,
    flops_per_token,
    forward_flops,
    hardware,
    probe_cpu,
    roofline,
)


def _counted(model, ids, cache=None) -> int:
    """FLOPs the counter sees. Gradients are on (nothing is backpropagated) so that the MoE
    takes its explicit dispatch -> per-expert matmul -> combine path: the counter has no
    formula for the grouped matmul of the inference path, which does the same arithmetic."""
    with torch.enable_grad(), FlopCounterMode(display=False) as fc:
        model(ids, kv_cache=cache)
    return fc.get_total_flops()


@pytest.mark.parametrize("name", ["tiny", "tiny-dense"])
def test_forward_flops_match_torch_flop_counter(name):
    """Prefill of [2, 16] and one decode step after it. On CPU the counter sees the
    matmuls (aten.mm) but not the fused attention kernel, so everything except
    ``attention_scores`` must match exactly and the total within 10%."""
    torch.manual_seed(0)
    cfg = preset(name)
    model = TokenFlowModel(cfg).eval()
    ids = torch.randint(3, cfg.vocab_size, (2, 16))
    cache = KVCache(cfg, 2, 32)
    for f, counted in ((forward_flops(cfg, batch=2, new_tokens=16, causal=False),
                        _counted(model, ids, cache)),
                       (forward_flops(cfg, batch=2, new_tokens=1, cached_tokens=16),
                        _counted(model, ids[:, :1],
                                                                        cache))):
        assert f["total"] - f["attention_scores"] == counted
        assert abs(f["total"] / counted - 1) < 0.10


def test_decode_flops_by_hand():
    """Dense model, context 1: two FLOPs per weight a token multiplies (all but the
    embedding table and the norms) plus q.k and weights @ V over one key per head."""
    llama = reference_config("Llama-3-8B")
    b = param_breakdown(llama)
    weights = b["attention"] + b["dense_ffn"] + b["lm_head"]
    core = 2 * 32 * 1 * (128 + 128) * 32
    assert flops_per_token(llama, 1) == 2 * weights + core
    # prefill: per token the same matrices, LM head once for the prompt
    pre = flops_per_token(llama, 1024, "prefill")
    assert pre < flops_per_token(llama, 1024) + 1 and pre > 2 * (weights - b["lm_head"])


def test_roofline_decode_is_memory_bound_and_adds_up():
    ds = reference_config("DeepSeek-V3")
    h800 = hardware("H800")
    r = roofline(ds, Deployment(h800, ep_size=8, bytes_per_param=1), phase="decode", batch=32,
                 context_len=4096)
    assert r["bound"] == "memory"
    assert math.isclose(r["compute_s"], 32 * flops_per_token(ds, 4096) / h800.peak_flops["bf16"])
    assert math.isclose(r["step_s"], max(r["compute_s"], r["memory_s"], r["comm_s"]))
    assert math.isclose(r["tokens_per_s"], 32 / r["step_s"])
    p = roofline(ds, Deployment(h800, ep_size=64, bytes_per_param=1), phase="prefill", batch=1,
                 context_len=4096)
    assert p["compute_s"] > p["memory_s"]             # long prompts are compute-heavy
    with pytest.raises(ValueError, match="dtype"):
        roofline(ds, Deployment(h800, ep_size=64, dtype="int3"), phase="decode", batch=1,
                 context_len=16)


def test_presets_cite_sources_and_cpu_probe_smoke():
    for hw in HARDWARE.values():
        assert hw.source and hw.peak_flops["bf16"] > 0 and hw.memory_bandwidth > 0
    with pytest.raises(ValueError, match="name"):
        hardware("TPU-v9")
    cpu = probe_cpu(0.05)
    assert cpu.peak_flops["fp32"] > 1e8 and cpu.memory_bandwidth > 1e8
    assert "measured" in cpu.source
    r = roofline(preset("tiny-dense"), Deployment(cpu, dtype="fp32"), phase="decode", batch=1,
                 context_len=16)
    assert r["tokens_per_s"] > 0 and r["comm_s"] == 0


# ---- one bytes formula: roofline's memory term is costmodel.forward_bytes
from helpers import explicit_attention  # noqa: E402
from tokenflow.analysis.costmodel import forward_bytes  # noqa: E402
from tokenflow.analysis.roofline import arithmetic_intensity, ridge_point  # noqa: E402


@pytest.mark.parametrize("name", ["tiny", "tiny-dense", "Llama-3-8B", "DeepSeek-V3"])
@pytest.mark.parametrize("phase,batch,context", [("decode", 4, 100), ("prefill", 2, 64)])
def test_roofline_memory_is_forward_bytes(name, phase, batch, context):
    """tp = ep = 1: a decode step feeds 1 token after ``context - 1``, a prefill ``context``
    after none; the memory term must be exactly forward_bytes of that pass."""
    cfg = preset(name) if name.startswith("tiny") else reference_config(name)
    new = 1 if phase == "decode" else context
    r = roofline(cfg, Deployment(hardware("H100"), bytes_per_param=1, kv_bytes_per_element=2),
                 phase=phase, batch=batch, context_len=context)
    assert r["memory_bytes"] == forward_bytes(cfg, new_tokens=new, cached_tokens=context - new,
                                              batch=batch, bytes_per_element=1,
                                              kv_bytes_per_element=2)


def test_expert_parallel_reads_only_the_device_experts():
    """EP spreads the routed experts: with a huge batch every expert is touched, so one of
    ``ep`` devices reads ``1/ep`` of the routed-expert bytes the single device reads."""
    cfg = preset("tiny")
    b = param_breakdown(cfg)
    one = forward_bytes(cfg, new_tokens=1, cached_tokens=0, batch=10_000, bytes_per_element=1)
    four = forward_bytes(cfg, new_tokens=1, cached_tokens=0, batch=10_000, bytes_per_element=1,
                         ep_size=4)
    assert one - four == pytest.approx(b["routed_experts"] * 3 / 4)


@pytest.mark.parametrize("B,cached,new", [(1, 0, 8), (3, 6, 1)])
def test_arithmetic_intensity_is_counted_flops_over_tensor_bytes(B, cached, new):
    """Numerator from torch's FLOP counter (attention as explicit matmuls), denominator from the
    real tensors: weights but the embedding table, embedding rows looked up, the cache."""
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny-dense")).eval()
    cfg = model.config
    cache = KVCache(cfg, B, cached + new)                       # fp32, every slot used
    with torch.no_grad():
        if cached:
            model(torch.randint(3, cfg.vocab_size, (B, cached)), kv_cache=cache)
        with FlopCounterMode(display=False) as fc, explicit_attention():
            model(torch.randint(3, cfg.vocab_size, (B, new)), kv_cache=cache)
    weights = sum(p.numel() for n, p in model.named_parameters() if n != "embed_tokens.weight")
    nbytes = (weights + B * new * cfg.hidden_size) * 4 + cache.nbytes()
    assert arithmetic_intensity(cfg, new_tokens=new, cached_tokens=cached, batch=B,
                                bytes_per_element=4, causal=False) == pytest.approx(
        fc.get_total_flops() / nbytes, rel=1e-12)


def test_ridge_point_of_h100_from_its_datasheet():
    assert ridge_point(hardware("H100")) == pytest.approx(989e12 / 3.35e12)
    assert ridge_point(hardware("H100"), "fp8") == pytest.approx(1979e12 / 3.35e12)
    with pytest.raises(ValueError, match="dtype"):
        ridge_point(hardware("H100"), "int3")


# ---- C1: the DeepSeek roofline models what its sources say (issue 26)
from tokenflow.analysis.costmodel import moe_comm_bytes_per_token, num_moe_layers  # noqa: E402


def test_links_overlap_and_combine_is_bf16():
    """Item 5: NVLink and InfiniBand run at the same time (V3 report 3.2.2), so comm time is
    the longer of the two; dispatch FP8 (weights' byte) and combine BF16 (day-6 note)."""
    ds, h800 = reference_config("DeepSeek-V3"), hardware("H800")
    r = roofline(ds, Deployment(h800, ep_size=32, dtype="fp8", bytes_per_param=1), phase="prefill",
                 batch=2, context_len=4989)
    m = moe_comm_bytes_per_token(ds, 32, dispatch_bytes_per_element=1, combine_bytes_per_element=2,
                                 gpus_per_node=8)
    T = 2 * 4989
    assert r["scale_out_bytes"] == pytest.approx(T * num_moe_layers(ds) * m["scale_out"])
    assert r["scale_up_bytes"] == pytest.approx(T * num_moe_layers(ds) * m["scale_up"])
    assert r["scale_up_s"] > 0 and r["scale_out_s"] > 0
    assert r["comm_s"] == pytest.approx(max(r["scale_up_bytes"] / h800.scale_up_bandwidth,
                                            r["scale_out_bytes"] / h800.scale_out_bandwidth))


def test_published_totals_imply_the_reported_nodes():
    """Item 6: 608B input tokens at 73.7k/s per node and 168B output tokens at 14.8k/s per
    node over 24 hours are 95.5 + 131.4 = 226.9 nodes, against the reported 226.75: the rates
    are per node and per phase."""
    from tokenflow.analysis.roofline import DEEPSEEK_V3_SERVICE, implied_nodes
    n = implied_nodes()
    assert round(n["prefill"], 1) == 95.5 and round(n["decode"], 1) == 131.4
    assert round(n["total"], 1) == 226.9 and n["reported"] == 226.75
    assert abs(n["total"] / n["reported"] - 1) < 0.001
    assert DEEPSEEK_V3_SERVICE["cache_hit_tokens"] / DEEPSEEK_V3_SERVICE["input_tokens"] == \
        pytest.approx(DEEPSEEK_V3_SERVICE["cache_hit_rate"], abs=5e-4)
    with pytest.raises(ValueError, match="missing"):
        implied_nodes({"input_tokens": 1})


def test_mla_decode_counts_the_absorbed_form_that_runs():
    """Item 7: a decode step of DeepSeek-V3 runs FlashMLA's MQA mode, keys 576 wide
    (r + dr) and values 512 wide (r), so attention does 2 * 128 * (576 + 512) FLOPs per
    cached token and layer, about 242 FLOPs per bf16 KV byte: near the H800's 295 ridge.
    A prefill still counts the naive per-head form."""
    ds = reference_config("DeepSeek-V3")
    L, nh = 4096, ds.num_attention_heads
    f = forward_flops(ds, batch=1, new_tokens=1, cached_tokens=L - 1)
    per_key = f["attention_scores"] / (ds.num_hidden_layers * L)
    assert per_key == 2 * nh * (576 + 512)
    per_kv_byte = per_key / (576 * 2)
    assert 240 < per_kv_byte < 243 and per_kv_byte < ridge_point(hardware("H800"))
    p = forward_flops(ds, batch=1, new_tokens=16, causal=False)
    assert p["attention_scores"] == 16 * ds.num_hidden_layers * 2 * nh * 16 * (192 + 128)
    # query i meets i + 1 keys: 136
    causal = forward_flops(ds, batch=1, new_tokens=16)
    assert causal["attention_scores"] == 136 * ds.num_hidden_layers * 2 * nh * (192 + 128)


# ---- kinds a planted bug got past ----------------------------------
@pytest.mark.parametrize("B, S, past", [(3, 7, 0), (4, 1, 5), (2, 9, 4)])
def test_lm_head_last_at_batch_above_one_matches_the_counter(B, S, past):
    """``logits="last"`` computes one LM-head row per sequence (``B`` rows), as the model
    does with ``logits_to_keep=1``: counted by torch at batch > 1, not only at batch 1."""
    torch.manual_seed(0)
    cfg = preset("tiny-dense")
    model = TokenFlowModel(cfg).eval()
    ids = torch.randint(3, cfg.vocab_size, (B, past + S))
    cache = KVCache(cfg, B, past + S)
    if past:
        model(ids[:, :past], kv_cache=cache)
    with torch.enable_grad(), FlopCounterMode(display=False) as fc:
        model(ids[:, past:], kv_cache=cache, logits_to_keep=1)
    last = forward_flops(cfg, batch=B, new_tokens=S, cached_tokens=past, logits="last",
                         causal=False)
    every = forward_flops(cfg, batch=B, new_tokens=S, cached_tokens=past, logits="all",
                          causal=False)
    assert last["total"] - last["attention_scores"] == fc.get_total_flops()
    H, V = cfg.hidden_size, cfg.vocab_size
    assert last["lm_head"] == B * 2 * H * V and every["lm_head"] == B * S * 2 * H * V
    assert every["total"] - last["total"] == (S - 1) * B * 2 * H * V


@pytest.mark.parametrize("name", ["tiny", "Llama-3-8B"])
def test_prefill_flops_scale_with_batch(name):
    """A prefill of B prompts is B prefills of one (each computes its own last logits)."""
    cfg = preset(name) if name == "tiny" else reference_config(name)
    one = forward_flops(cfg, batch=1, new_tokens=64, logits="last")
    for B in (2, 5):
        many = forward_flops(cfg, batch=B, new_tokens=64, logits="last")
        assert {k: many[k] for k in many} == {k: B * one[k] for k in one}
        r1 = roofline(cfg, Deployment(hardware("H100")), phase="prefill", batch=1, context_len=64)
        rB = roofline(cfg, Deployment(hardware("H100")), phase="prefill", batch=B, context_len=64)
        assert rB["flops"] == pytest.approx(B * r1["flops"], rel=1e-12)
        assert r1["flops"] == pytest.approx(one["total"], rel=1e-12)


@pytest.mark.parametrize("nkv, tp", [(1, 2), (1, 8), (2, 4), (2, 8), (8, 16), (4, 4),
                                     (4, 2)])
def test_roofline_memory_keeps_one_kv_head_per_device(nkv, tp):
    """With tp > num_key_value_heads each device still holds (and reads) one whole KV head
    (the heads are replicated, as vLLM does), so the KV bytes per device stop shrinking."""
    from tokenflow.analysis.costmodel import forward_bytes, kv_cache_bytes
    cfg = preset("tiny-dense", hidden_size=128, num_attention_heads=16,
                 num_key_value_heads=nkv, head_dim=8)
    per_head = 2 * cfg.head_dim * 2 * cfg.num_hidden_layers        # K+V, bf16, all layers
    heads = max(nkv / tp, 1)
    B, ctx = 3, 40
    assert kv_cache_bytes(cfg, batch=B, context_len=ctx, tp_size=tp) == B * ctx * heads * per_head
    # the roofline's memory grows by exactly those bytes per extra cached token per sequence
    hw = hardware("H100")
    grow = (roofline(cfg, Deployment(hw, tp_size=tp), phase="decode", batch=B,
                     context_len=ctx + 10)["memory_bytes"]
            - roofline(cfg, Deployment(hw, tp_size=tp), phase="decode", batch=B,
                       context_len=ctx)["memory_bytes"])
    assert grow == pytest.approx(B * 10 * heads * per_head, rel=1e-9)
    step = dict(batch=B, new_tokens=1, tp_size=tp)
    assert forward_bytes(cfg, **step, cached_tokens=ctx + 9) - forward_bytes(
        cfg, **step, cached_tokens=ctx - 1) == pytest.approx(B * 10 * heads * per_head, rel=1e-9)


# ---- issue C1r item 2: the attention core runs in BF16, the other matmuls in FP8 -------------
def _deepseek_step(phase):
    """Chapter 7's two DeepSeek-V3 steps on one H800: decode of 88 sequences at context 4,989
    on EP128, prefill of one 4,989-token prompt on EP32, as the day-6 note runs them."""
    ds = reference_config("DeepSeek-V3")
    batch, ep = (88, 128) if phase == "decode" else (1, 32)
    return ds, batch, roofline(ds,
                               Deployment(hardware("H800"), ep_size=ep, dtype="fp8",
                                          attention_dtype="bf16", bytes_per_param=1,
                                          kv_bytes_per_element=2, dispatch_bytes_per_element=1,
                                          combine_bytes_per_element=2), phase=phase, batch=batch,
                               context_len=4989)


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_deepseek_compute_charges_attention_at_bf16_and_the_rest_at_fp8(phase):
    """DeepSeek's day-6 note: "matrix multiplications [...] FP8", "core MLA computations
    [...] BF16" (FlashMLA's dense decode kernel is BF16). So the compute time is the attention
    core's FLOPs at the H800's BF16 peak plus every other part's at its FP8 peak, summed here
    from forward_flops' parts, not from the roofline's own total."""
    ds, batch, r = _deepseek_step(phase)
    f = forward_flops(ds, batch=1, new_tokens=1, cached_tokens=4988) if phase == "decode" else \
        forward_flops(ds, batch=1, new_tokens=4989, cached_tokens=0, logits="last")
    attn = batch * f["attention_scores"]
    rest = batch * sum(f[k] for k in ("attention_proj", "dense_ffn", "routed_experts",
                                      "shared_experts", "router", "lm_head"))
    assert r["attention_flops"] == pytest.approx(attn, rel=1e-12)
    assert r["compute_s"] == pytest.approx(attn / 989e12 + rest / 1979e12, rel=1e-12)
    # charged all at FP8, the compute time would be shorter
    all_fp8 = (attn + rest) / 1979e12
    assert r["compute_s"] > {"decode": 1.2, "prefill": 1.05}[phase] * all_fp8
    # chapter 7's figures: compute 10.8 ms (decode) and 242.9 ms (causal prefill); both steps
    # are bound by communication (decode: every pair over InfiniBand, V3 report 3.4.2)
    assert round(r["compute_s"] * 1e3, 1) == {"decode": 10.8, "prefill": 242.9}[phase]
    assert r["bound"] == "comm"


def test_attention_dtype_none_charges_everything_at_dtype_and_is_checked():
    ds, h800 = reference_config("DeepSeek-V3"), hardware("H800")
    r = roofline(ds, Deployment(h800, ep_size=64, dtype="fp8"), phase="decode", batch=8,
                 context_len=1024)
    assert r["compute_s"] == pytest.approx(r["flops"] / h800.peak_flops["fp8"], rel=1e-12)
    same = roofline(ds, Deployment(h800, ep_size=64, dtype="fp8", attention_dtype="fp8"),
                    phase="decode", batch=8, context_len=1024)
    assert same["compute_s"] == pytest.approx(r["compute_s"], rel=1e-12)
    with pytest.raises(ValueError, match="attention_dtype"):
        roofline(ds, Deployment(h800, ep_size=64, attention_dtype="int3"), phase="decode", batch=8,
                 context_len=1024)


def test_h800_links_cite_the_v3_report_without_a_hedge():
    """Item 3: the V3 report's section 3.2.2 gives NVLink 160 GB/s and IB 50 GB/s; the
    preset cites it as read, not 'as remembered'."""
    h800 = HARDWARE["H800"]
    assert (h800.scale_up_bandwidth, h800.scale_out_bandwidth) == (160e9, 50e9)
    assert "3.2.2" in h800.source and "160 GB/s" in h800.source and "50 GB/s" in h800.source
    assert not any(w in h800.source for w in ("remembered", "re-read", "from memory"))


def test_service_source_quotes_the_average_output_speed():
    """Item 4: the day-6 note gives 20-22 tokens/s as the average output speed, not a
    latency target."""
    from tokenflow.analysis.roofline import DEEPSEEK_V3_SERVICE
    src = DEEPSEEK_V3_SERVICE["source"]
    assert "average output speed was 20-22 tokens per second" in src
    assert DEEPSEEK_V3_SERVICE["output_tok_s_per_request"] == (20, 22)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallel_all_reduce_bytes_by_hand(tp):
    """Megatron-style TP: two all-reduces of the [T, H] activations per layer (after attention
    and after the MLP); a ring all-reduce sends 2 (tp - 1) / tp of the data from each device.
    small-dense: 8 layers, H 512; decode of 3 sequences, bf16 activations (2 bytes)."""
    cfg = preset("small-dense")
    r = roofline(cfg, Deployment(hardware("H100"), tp_size=tp), phase="decode", batch=3,
                 context_len=100)
    assert r["scale_up_bytes"] == pytest.approx(8 * 2 * (2 * (tp - 1) / tp) * 3 * 512 * 2)


# ---- C2: DeepSeek's decode all-to-all is direct over InfiniBand; prefill FLOPs are causal ----
def test_h800_decode_is_communication_bound_by_hand():
    """V3 report 3.4.2: decode sends every (token, expert) pair off the token's GPU point to
    point over IB. EP128, 88 sequences, FP8 dispatch + BF16 combine: per token and MoE layer
    8 * 127/128 * 7168 * 3 B = 170,688 B; 58 MoE layers; at 50 GB/s that is 17.4 ms, above
    the 15.6 ms of memory time: communication-bound, 88 / 17.4 ms = about 5,050 tokens/s."""
    ds, h800 = reference_config("DeepSeek-V3"), hardware("H800")
    kw = dict(ep_size=128, dtype="fp8", attention_dtype="bf16", bytes_per_param=1,
              kv_bytes_per_element=2, dispatch_bytes_per_element=1, combine_bytes_per_element=2)
    r = roofline(ds, Deployment(h800, **kw), phase="decode", batch=88, context_len=4989)
    ib = 88 * 58 * 8 * 127 / 128 * 7168 * 3
    assert r["scale_out_bytes"] == pytest.approx(ib, rel=1e-12) and r["scale_up_bytes"] == 0
    assert r["comm_s"] == pytest.approx(ib / 50e9, rel=1e-12)
    assert round(r["comm_s"] * 1e3, 1) == 17.4 and round(r["memory_s"] * 1e3, 1) == 15.6
    assert r["bound"] == "comm" and 5000 < r["tokens_per_s"] < 5100
    # the same step over the hierarchical path would be memory-bound: the path decides it
    hier = roofline(ds, Deployment(h800, a2a_path="hierarchical", **kw), phase="decode", batch=88,
                    context_len=4989)
    assert hier["bound"] == "memory" and hier["scale_out_bytes"] < r["scale_out_bytes"]
    # an H200 has more HBM bandwidth but the same 400 Gb/s NIC: the bound does not move
    h200 = roofline(ds, Deployment(hardware("H200"), **kw), phase="decode", batch=88,
                    context_len=4989)
    assert h200["bound"] == "comm" and h200["tokens_per_s"] == pytest.approx(r["tokens_per_s"])
    with pytest.raises(ValueError, match="a2a_path"):
        roofline(ds, Deployment(h800, a2a_path="ring", **kw), phase="decode", batch=88,
                 context_len=4989)


@pytest.mark.parametrize("S, past, window", [(7, 0, None), (5, 3, None), (9, 2, 4), (6, 0, 3),
                                             (4, 10, 6), (1, 0, None), (1, 9, 4)])
def test_causal_attention_flops_count_the_unmasked_pairs(S, past, window):
    """A causal kernel computes only the (query, key) pairs the mask keeps. Count them on a
    real boolean mask (queries after ``past`` cached keys, a sliding window if any) and
    compare: causal=True is that count, causal=False the full block (what the FLOP counter
    sees)."""
    cfg = preset("tiny-dense") if window is None else preset("tiny-dense", sliding_window=window)
    q = torch.arange(past, past + S)[:, None]
    k = torch.arange(past + S)[None, :]
    full = k <= q
    nh, D = cfg.num_attention_heads, cfg.head_dim
    want, block = 0, 0
    for i in range(cfg.num_hidden_layers):
        keep = full & (k > q - window) if cfg.layer_is_sliding(i) else full
        want += int(keep.sum()) * 2 * nh * (D + D)
        W = window if cfg.layer_is_sliding(i) else None
        block += S * (past + S if W is None else min(past + S, W)) * 2 * nh * (D + D)
    assert forward_flops(cfg, batch=1, new_tokens=S, cached_tokens=past)["attention_scores"] == want
    assert forward_flops(cfg, batch=2, new_tokens=S,
                         cached_tokens=past)["attention_scores"] == 2 * want
    assert forward_flops(cfg, batch=1, new_tokens=S, cached_tokens=past,
                         causal=False)["attention_scores"] == block
    with pytest.raises(TypeError, match="causal"):
        forward_flops(cfg, batch=1, new_tokens=S, cached_tokens=past, causal="yes")


def test_llama_prefill_attention_share_is_about_half_the_masked_count():
    """Llama-3-8B, 2,048-token prompt: attention's share of the FLOPs is about 3.5% causal,
    6.7% counted over the full block."""
    llama = reference_config("Llama-3-8B")
    c, m = forward_flops(llama, batch=1, new_tokens=2048), forward_flops(llama, batch=1,
                                                                         new_tokens=2048,
                                                                         causal=False)
    assert c["attention_scores"] * 2 * 2048 == m["attention_scores"] * 2049
    assert round(100 * c["attention_scores"] / c["total"], 1) == 3.5
    assert round(100 * m["attention_scores"] / m["total"], 1) == 6.7


@pytest.mark.parametrize("field,value,error", [
    ("tp_size", 0, ValueError), ("ep_size", 2.0, TypeError), ("dtype", "int3", ValueError),
    ("attention_dtype", "fp4", ValueError), ("bytes_per_param", 0, ValueError),
    ("kv_bytes_per_element", -1, ValueError), ("dispatch_bytes_per_element", "1", TypeError),
    ("combine_bytes_per_element", float("nan"), ValueError),
    ("max_nodes_per_token", 0, ValueError), ("a2a_path", "ring", ValueError)])
def test_deployment_checks_each_knob_once_naming_it(field, value, error):
    h800 = hardware("H800")
    with pytest.raises(error, match=field):
        Deployment(h800, **{field: value})
    ok = Deployment(h800, ep_size=8, dtype="fp8", attention_dtype="bf16",
                    dispatch_bytes_per_element=1, max_nodes_per_token=4, a2a_path="direct")
    with pytest.raises(AttributeError):
        ok.tp_size = 2                                      # frozen: one value per deployment


def test_roofline_takes_a_deployment_not_the_old_arguments():
    """The hardware spec where the deployment goes, or the step's sizes by position, is a
    TypeError naming what is expected, not a number for another deployment."""
    ds, h800 = reference_config("DeepSeek-V3"), hardware("H800")
    with pytest.raises(TypeError, match="deployment must be a Deployment"):
        roofline(ds, h800, phase="decode", batch=8, context_len=1024)
    with pytest.raises(TypeError, match="hw must be a HardwareSpec"):
        Deployment("H800")
    with pytest.raises(TypeError, match="positional"):
        roofline(ds, Deployment(h800, ep_size=64), "decode", 8, 1024)
    # the phase picks the all-to-all path unless the deployment fixes one
    assert Deployment(h800).a2a_path_for("decode") == "direct"
    assert Deployment(h800).a2a_path_for("prefill") == "hierarchical"
    assert Deployment(h800, a2a_path="direct").a2a_path_for("prefill") == "direct"


def test_h800_ridge_point_is_the_h100s():
    """Chapter 9's exercise 1 points to chapter 5's H100 ridge point for an H800: the presets
    give the H800 the H100's compute and HBM bandwidth, so the two are the same."""
    from tokenflow.analysis.roofline import hardware, ridge_point
    h100, h800 = hardware("H100"), hardware("H800")
    assert h800.peak_flops == h100.peak_flops and h800.memory_bandwidth == h100.memory_bandwidth
    assert ridge_point(h800) == ridge_point(h100)
