"""MoE: vectorised dispatch/combine == the obvious loop, router edge cases,
DeepSeek-style selection bias, load statistics, MoE communication formulas."""
import math

import pytest
import torch

from tokenflow import Trace, TokenFlowModel, preset
from tokenflow.analysis.costmodel import (expected_remote_fraction, moe_a2a_bytes,
                                 moe_comm_bytes_per_token, num_moe_layers, reference_config)
from tokenflow.model.moe import MoE, check_top_k, combine, dispatch, route, run_experts
from tokenflow.explain.moe import (expert_capacity, load_stats, moe_inputs, moe_reference_loop,
                                   route_reference)


def make_moe(seed=0, **overrides) -> MoE:
    """A random MoE of the tiny preset's shape; the sigmoid family gets a random bias."""
    torch.manual_seed(seed)
    moe = MoE(preset("tiny", **overrides)).eval()
    with torch.no_grad():
        moe.gate.weight.normal_(std=0.3)            # spread-out router scores
        if moe.gate.scoring_func == "sigmoid":
            moe.gate.e_score_correction_bias.normal_(std=0.2)
    return moe


FAMILIES = [
    dict(scoring_func="softmax"),
    dict(scoring_func="softmax", norm_topk_prob=False),
    dict(scoring_func="sigmoid", routed_scaling_factor=2.5),
    dict(scoring_func="sigmoid", n_group=2, topk_group=1, routed_scaling_factor=2.5),
    dict(scoring_func="softmax", n_group=2, topk_group=1, norm_topk_prob=False,
         topk_method="group_limited_greedy"),
    dict(scoring_func="softmax", n_group=2, topk_group=1, topk_method="greedy"),
]
SHAPES = [(4, 1), (4, 4), (8, 2), (16, 3)]               # (E, K)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("E,K", SHAPES)
@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("shared", [0, 1])
def test_vectorised_equals_reference_loop(family, E, K, T, shared):
    if family.get("n_group", 1) > 1 and family["topk_group"] * (E // family["n_group"]) < K:
        family = dict(family, topk_group=family["n_group"])
    moe = make_moe(seed=E * 100 + K * 10 + T, num_experts=E, num_experts_per_tok=K,
                   num_shared_experts=shared, **family)
    x = torch.randn(T, moe.gate.weight.shape[1])
    with torch.no_grad():
        fast = moe(x[None])[0]                                        # [T, H]
        slow = moe_reference_loop(moe, x)                             # [T, H]
        idx, w, _ = moe.gate(x)
        idx_ref, w_ref = route_reference(moe.gate, x)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("E,K", SHAPES)
@pytest.mark.parametrize("T", [1, 2, 9])
def test_every_expert_path_equals_reference_loop(family, E, K, T):
    """The speed paths (grouped matmul over stacked weights, the one-token path, the picker)
    against the token-by-token loop, on the same router choices; and equal to the teaching
    path dispatch -> run_experts -> combine."""
    if family.get("n_group", 1) > 1 and family["topk_group"] * (E // family["n_group"]) < K:
        family = dict(family, topk_group=family["n_group"])
    moe = make_moe(seed=E + K + T, num_experts=E, num_experts_per_tok=K, num_shared_experts=0,
                   **family)
    x = torch.randn(T, moe.gate.weight.shape[1])
    with torch.no_grad():
        idx, w, _ = moe.gate(x)
        slow = moe_reference_loop(moe, x, idx, w)                     # [T, H]
        teaching = moe.dispatch_combine(x, idx, w)                    # [T, H]
        paths = {"grouped": moe.grouped_experts(x, idx, w),
                 "picked": moe.routed_experts(x, idx, w)}
        if T == 1:
            paths["one token"] = moe.one_token_experts(x, idx, w)
    for name, out in paths.items():
        torch.testing.assert_close(out, slow, atol=1e-5, rtol=1e-4, msg=name)
        torch.testing.assert_close(out, teaching, atol=1e-6, rtol=1e-6, msg=name)


def _max_diff_to_loop(moe, x):
    with torch.no_grad():
        idx, w, _ = moe.gate(x)
        fast = moe.routed_experts(x, idx, w)                          # grouped (float32)
        return (fast - moe_reference_loop(moe, x, idx, w)).abs().max()


def test_stacked_weights_are_the_expert_weights():
    """One copy: each expert's Linear weights are views of the stacked tensors, so updates in
    place, load_state_dict and dtype changes all reach the grouped path."""
    moe = make_moe(num_experts=4, num_experts_per_tok=2, num_shared_experts=0)
    gate_up, down = moe.stacked_weights()
    I, H = moe.experts[0].gate_proj.weight.shape
    assert gate_up.shape == (4, 2 * I, H) and down.shape == (4, H, I)
    for e, f in enumerate(moe.experts):                               # same memory
        assert f.gate_proj.weight.data_ptr() == gate_up[e, :I].data_ptr()
        assert f.up_proj.weight.data_ptr() == gate_up[e, I:].data_ptr()
        assert f.down_proj.weight.data_ptr() == down[e].data_ptr()
    x = torch.randn(5, H)
    with torch.no_grad():
        moe.experts[2].up_proj.weight.mul_(3.0)                       # in place
    assert _max_diff_to_loop(moe, x) < 1e-5
    other = make_moe(seed=7, num_experts=4, num_experts_per_tok=2, num_shared_experts=0)
    moe.load_state_dict(other.state_dict())
    assert _max_diff_to_loop(moe, x) < 1e-5
    moe.load_state_dict(make_moe(seed=8, num_experts=4, num_experts_per_tok=2,
                                 num_shared_experts=0).state_dict(), assign=True)
    assert _max_diff_to_loop(moe, x) < 1e-5                           # stacked again
    moe.to(torch.float64)                                             # new tensors
    assert moe.stacked_weights()[0].dtype == torch.float64
    assert moe.experts[1].down_proj.weight.data_ptr() == moe.stacked_weights()[1][1].data_ptr()
    assert _max_diff_to_loop(moe, x.double()) < 1e-12                 # (dispatch_combine)


def test_training_still_reaches_every_expert_weight():
    moe = make_moe(num_experts=4, num_experts_per_tok=2).train()
    moe(torch.randn(1, 16, moe.gate.weight.shape[1])).sum().backward()
    assert all(f.gate_proj.weight.grad is not None for f in moe.experts)


def test_pretrained_moe_layers_equal_reference_loop(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode("北京是中国的首")])
    for layer in (1, 2):
        x, out = moe_inputs(model, ids, layer)                        # [1, 5, H] x2
        with torch.no_grad():
            ref = moe_reference_loop(model.layers[layer].mlp, x)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_moe_inputs_rejects_dense_layer(pretrained):
    model, tok = pretrained
    with pytest.raises(ValueError, match="dense"):
        moe_inputs(model, torch.tensor([[5, 6]]), 0)
    with pytest.raises(ValueError, match="layer_idx"):
        moe_inputs(model, torch.tensor([[5, 6]]), 7)


def test_dispatch_run_combine_shapes_and_order():
    moe = make_moe(num_experts=8, num_experts_per_tok=2, num_shared_experts=0)
    T, H = 6, moe.gate.weight.shape[1]
    x = torch.randn(T, H)
    idx, w, _ = moe.gate(x)
    d = dispatch(x, idx, w, 8)
    assert d.hidden.shape == (T * 2, H) and d.token.shape == (T * 2,)
    assert torch.all(d.expert[1:] >= d.expert[:-1])                  # grouped by expert
    assert d.counts.sum() == T * 2 and d.counts.shape == (8,)
    torch.testing.assert_close(d.hidden, x[d.token])                  # copies of token rows
    with torch.no_grad():
        y = run_experts(moe.experts, d.hidden, d.counts)
        out = combine(y, d)                                           # back in token order
        torch.testing.assert_close(out, moe.dispatch_combine(x, idx, w))
        t = 3                                                         # one token by hand
        by_hand = sum(w[t, k] * moe.experts[int(idx[t, k])](x[t]) for k in range(2))
    torch.testing.assert_close(out[t], by_hand, atol=1e-6, rtol=1e-5)


def test_dispatch_errors():
    x = torch.randn(3, 4)
    idx = torch.tensor([[0, 1], [1, 2], [2, 9]])
    with pytest.raises(ValueError, match="num_experts"):
        dispatch(x, idx, torch.ones(3, 2), 4)
    with pytest.raises(ValueError, match="weights"):
        dispatch(x, idx.clamp(max=3), torch.ones(3, 1), 4)
    with pytest.raises(ValueError, match="counts"):
        run_experts([torch.nn.Identity()] * 2, torch.randn(3, 4), [1, 1])


def test_empty_batch():
    moe = make_moe()
    x = torch.randn(0, moe.gate.weight.shape[1])
    with torch.no_grad():
        assert moe(x[None]).shape == (1, 0, x.shape[1])


# ----------------------------------------------------------------------- router edge cases
@pytest.mark.parametrize("family", FAMILIES)
def test_ties_go_to_lower_expert_index(family):
    moe = make_moe(num_experts=8, num_experts_per_tok=3, **family)
    with torch.no_grad():
        moe.gate.weight.zero_()                                      # every score equal
        moe.gate.e_score_correction_bias.zero_()
    x = torch.randn(5, moe.gate.weight.shape[1])
    idx, w, _ = moe.gate(x)
    idx_ref, w_ref = route_reference(moe.gate, x)
    assert idx.tolist() == [[0, 1, 2]] * 5
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(w, w_ref)
    assert torch.allclose(w, w[:, :1].expand_as(w))                  # equal weights
    if family.get("norm_topk_prob", True):
        torch.testing.assert_close(w.sum(-1), torch.full((5,), moe.gate.routed_scaling_factor))


def test_partial_tie_keeps_order_of_scores():
    weight = torch.tensor([[1.0], [3.0], [3.0], [2.0]])              # experts 1, 2 tie
    idx, w, _ = route(torch.ones(2, 1), weight, 2)
    assert idx.tolist() == [[1, 2], [1, 2]]
    torch.testing.assert_close(w, torch.full((2, 2), 0.5))


def test_k_equals_e_uses_every_expert():
    moe = make_moe(num_experts=4, num_experts_per_tok=4, num_shared_experts=0)
    x = torch.randn(6, moe.gate.weight.shape[1])
    idx, w, logits = moe.gate(x)
    assert sorted(idx[0].tolist()) == [0, 1, 2, 3]
    torch.testing.assert_close(w.sum(-1), torch.ones(6))
    p = logits.softmax(-1)                                            # dense mixture
    with torch.no_grad():
        dense = sum(p[:, e:e + 1] * moe.experts[e](x) for e in range(4))
        torch.testing.assert_close(moe(x[None])[0], dense, atol=1e-6, rtol=1e-5)


def test_k_greater_than_e_raises():
    x, weight = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"top_k must be in \[1, num_experts=4\], got 5"):
        route(x, weight, 5)
    with pytest.raises(ValueError, match="top_k"):
        route(x, weight, 0)
    with pytest.raises(ValueError, match="top_k"):
        expert_capacity(10, 4, 5)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        preset("tiny", num_experts=4, num_experts_per_tok=5)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        check_top_k(9, 8, name="num_experts_per_tok")
    with pytest.raises(ValueError, match="top_k"):
        load_stats(torch.zeros(3, 5, dtype=torch.long), 4)


