"""The kernel-less versions of the chapter 03/04/06 explorers (``tokenflow.viz.*_static``):
one stored output per grid point, each the output the live explorer shows for that setting."""
from __future__ import annotations

import html
import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from tokenflow.model.config import ModelConfig  # noqa: E402
from tokenflow.analysis.logit_lens import logit_lens  # noqa: E402
from tokenflow.model.transformer import TokenFlowModel# noqa: E402
from tokenflow.viz import (decode_trace_static, decode_trace_summary, logit_lens_static,  # noqa: E402
                               logit_lens_topk, prob_text, sampling_static)


class Names:
    def id_to_token(self, i):
        return f"t{i}"


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    return TokenFlowModel(cfg).eval()


def _outputs(explorer) -> dict:
    page = explorer._repr_html_()
    return {k: html.unescape(v) for k, v in
            re.findall(r'<div class="tf-out" data-key="([\d-]+)"[^>]*>(.*?)</div>', page, re.S)}


@pytest.mark.parametrize("p, text", [(0.48921, "0.4892"), (0.001, "0.0010"), (5.2e-4, "0.0005"),
                                     (1e-4, "0.0001"), (3.84e-5, "<0.0001"), (1e-12, "<0.0001"),
                                     (0.0, "0"), (1.0, "1.0000")])
def test_prob_text_keeps_the_digits_that_matter(p, text):
    assert prob_text(p) == text


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_prob_text_rejects_non_probabilities(p):
    with pytest.raises(ValueError, match="probability"):
        prob_text(p)


def test_logit_lens_static_stores_the_live_text_for_every_depth_and_position(tiny):
    ids = torch.tensor([[3, 7, 11]])
    lens = logit_lens(tiny, ids)                                   # [L+1, 1, 3, V]
    ex = logit_lens_static(lens, Names(), ["a", "b", "c"], token_ids=[5])
    outs = _outputs(ex)
    assert len(outs) == lens.shape[0] * 3
    for d in range(lens.shape[0]):
        for s in range(3):
            assert logit_lens_topk(lens, Names(), d, s, [5]) in outs[f"{d}-{s}"]
    # the one shown first is the last depth at the last position
    assert re.search(
        rf'data-key="{lens.shape[0] - 1}-2"(?! style="display:none")', ex._repr_html_()
    )


def test_decode_trace_static_matches_the_summary(tiny):
    ex = decode_trace_static(tiny.config, batch_size=(1, 2), seq_len=(3,), num_experts=(4,))
    outs = _outputs(ex)
    assert set(outs) == {"0-0-0", "1-0-0"}
    assert decode_trace_summary(tiny.config, 2, 3, 4) in outs["1-0-0"]
    assert outs["0-0-0"] != outs["1-0-0"]


def test_sampling_static_titles_name_the_seeded_draw():
    from tokenflow.inference.sampling import sample
    logits = torch.linspace(3, -3, 30)
    ex = sampling_static(logits, Names(), temperature=(0.5, 2.0), top_k=(30,), top_p=(1.0,),
                         min_p=(0.0,), n=12)
    outs = _outputs(ex)
    assert len(outs) == 2
    for key, T in (("0-0-0-0", 0.5), ("1-0-0-0", 2.0)):
        drawn = int(sample(logits, T, 30, 1.0, 0.0, generator=torch.Generator().manual_seed(0)))
        assert f"drawn t{drawn}" in outs[key]
