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