def test_route_argument_errors():
    x, weight = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="scoring_func"):
        route(x, weight, 2, scoring_func="relu")
    with pytest.raises(ValueError, match="weight"):
        route(x, torch.randn(4, 7), 2)
    with pytest.raises(ValueError, match="n_group"):
        route(x, weight, 2, n_group=3)
    with pytest.raises(ValueError, match="topk_group"):
        route(x, weight, 3, n_group=2, topk_group=1)
    with pytest.raises(ValueError, match="bias"):
        route(x, weight, 2, scoring_func="sigmoid", bias=torch.zeros(3))


# ----------------------------------------------------------------------- DeepSeek-V3 family
def test_deepseek_bias_selects_but_weights_come_from_unbiased_scores():
    moe = make_moe(num_experts=8, num_experts_per_tok=2, scoring_func="sigmoid",
                   routed_scaling_factor=2.5)
    x = torch.randn(10, moe.gate.weight.shape[1])
    with torch.no_grad():
        moe.gate.e_score_correction_bias.zero_()
        moe.gate.e_score_correction_bias[5] = 10.0                   # always selected
    idx, w, logits = moe.gate(x)
    assert (idx[:, 0] == 5).all()                                     # selection used the bias
    s = logits.sigmoid()                                              # unbiased scores
    chosen = s.gather(1, idx)
    torch.testing.assert_close(w, 2.5 * chosen / chosen.sum(-1, keepdim=True))
    # the second expert is the best unbiased score among the others
    others = s.clone()
    others[:, 5] = -1
    assert torch.equal(idx[:, 1], others.argmax(-1))
    assert (w < 2.5).all() and not torch.allclose(w[:, 0], torch.full((10,), 2.5))


