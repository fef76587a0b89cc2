"""ModelConfig's predicates at their edges: ``is_moe`` / ``layer_is_moe`` with
``first_k_dense_replace`` and ``moe_layer_freq`` at 0, 1 and the number of layers,
``num_experts`` 0 / 1; ``is_mla``; ``layer_is_sliding``; ``eos_token_ids``; and what the
model, the cost model and the HF mapping build from them. Expected layers are listed by
hand from HF ``DeepseekV2DecoderLayer``'s rule: MoE iff ``i >= first_k_dense_replace`` and
``i % moe_layer_freq == 0``."""
import pytest

from tokenflow import TokenFlowModel, preset
from tokenflow.analysis.costmodel import num_moe_layers, param_breakdown
from tokenflow.model.moe import MoE

L = 4


def _cfg(**kw):
    return preset("tiny", num_hidden_layers=L, **kw)


@pytest.mark.parametrize("k, freq, moe_layers", [
    (0, 1, [0, 1, 2, 3]), (1, 1, [1, 2, 3]), (L - 1, 1, [3]), (L, 1, []), (L + 2, 1, []),
    (0, 2, [0, 2]), (1, 2, [2]), (0, 3, [0, 3]), (1, 3, [3]), (0, L, [0]), (1, L, []),
    (0, L + 1, [0]), (3, 2, []), (2, 2, [2])])
def test_moe_layers_by_hand(k, freq, moe_layers):
    """``first_k_dense_replace == num_hidden_layers`` (or more) means no MoE layer, and so
    does a frequency that no layer from ``k`` on is a multiple of (k = 3, freq = 2 over 4
    layers: ``is_moe`` used to say True there)."""
    c = _cfg(first_k_dense_replace=k, moe_layer_freq=freq)
    assert [i for i in range(L) if c.layer_is_moe(i)] == moe_layers
    assert c.is_moe is bool(moe_layers)
    assert num_moe_layers(c) == len(moe_layers)
    if freq == 1:                       # the model builds moe_layer_freq == 1 only
        model = TokenFlowModel(c)
        assert [i for i, b in enumerate(model.layers) if isinstance(b.mlp, MoE)] == moe_layers
        assert [b.is_moe for b in model.layers] == [i in moe_layers for i in range(L)]
    p = param_breakdown(c)
    assert (p["routed_experts"] > 0) is bool(moe_layers)
    assert (p["dense_ffn"] > 0) is (len(moe_layers) < L)


@pytest.mark.parametrize("E, K, is_moe", [(0, 0, False), (1, 1, True), (8, 8, True)])
def test_is_moe_with_zero_one_and_all_experts(E, K, is_moe):
    c = _cfg(num_experts=E, num_experts_per_tok=K, num_shared_experts=0,
             first_k_dense_replace=0)
    assert c.is_moe is is_moe
    assert [c.layer_is_moe(i) for i in range(L)] == [is_moe] * L


def test_hf_architecture_follows_is_moe_at_the_edge():
    """A config with experts but no MoE layer (k = L, or k = 3 with freq 2) is dense: HF
    Llama, as ``is_moe`` says."""
    from tokenflow.interop import hf_architecture
    assert hf_architecture(_cfg(first_k_dense_replace=L)) == "llama"
    assert hf_architecture(_cfg(first_k_dense_replace=3, moe_layer_freq=2)) == "llama"
    assert hf_architecture(_cfg(first_k_dense_replace=L - 1)) == "qwen2_moe"


@pytest.mark.parametrize("idx", [-1, L, L + 1, 1.0, True, None])
def test_layer_predicates_refuse_an_index_outside_the_layers(idx):
    c = _cfg(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8)
    for pred in (c.layer_is_moe, c.layer_is_sliding):
        with pytest.raises(ValueError, match=f"layer_idx must be an int in \\[0, "
                                             f"num_hidden_layers={L}\\)"):
            pred(idx)
    assert c.layer_is_moe(0) is False and c.layer_is_moe(L - 1) is True   # k = 1 in tiny
    assert c.layer_is_sliding(0) is True and c.layer_is_sliding(L - 1) is False


@pytest.mark.parametrize("window, types, sliding", [
    (None, None, [False] * L), (8, None, [True] * L),
    (8, ["full_attention"] * (L - 1) + ["sliding_attention"], [False] * (L - 1) + [True]),
    (8, ["sliding_attention"] + ["full_attention"] * (L - 1), [True] + [False] * (L - 1)),
    (1, ["sliding_attention"] * L, [True] * L)])
def test_layer_is_sliding_at_first_last_and_window_one(window, types, sliding):
    c = _cfg(sliding_window=window, layer_types=types)
    assert [c.layer_is_sliding(i) for i in range(L)] == sliding


@pytest.mark.parametrize("rank, is_mla", [(None, False), (1, True), (64, True)])
def test_is_mla_at_none_one_and_wide(rank, is_mla):
    kw = {} if rank is None else dict(kv_lora_rank=rank, qk_rope_head_dim=8,
                                      qk_nope_head_dim=8, v_head_dim=8)
    assert _cfg(**kw).is_mla is is_mla


@pytest.mark.parametrize("eos, ids", [(None, ()), (0, (0,)), (511, (511,)), ((0, 511), (0, 511))])
def test_eos_token_ids_at_the_vocabulary_ends(eos, ids):
    assert _cfg(eos_token_id=eos).eos_token_ids == ids
    with pytest.raises(ValueError, match="eos_token_id"):
        _cfg(eos_token_id=512)


@pytest.mark.parametrize("field, lo", [("first_k_dense_replace", 0), ("moe_layer_freq", 1),
                                       ("num_experts", 0), ("n_group", 1)])
def test_count_fields_at_their_lowest_and_below(field, lo):
    kw = {field: lo}
    if field == "num_experts":
        kw.update(num_experts_per_tok=0, num_shared_experts=0)
    assert getattr(_cfg(**kw), field) == lo
    with pytest.raises(ValueError, match=f"{field} must be >= {lo}"):
        _cfg(**{**kw, field: lo - 1})
    with pytest.raises(TypeError, match=field):
        _cfg(**{**kw, field: float(lo)})
