"""Packed projection weights (tokenflow.model.fused, issue F11): one copy of every weight, the
packed products equal the separate ones, and replaced or updated weights always reach the packed
path."""
import pytest
import torch
import torch.nn.functional as F

from tokenflow import KVCache, TokenFlowModel, preset
from tokenflow.model.attention import Attention
from tokenflow.model.ffn import FFN
from tokenflow.model.fused import packed_rows
from tokenflow.model.kv_cache import uncached_step


def _attn_and_inputs(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = preset("tiny", **overrides)
    attn = Attention(cfg, 0)
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 5, cfg.hidden_size)
    step = uncached_step(None, torch.zeros(2, 5, dtype=torch.long))
    from tokenflow.model.rope import RotaryEmbedding
    cos, sin = RotaryEmbedding(cfg)(step.positions)
    return attn, x, cos, sin, step


def _separate_qkv(attn, x):
    """Q, K, V by the three separate projections (the reference for the packed product)."""
    return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)


def test_qkv_weight_is_one_copy_of_the_three_projections():
    attn, *_ = _attn_and_inputs()
    with torch.no_grad():
        w = attn.qkv_weight()
    q, k, v = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
    assert w.shape == (q.shape[0] + k.shape[0] + v.shape[0], q.shape[1])
    assert torch.equal(w, torch.cat([q, k, v]))
    # same memory: each projection is a view of its block of rows
    assert q.data_ptr() == w.data_ptr()
    assert k.data_ptr() == w[q.shape[0]:].data_ptr()
    assert v.data_ptr() == w[q.shape[0] + k.shape[0]:].data_ptr()
    with torch.no_grad():
        assert attn.qkv_weight() is w                                  # cached, no new copy


@pytest.mark.parametrize("overrides", [dict(), dict(num_key_value_heads=1),
                                       dict(num_key_value_heads=4)])
def test_attention_packed_equals_separate_projections(overrides):
    """The forward without gradients (one packed product) equals the forward with gradients
    (three separate products, the training path)."""
    attn, x, cos, sin, step = _attn_and_inputs(**overrides)
    with torch.no_grad():
        packed = attn(x, cos, sin, step)
    separate = attn(x, cos, sin, step).detach()                       # grad on: separate
    assert (packed - separate).abs().max() < 1e-6
    with torch.no_grad():
        qkv = F.linear(x, attn.qkv_weight())
    assert torch.allclose(qkv, torch.cat(_separate_qkv(attn, x), dim=-1), atol=1e-6)


def test_ffn_packed_equals_separate_projections():
    torch.manual_seed(0)
    ffn = FFN(32, 48)
    x = torch.randn(3, 4, 32)
    with torch.no_grad():
        packed = ffn(x)
        gu = ffn.gate_up_weight()
    separate = ffn.down_proj(F.silu(ffn.gate_proj(x)) * ffn.up_proj(x)).detach()
    assert (packed - separate).abs().max() < 1e-6
    assert gu.shape == (96, 32)
    assert ffn.gate_proj.weight.data_ptr() == gu.data_ptr()
    assert ffn.up_proj.weight.data_ptr() == gu[48:].data_ptr()


def test_updates_in_place_reach_the_packed_path():
    """load_state_dict and an optimiser step write into the shared memory."""
    attn, x, cos, sin, step = _attn_and_inputs()
    other, *_ = _attn_and_inputs(seed=5)
    attn.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert (attn(x, cos, sin, step) - other(x, cos, sin, step)).abs().max() < 1e-6
    opt = torch.optim.SGD(attn.parameters(), lr=0.5)
    attn(x, cos, sin, step).pow(2).sum().backward()                   # training path
    assert attn.k_proj.weight.grad is not None and attn.k_proj.weight.grad.abs().sum() > 0
    opt.step()
    with torch.no_grad():
        assert torch.equal(attn.qkv_weight()[attn.q_proj.weight.shape[0]:][
            :attn.k_proj.weight.shape[0]], attn.k_proj.weight)