def test_group_limited_routing_stays_in_best_groups():
    moe = make_moe(num_experts=16, num_experts_per_tok=4, scoring_func="sigmoid", n_group=4,
                   topk_group=2)
    x = torch.randn(20, moe.gate.weight.shape[1])
    idx, _, _ = moe.gate(x)
    groups = idx // 4
    assert all(len(set(g)) <= 2 for g in groups.tolist())
    assert torch.equal(idx, route_reference(moe.gate, x)[0])


@pytest.mark.parametrize("method, chosen", [("group_limited_greedy", [0, 1]),
                                             ("noaux_tc", [2, 3]), ("greedy", [0, 2])])
def test_topk_method_ranks_groups_by_hand(method, chosen):
    """Sigmoid scores [0.9, 0.1 | 0.6, 0.6], two groups, keep one, K = 2. By its best score
    the first group wins (0.9 > 0.6): experts 0, 1. By the sum of its top 2 the second
    (1.2 > 1.0): experts 2, 3. Without groups the two best overall: 0 and 2 (the tie with
    3 goes to the lower index)."""
    p = torch.tensor([0.9, 0.1, 0.6, 0.6])
    H = preset("tiny").hidden_size
    weight = torch.zeros(4, H)
    weight[:, 0] = torch.log(p / (1 - p))                              # logits, sigmoid -> p
    x = torch.zeros(1, H)
    x[0, 0] = 1.0
    idx, w, _ = route(x, weight, 2, scoring_func="sigmoid", norm_topk_prob=False, n_group=2,
                      topk_group=1, topk_method=method)
    assert sorted(idx[0].tolist()) == chosen
    torch.testing.assert_close(w[0].sort().values, p[chosen].sort().values)
    moe = make_moe(num_experts=4, num_experts_per_tok=2, scoring_func="sigmoid", n_group=2,
                   topk_group=1, norm_topk_prob=False, topk_method=method)
    with torch.no_grad():
        moe.gate.weight.copy_(weight)
        moe.gate.e_score_correction_bias.zero_()
    assert sorted(route_reference(moe.gate, x)[0][0].tolist()) == chosen
    assert sorted(moe.gate(x)[0][0].tolist()) == chosen
    with pytest.raises(ValueError, match="topk_method"):
        route(x, weight, 2, n_group=2, topk_method="top2")


