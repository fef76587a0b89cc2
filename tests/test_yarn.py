"""YaRN at DeepSeek-like sizes: the correction range is compared with
transformers where it is NOT clamped (rotated head dim 64, 4,096 original positions, factor
40), plus neighbours; the older tests used sizes where the range clamps to [0, 1]."""
import math

import pytest
import torch

from tokenflow import ModelConfig, interop
from tokenflow.model.rope import rope_inv_freq, yarn_softmax_scale

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

DS_YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def mla_config(rope_dim=64, max_pos=163840, theta=10000.0, **yarn):
    """DeepSeek-V3's attention shape for RoPE (qk_rope_head_dim 64) with a tiny width."""
    return ModelConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, intermediate_size=96,
                       num_experts=0, num_experts_per_tok=0, num_shared_experts=0,
                       q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=rope_dim,
                       qk_nope_head_dim=128, v_head_dim=16, max_position_embeddings=max_pos,
                       rope_theta=theta, rope_scaling={**DS_YARN, **yarn})


def gqa_config(head_dim=128, max_pos=131072, theta=1e6, **yarn):
    """A Qwen2.5-style YaRN (head dim 128, theta 1e6, 32,768 original positions)."""
    s = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    s.update(yarn)
    return ModelConfig(vocab_size=256, hidden_size=2 * head_dim, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim,
                       intermediate_size=96, num_experts=0, num_experts_per_tok=0,
                       num_shared_experts=0, max_position_embeddings=max_pos,
                       rope_theta=theta, rope_scaling=s)


def _corr_range(cfg):
    """The unclamped correction dims for beta_fast / beta_slow (YaRN paper eq. 17)."""
    s, d = cfg.rope_scaling, cfg.head_dim
    def corr(rot):
        return d * math.log(s["original_max_position_embeddings"] / (rot * 2 * math.pi)) \
            / (2 * math.log(cfg.rope_theta))
    return corr(s.get("beta_fast", 32)), corr(s.get("beta_slow", 1))


CASES = {
    "deepseek-v3": lambda: mla_config(),
    "no-truncate": lambda: mla_config(truncate=False),
    "factor-from-lengths": lambda: mla_config(factor=None, max_pos=4096 * 40),
    "betas-16-2": lambda: mla_config(beta_fast=16, beta_slow=2),
    "mscale-0.707": lambda: mla_config(mscale=0.707, mscale_all_dim=1.0),
    "attention-factor": lambda: mla_config(attention_factor=1.3),
    "rope-dim-32": lambda: mla_config(rope_dim=32),
    "qwen2.5-gqa": lambda: gqa_config(),
    "gqa-dim-64": lambda: gqa_config(head_dim=64, theta=10000.0, max_pos=16384,
                                     original_max_position_embeddings=4096),
    # neighbours at the edges: the slow end above D/2 (original length > 2*pi*theta) ...
    "slow-end-above-half": lambda: mla_config(original_max_position_embeddings=131072,
                                              max_pos=131072 * 4, factor=4.0),
    # ... and the fast end clamped to 0 while the slow end is not
    "fast-end-clamped": lambda: mla_config(original_max_position_embeddings=160,
                                           max_pos=640, factor=4.0),
    # ... and a range that collapses to one dim (HF adds 0.001 to avoid dividing by 0)
    "collapsed-range": lambda: mla_config(original_max_position_embeddings=6, max_pos=24,
                                          factor=4.0),
}
EDGE = {"no-truncate", "fast-end-clamped", "collapsed-range"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_yarn_inv_freq_equals_hf_where_the_range_is_not_clamped(case):
    cfg = CASES[case]()
    arch = "deepseek_v3" if cfg.is_mla else "llama"
    hf_cfg = interop.to_hf_config(cfg, arch)
    hf_inv, hf_attn = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg, "cpu")
    ours, attn = rope_inv_freq(cfg)
    assert ours.shape == hf_inv.shape == (cfg.head_dim // 2,)
    torch.testing.assert_close(ours, hf_inv.float(), atol=0, rtol=1e-6)
    assert attn == pytest.approx(hf_attn, rel=1e-12)
    low, high = _corr_range(cfg)
    if case not in EDGE:
        assert 1 <= math.floor(low) and math.ceil(high) < cfg.head_dim - 1   # not clamped
    if case == "slow-end-above-half":
        assert cfg.head_dim // 2 <= math.ceil(high) < cfg.head_dim - 1
    if case == "fast-end-clamped":
        assert low < 0 < math.ceil(high) < cfg.head_dim // 2
    # all three regimes are present: kept, blended, interpolated (when the slow end is
    # above D/2 no pair is fully interpolated: HF ramps over D/2 pairs with dims up to D-1)
    plain = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64)
                               / cfg.head_dim)
    ratio = (ours.double() / plain)
    factor = cfg.rope_scaling["factor"] or 40.0
    kept = torch.isclose(ratio, torch.ones_like(ratio), rtol=1e-5)
    interp = torch.isclose(ratio, torch.full_like(ratio, 1 / factor), rtol=1e-5)
    if case not in EDGE:
        assert kept.any() and (~kept & ~interp).any()
        assert interp.any() == (case != "slow-end-above-half")
    assert torch.isfinite(ours).all()


def test_deepseek_softmax_scale_equals_hf_attention():
    """DeepseekV3Attention's ``scaling`` (qk_head_dim ** -0.5 times mscale**2)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    for yarn in ({}, {"mscale_all_dim": 0.707}, {"factor": 8.0}):
        cfg = mla_config(**yarn, max_pos=4096 * 40)
        hf = DeepseekV3Attention(interop.to_hf_config(cfg, "deepseek_v3"), layer_idx=0)
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        assert yarn_softmax_scale(cfg, qk) == pytest.approx(hf.scaling, rel=1e-12)