def test_replaced_weights_are_packed_again():
    """assign=True and .to(dtype) give the projections new tensors; the packed product
    follows them, and the packed cache does not keep the old tensors."""
    attn, x, cos, sin, step = _attn_and_inputs()
    other, *_ = _attn_and_inputs(seed=3)
    attn.load_state_dict(other.state_dict(), assign=True)
    with torch.no_grad():
        assert (attn(x, cos, sin, step) - other(x, cos, sin, step)).abs().max() < 1e-6
        attn.to(torch.float64)
        assert "_packed" not in attn.__dict__                          # dropped by .to()
        w = attn.qkv_weight()
        assert w.dtype == torch.float64 and attn.v_proj.weight.data_ptr() == \
            w[-attn.v_proj.weight.shape[0]:].data_ptr()
        out = attn(x.double(), cos.double(), sin.double(), step)
    ref = other.double()(x.double(), cos.double(), sin.double(), step).detach()
    assert (out - ref).abs().max() < 1e-12


def test_back_to_back_weights_are_viewed_not_copied():
    """An expert's gate/up inside the MoE's stack are already adjacent: the FFN's packed
    weight is a view of the stack, so packing moves nothing."""
    model = TokenFlowModel(preset("tiny")).eval()
    moe = next(layer.mlp for layer in model.layers if layer.is_moe)
    gate_up, _ = moe.stacked_weights()
    with torch.no_grad():
        w = moe.experts[2].gate_up_weight()
    assert w.data_ptr() == gate_up[2].data_ptr() and torch.equal(w, gate_up[2])
    assert moe.stacked_weights()[0].data_ptr() == gate_up.data_ptr()  # the stack stayed


def test_model_packed_under_inference_mode_can_still_train():
    """Packing (or re-packing) during generation must not turn the weights into inference
    tensors: the model can be trained afterwards."""
    model = TokenFlowModel(preset("tiny-dense"))
    model.to(torch.float64).to(torch.float32)                        # caches dropped
    ids = torch.randint(0, model.config.vocab_size, (2, 6))
    with torch.inference_mode():
        model(ids, kv_cache=KVCache(model.config, 2, 8))             # packs again
    assert not any(p.is_inference() for p in model.parameters())
    loss = model(ids).logsumexp(-1).mean()
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()               # in place, no error


def test_model_built_under_inference_mode_runs():
    """A model built inside inference_mode has inference tensors; packing keeps them so."""
    with torch.inference_mode():
        model = TokenFlowModel(preset("tiny")).eval()
        out = model(torch.randint(0, 512, (1, 4)))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("bad, match", [
    ([], "non-empty"),
    ([torch.zeros(3)], "2-D"),
    ([torch.zeros(2, 3), torch.zeros(2, 4)], "columns"),
    ([torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float64)], "dtype"),
])
def test_packed_rows_rejects_bad_weights(bad, match):
    with pytest.raises(ValueError, match=match):
        packed_rows(torch.nn.Module(), "w", bad)


def test_replacing_one_projection_is_packed_again():
    """Assigning a new tensor to k_proj / v_proj / up_proj alone (q_proj / gate_proj, the
    first block, unchanged) must still reach the packed product: the cache is keyed on
    every weight's pointer, not just the first."""
    attn, x, cos, sin, step = _attn_and_inputs()
    with torch.no_grad():
        attn(x, cos, sin, step)                                      # packed and cached
    for name in ("k_proj", "v_proj"):
        lin = getattr(attn, name)
        lin.weight = torch.nn.Parameter(torch.randn_like(lin.weight))
        with torch.no_grad():
            w = attn.qkv_weight()
            packed = attn(x, cos, sin, step)
        assert torch.equal(w, torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                         attn.v_proj.weight]))
        separate = attn(x, cos, sin, step).detach()                 # grad on: cat path
        assert (packed - separate).abs().max() < 1e-6
    torch.manual_seed(0)
    ffn, x = FFN(32, 48), torch.randn(3, 32)
    with torch.no_grad():
        ffn(x)
        ffn.up_proj.weight = torch.nn.Parameter(torch.randn_like(ffn.up_proj.weight))
        packed = ffn(x)
    separate = ffn(x).detach()
    assert (packed - separate).abs().max() < 1e-6