# ----------------------------------------------------------------------- load statistics
def test_load_stats_counts_capacity_and_imbalance():
    idx = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 0]])             # T=4, K=2, E=4
    st = load_stats(idx, 4, capacity_factor=1.0)
    assert st["counts"].tolist() == [4, 2, 1, 1]
    assert st["mean"] == 2.0 and st["imbalance"] == 2.0
    assert st["capacity"] == 2                                       # ceil(1.0 * 4*2/4)
    assert st["overflow"].tolist() == [2, 0, 0, 0] and st["dropped"] == 2
    assert st["dropped_fraction"] == 0.25
    torch.testing.assert_close(st["capacity_used"], torch.tensor([2.0, 1.0, 0.5, 0.5]))
    torch.testing.assert_close(st["fraction"].sum(), torch.tensor(1.0))
    balanced = load_stats(torch.tensor([[0, 1], [2, 3]]), 4)
    assert balanced["imbalance"] == 1.0 and balanced["cv"] == 0.0
    with pytest.raises(ValueError, match="indices"):
        load_stats(torch.tensor([[0, 4]]), 4)
    with pytest.raises(ValueError, match="num_experts"):
        load_stats(idx, 0)
    with pytest.raises(ValueError, match="capacity_factor"):
        load_stats(idx, 4, capacity_factor=0)


