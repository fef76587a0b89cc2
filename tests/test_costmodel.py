"""Cost-model counts against the real modules (independent of the formulas)."""
import pytest
import torch

from tokenflow import TokenFlowModel, preset
from tokenflow.costmodel import active_param_count, param_count


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

from tokenflow import KVCache, Trace  # noqa: E402
from tokenflow.costmodel import (expected_experts_touched, forward_bytes,  # noqa: E402
                                 forward_flops)

_DENSE = dict(num_experts=0, num_experts_per_tok=0, num_shared_experts=0)


@pytest.mark.parametrize("overrides", [_DENSE, dict(), dict(tie_word_embeddings=True)])
@pytest.mark.parametrize("B,cached,new", [(1, 0, 6), (2, 5, 3), (3, 9, 1)])
def test_forward_flops_match_torch_flop_counter(overrides, B, cached, new):
    """FlopCounterMode counts every matmul the forward really runs (the traced attention path
    uses explicit Q K^T and weights @ V matmuls, which the counter sees)."""
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny", **overrides)).eval()
    cfg = model.config
    cache = KVCache(cfg, B, cached + new)
    with torch.no_grad():
        if cached:
            model(torch.randint(3, cfg.vocab_size, (B, cached)), kv_cache=cache)
        counter = FlopCounterMode(display=False)
        with counter:
            model(torch.randint(3, cfg.vocab_size, (B, new)), kv_cache=cache,
                  trace=Trace(keep_tensors=True))
    assert counter.get_total_flops() == forward_flops(cfg, new, cached, B)


@pytest.mark.parametrize("B,cached,new", [(1, 0, 4), (4, 7, 1)])
def test_forward_bytes_of_a_dense_model_are_its_weights_and_cache(B, cached, new):
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny", **_DENSE))
    cfg = model.config
    weights = sum(p.numel() for n, p in model.named_parameters() if n != "embed_tokens.weight")
    rows = B * new * cfg.hidden_size                          # embedding rows looked up
    cache = KVCache(cfg, B, cached + new)                     # fp32: 4 bytes, every slot used
    assert forward_bytes(cfg, new, cached, B, 4) == (weights + rows) * 4 + cache.nbytes()


def test_forward_bytes_of_moe_read_the_experts_the_tokens_touch():
    cfg = preset("tiny")
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    moe_layers = sum(cfg.layer_is_moe(i) for i in range(cfg.num_hidden_layers))
    kv = lambda n: 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * n
    # one token: exactly the active weights (K experts per MoE layer)
    one = active_param_count(cfg, include_embedding=False) + cfg.hidden_size + kv(1)
    assert forward_bytes(cfg, 1, 0, 1, 1) == pytest.approx(one)
    # a huge batch touches every expert: all weights but the embedding
    big = 10_000
    everything = param_count(cfg) - cfg.vocab_size * cfg.hidden_size
    assert forward_bytes(cfg, 1, 0, big, 1) == pytest.approx(
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
    assert expected_experts_touched(E, K, T) == pytest.approx(seen / trials, rel=0.02)
    assert expected_experts_touched(E, K, 1) == pytest.approx(K)
    assert expected_experts_touched(E, K, 0) == 0


@pytest.mark.parametrize("kwargs", [dict(new_tokens=0), dict(cached_tokens=-1),
                                    dict(batch_size=0), dict(new_tokens=1.5)])
def test_forward_flops_and_bytes_reject_bad_counts(kwargs):
    args = dict(new_tokens=1, cached_tokens=0, batch_size=1) | kwargs
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        forward_flops(preset("tiny"), **args)
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        forward_bytes(preset("tiny"), **args)
    with pytest.raises(ValueError, match="bytes_per_element"):
        forward_bytes(preset("tiny"), 1, bytes_per_element=0)
    with pytest.raises(ValueError, match="top_k"):
        expected_experts_touched(8, 9, 1)