def test_packed_rows_copies_blocks_of_one_storage_with_a_gap():
    """Only blocks that really follow each other are viewed; a gap (or an overlap) between
    two blocks of one storage must be copied, not read through."""
    base = torch.arange(24.0).view(6, 4)
    a, b = base[0:2], base[3:5]                                      # row 2 lies between
    want = torch.cat([a, b])
    w = packed_rows(torch.nn.Module(), "w", [a, b])
    assert torch.equal(w, want)
    assert w.data_ptr() != base.data_ptr()                          # a copy
    c, d = base[0:2], base[2:5]                                      # adjacent: a view
    v = packed_rows(torch.nn.Module(), "v", [c, d])
    assert v.data_ptr() == base.data_ptr() and torch.equal(v, base[:5])


def test_no_packed_cache_outlives_a_restack():
    """After load_state_dict(assign=True) and a forward, every packed tensor cached on any
    module lies in memory that the current parameters use (a stale expert cache would keep
    the old stack alive)."""
    torch.manual_seed(0)
    model = TokenFlowModel(preset("tiny")).eval()
    moe = next(layer.mlp for layer in model.layers if layer.is_moe)
    with torch.no_grad():
        for f in moe.experts:
            f.gate_up_weight()                                       # experts' own views
    torch.manual_seed(1)
    other = TokenFlowModel(preset("tiny")).eval()
    model.load_state_dict(other.state_dict(), assign=True)
    with torch.no_grad():
        model(torch.randint(0, 512, (2, 5)))                         # grouped path restacks
    live = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for name, m in model.named_modules():
        for key, (_, packed) in m.__dict__.get("_packed", {}).items():
            assert packed.untyped_storage().data_ptr() in live, (name, key)


def test_gradients_reach_every_projection_in_eval_mode():
    """The packed product is chosen by grad mode, not by train/eval mode: an eval-mode model
    with gradients on still trains every projection."""
    attn, x, cos, sin, step = _attn_and_inputs()
    attn.eval()
    attn(x, cos, sin, step).pow(2).sum().backward()
    for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
        assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
    torch.manual_seed(0)
    ffn = FFN(32, 48).eval()
    ffn(torch.randn(3, 32)).pow(2).sum().backward()
    for lin in (ffn.gate_proj, ffn.up_proj, ffn.down_proj):
        assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


def test_linear_weights_reads_the_registered_weights():
    """``linear_weights`` returns what attribute access returns, follows a replaced module or
    Parameter, and names a missing child with a KeyError."""
    from tokenflow.model.fused import linear_weights
    attn, x, cos, sin, step = _attn_and_inputs()
    ws = linear_weights(attn, ("q_proj", "k_proj", "v_proj"))
    assert all(a is b for a, b in zip(ws, (attn.q_proj.weight, attn.k_proj.weight,
                                           attn.v_proj.weight)))
    attn.k_proj = torch.nn.Linear(attn.k_proj.in_features, attn.k_proj.out_features,
                                  bias=False)
    assert linear_weights(attn, ("k_proj",))[0] is attn.k_proj.weight
    attn.v_proj.weight = torch.nn.Parameter(torch.randn_like(attn.v_proj.weight))
    assert linear_weights(attn, ("v_proj",))[0] is attn.v_proj.weight
    with torch.no_grad():                             # and the packed product follows both
        qkv = F.linear(x, attn.qkv_weight())
    torch.testing.assert_close(qkv, torch.cat(_separate_qkv(attn, x), dim=-1))
    with pytest.raises(KeyError):
        linear_weights(attn, ("w_proj",))