def test_expert_capacity_formula():
    assert expert_capacity(4096, 64, 6, 1.0) == 384
    assert expert_capacity(4096, 64, 6, 1.25) == 480
    assert expert_capacity(5, 8, 2, 1.0) == 2                        # ceil(1.25)
    assert expert_capacity(0, 8, 2) == 0
    with pytest.raises(ValueError, match="num_tokens"):
        expert_capacity(-1, 8, 2)


def test_trace_records_are_kept():
    moe = make_moe()
    t = Trace(keep_tensors=True)
    x = torch.randn(2, 3, moe.gate.weight.shape[1])
    with torch.no_grad(), t.attach(moe):
        moe(x)
    assert t.actions() == ["route top-k", "dispatch/combine"]
    assert t.events[0].out_shape == (6, 2) and t.events[1].out_shape == (2, 3, x.shape[-1])
    assert set(t.router[0]) == {"indices", "weights", "logits"}


# ----------------------------------------------------------------------- communication
def test_moe_comm_formulas():
    v3 = reference_config("DeepSeek-V3")
    c = moe_comm_bytes_per_token(v3)
    assert c["dispatch"] == c["combine"] == 8 * 7168 * 2
    assert c["total"] == 2 * 8 * 7168 * 2
    fp8 = moe_comm_bytes_per_token(v3, dispatch_bytes_per_element=1)
    assert fp8["dispatch"] == 8 * 7168 and fp8["combine"] == 8 * 7168 * 2
    assert moe_comm_bytes_per_token(v3, ep_size=1)["total"] == 0
    assert math.isclose(moe_comm_bytes_per_token(v3, ep_size=4)["total"], 0.75 * c["total"])
    assert num_moe_layers(v3) == 61 - 3
    assert moe_a2a_bytes(10, 2, 64, 4) == 10 * 2 * 64 * 4
    assert moe_a2a_bytes(10, 2, 64, 4, local_pairs=5) == 15 * 64 * 4
    assert expected_remote_fraction(1) == 0.0 and expected_remote_fraction(8) == 0.875
    with pytest.raises(ValueError, match="local_pairs"):
        moe_a2a_bytes(10, 2, 64, 4, local_pairs=21)
    with pytest.raises(ValueError, match="ep_size"):
        expected_remote_fraction(0)
    with pytest.raises(ValueError, match="num_experts"):
        moe_comm_bytes_per_token(preset("tiny-dense"))
    with pytest.raises(ValueError, match="bytes_per_element"):
        moe_a2a_bytes(1, 1, 1, 0)


# ------------------------------------------------- the aux loss skips padding
def _aux_losses(model, ids, **kw):
    model(ids, **kw)
    return torch.stack([layer.mlp.aux_loss for layer in model.layers if layer.is_moe])


@pytest.fixture(scope="module")
def training_copy(pretrained):
    import copy
    model, tok = pretrained
    return copy.deepcopy(model).train(), tok


def test_aux_loss_same_with_right_padding(training_copy):
    """A sentence alone and the same sentence with 20 right pads (as tokenflow.train pads)
    give the same load-balancing loss in every MoE layer (was 2.60 vs 3.00)."""
    model, tok = training_copy
    ids = torch.tensor([tok.encode("北京是中国的首都。") + [tok.eos_token_id]])
    padded = torch.cat([ids, torch.full((1, 20), tok.pad_token_id)], dim=1)
    alone = _aux_losses(model, ids)
    real = padded != tok.pad_token_id
    torch.testing.assert_close(_aux_losses(model, padded, token_mask=real), alone)
    # neighbour: a bool or 0/1 int mask, and two rows of different lengths in one batch
    torch.testing.assert_close(_aux_losses(model, padded, token_mask=real.long()), alone)
    short = tok.encode("东京") + [tok.eos_token_id]
    two = torch.full((2, padded.shape[1]), tok.pad_token_id)
    two[0, :ids.shape[1]] = ids[0]
    two[1, :len(short)] = torch.tensor(short)
    both = _aux_losses(model, torch.cat([ids, torch.tensor([short + [tok.pad_token_id] * (
        ids.shape[1] - len(short))])]), token_mask=torch.tensor(
            [[1] * ids.shape[1], [1] * len(short) + [0] * (ids.shape[1] - len(short))]))
    torch.testing.assert_close(_aux_losses(model, two, token_mask=two != tok.pad_token_id),
                               both)
    # the unmasked loss does count the pads (the test would not see a dropped mask otherwise)
    assert (_aux_losses(model, padded) - alone).abs().max() > 0.05


def test_aux_loss_same_with_left_padding_attention_mask(training_copy):
    """Left padding given as ``attention_mask`` (generate's layout) masks the router
    statistics too, without a separate token_mask."""
    model, tok = training_copy
    ids = torch.tensor([tok.encode("北京是中国的首")])
    padded = torch.cat([torch.full((1, 20), tok.pad_token_id), ids], dim=1)
    mask = (torch.arange(padded.shape[1]) >= 20).long()[None]
    torch.testing.assert_close(_aux_losses(model, padded, attention_mask=mask),
                               _aux_losses(model, ids), atol=1e-5, rtol=1e-4)


def test_switch_balance_loss_mask_equals_dropping_the_rows():
    from tokenflow.model.moe import switch_balance_loss
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 8, generator=g)
    indices = logits.topk(2, dim=-1).indices
    keep = torch.tensor([1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1])
    r = keep.bool()
    torch.testing.assert_close(switch_balance_loss(logits, indices, 8, keep),
                               switch_balance_loss(logits[r], indices[r], 8))
    torch.testing.assert_close(switch_balance_loss(logits, indices, 8, torch.ones(12, dtype=int)),
                               switch_balance_loss(logits, indices, 8))
    with pytest.raises(ValueError, match="no real token"):
        switch_balance_loss(logits, indices, 8, torch.zeros(12, dtype=torch.long))
    with pytest.raises(ValueError, match="token_mask"):
        switch_balance_loss(logits, indices, 8, keep.float())
    with pytest.raises(ValueError, match="token_mask"):
        switch_balance_loss(logits, indices, 8, keep * 2)
    with pytest.raises(ValueError, match="token_mask"):
        switch_balance_loss(logits, indices, 8, keep[:5])


def test_model_checks_the_token_mask_in_training():
    """The model's forward checks ``token_mask`` once (the MoE layers trust it); in eval
    mode nothing reads it."""
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny", num_hidden_layers=1)).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 3))
    with pytest.raises(ValueError, match=r"token_mask must be a \[B, S\] = \[2, 3\]"):
        model(ids, token_mask=torch.ones(3, 2, dtype=torch.long))
    for bad in ([[1, 1, 1], [1, 1, 0]], torch.ones(2, 3), torch.full((2, 3), 2)):
        with pytest.raises(ValueError, match="token_mask"):
            model(ids, token_mask=bad)
    with pytest.raises(ValueError, match="no real token"):
        model(ids, token_mask=torch.zeros(2, 3, dtype=torch.long))
    model(ids, token_mask=torch.tensor([[1, 1, 0], [1, 0, 0]]))
    model.eval()(ids, token_mask=torch.ones(3, 2, dtype=torch.long))


def test_train_masks_the_router_statistics_of_its_right_padding(monkeypatch, tmp_path):
    """tokenflow.train hands the MoE the real-token mask of its right-padded batch: every
    aux-loss call gets a mask, and the masks hold padding (0s)."""
    import tokenflow.model.moe as moe_mod
    from tokenflow.train import train
    seen = []
    real_loss = moe_mod._balance_loss               # what MoE.forward computes the loss with

    def spy(logits, indices, num_experts, token_mask=None):
        seen.append(token_mask)
        return real_loss(logits, indices, num_experts, token_mask)

    monkeypatch.setattr(moe_mod, "_balance_loss", spy)
    calls = []
    orig_forward = moe_mod.MoE.forward

    def forward(self, x, token_mask=None):
        calls.append(token_mask)
        return orig_forward(self, x, token_mask)

    monkeypatch.setattr(moe_mod.MoE, "forward", forward)
    train(steps=1, batch_size=8, out_dir=tmp_path, progress=False)
    assert seen and all(m is not None for m in seen)
    assert all(m is not None and not bool(m.all()) for m in calls)   # it has padding


# ------------------------------------------------------------- entry-point checks, by hand
def test_route_rejects_groups_that_do_not_divide_the_experts():
    """6 experts cannot be split into 4 equal groups: ``route`` says so (a ValueError naming
    ``n_group``), whatever ``topk_group`` allows."""
    x, weight = torch.randn(2, 8), torch.randn(6, 8)
    for n_group, topk_group in [(4, 4), (4, 2), (5, 5)]:
        with pytest.raises(ValueError, match="n_group .* must be >= 1 and divide"):
            route(x, weight, 1, n_group=n_group, topk_group=topk_group)
    route(x, weight, 1, n_group=3, topk_group=3)                     # 3 groups of 2: fine


def test_dispatch_rejects_an_index_just_outside_the_experts():
    """The first index past the last expert (``num_experts`` itself) and -1 are refused;
    the last expert, ``num_experts - 1``, is fine."""
    x, w = torch.randn(2, 4), torch.ones(2, 2)
    for bad in (4, -1):
        with pytest.raises(ValueError, match=r"indices must be in \[0, num_experts=4\)"):
            dispatch(x, torch.tensor([[0, 1], [2, bad]]), w, 4)
    d = dispatch(x, torch.tensor([[0, 3], [3, 1]]), w, 4)
    assert d.counts.tolist() == [1, 1, 0, 2]


def test_dispatch_keeps_token_order_within_each_expert():
    """Dispatch groups the pairs by expert and keeps them in token order within an expert
    (a stable grouping): for many tokens, each expert's block lists its tokens increasing,
    and each token's K pairs are the experts it chose."""
    g = torch.Generator().manual_seed(0)
    T, K, E = 200, 2, 4
    scores = torch.rand(T, E, generator=g)
    idx = scores.argsort(dim=-1, descending=True)[:, :K]            # K distinct experts a token
    d = dispatch(torch.randn(T, 3, generator=g), idx, torch.rand(T, K, generator=g), E)
    for e in range(E):
        tokens = d.token[d.expert == e]
        assert torch.all(tokens[1:] > tokens[:-1]), e
        assert tokens.tolist() == [t for t in range(T) if e in idx[t].tolist()], e


def test_run_experts_and_combine_check_their_row_counts():
    """``run_experts`` wants one count per expert and ``combine`` exactly one row per pair."""
    experts = [torch.nn.Identity()] * 2
    with pytest.raises(ValueError, match=r"one entry per expert \(2\), got 1"):
        run_experts(experts, torch.randn(3, 4), [3])
    with pytest.raises(ValueError, match=r"one entry per expert \(2\), got 3"):
        run_experts(experts, torch.randn(3, 4), [1, 1, 1])
    x = torch.randn(3, 4)
    d = dispatch(x, torch.tensor([[0, 1], [1, 0], [0, 1]]), torch.full((3, 2), 0.5), 2)
    for rows in (5, 7):
        with pytest.raises(ValueError, match=r"expert_out must have shape \[P=6, H\]"):
            combine(torch.randn(rows, 4), d)
    torch.testing.assert_close(combine(run_experts(experts, d.hidden, d.counts), d), x)


def test_switch_balance_loss_by_hand():
    """``E * sum_e f_e * P_e`` with ``f_e`` the share of the T*K assignments (Switch
    Transformer eq. 4): 1.0 when balanced, for any K; worked by hand for E = 2."""
    from tokenflow.model.moe import switch_balance_loss
    logits = torch.tensor([[math.log(3.0), 0.0]] * 2)                # P = [0.75, 0.25]
    one = torch.tensor([[0], [0]])                                   # K = 1, both to expert 0
    torch.testing.assert_close(switch_balance_loss(logits, one, 2), torch.tensor(1.5))
    both = torch.tensor([[0, 1], [1, 0]])                            # K = 2: f = [1/2, 1/2]
    torch.testing.assert_close(switch_balance_loss(logits, both, 2), torch.tensor(1.0))
    uniform = torch.zeros(4, 4)                                      # K = 2, E = 4, balanced
    pairs = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]])
    torch.testing.assert_close(switch_balance_loss(uniform, pairs, 4), torch.tensor(1.0))
