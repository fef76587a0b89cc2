"""Logit lens (chapter 06): every depth of the residual stream read through the final norm
and the LM head. Checked against Hugging Face transformers (its ``output_hidden_states`` put
through its own ``model.norm`` and ``lm_head``), against the model's own logits (1e-6), and
ranks against a sort-based count and hand-made cases."""
import pytest
import torch

from tokenflow import TokenFlowModel, interop, preset
from tokenflow.analysis.logit_lens import answer_depth, logit_lens, token_rank


def _random_model(seed: int = 0, **overrides) -> TokenFlowModel:
    """Wider-than-default random weights (std 0.08, norm weights in [0.8, 1.2])."""
    torch.manual_seed(seed)
    model = TokenFlowModel(preset("tiny", **overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08) if p.dim() == 2 else p.uniform_(0.8, 1.2)
    return model


@pytest.mark.parametrize("B,S", [(1, 1), (2, 7), (3, 4)])
def test_last_layer_lens_is_the_models_own_logits(B, S):
    model = _random_model(seed=B * 10 + S)
    ids = torch.randint(
        0, model.config.vocab_size, (B, S), generator=torch.Generator().manual_seed(S)
    )
    lens = logit_lens(model, ids)
    L = model.config.num_hidden_layers
    assert lens.shape == (L + 1, B, S, model.config.vocab_size)
    with torch.inference_mode():
        want = model(ids)                                     # a separate, untraced forward
    torch.testing.assert_close(lens[L], want, atol=1e-6, rtol=0)


def test_last_layer_lens_with_left_padding():
    model = _random_model(seed=3)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1)
    )
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.inference_mode():
        want = model(ids, attention_mask=mask)
    torch.testing.assert_close(logit_lens(model, ids, mask)[-1], want, atol=1e-6, rtol=0)


def test_every_depth_matches_hugging_face_hidden_states():
    """HF returns L+1 hidden states: the embedding output, the output of blocks 0..L-2, and
    the final *normed* state. Read each with HF's own norm and head."""
    model = _random_model(seed=7)
    hf = interop.to_hf_model(model).eval()
    ids = torch.randint(
        0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0)
    )
    lens = logit_lens(model, ids)
    L = model.config.num_hidden_layers
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
        hs = out.hidden_states
        assert len(hs) == L + 1
        for depth in range(L):
            want = hf.lm_head(hf.model.norm(hs[depth]))
            torch.testing.assert_close(lens[depth], want, atol=1e-4, rtol=0)
        torch.testing.assert_close(lens[L], hf.lm_head(hs[L]), atol=1e-4, rtol=0)
        torch.testing.assert_close(lens[L], out.logits, atol=1e-4, rtol=0)


def test_depth_zero_reads_the_embedding_row_by_hand():
    model = _random_model(seed=5)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    lens = logit_lens(model, ids)
    with torch.no_grad():
        e = model.embed_tokens.weight[ids[0]]                               # [S, H]
        x = e / torch.sqrt(e.pow(2).mean(-1, keepdim=True) + model.config.rms_norm_eps)
        want = (x * model.norm.weight) @ model.lm_head.weight.T            # [S, V]
    torch.testing.assert_close(lens[0, 0], want, atol=1e-5, rtol=0)


def test_token_rank_matches_a_sort():
    logits = torch.randn(4, 6, 50, generator=torch.Generator().manual_seed(0))   # no ties
    for tid in (0, 17, 49):
        order = logits.argsort(dim=-1, descending=True)                      # [4, 6, 50]
        want = (order == tid).nonzero()[:, -1].reshape(4, 6) + 1
        assert torch.equal(token_rank(logits, tid), want)


def test_token_rank_ties_share_the_better_rank():
    logits = torch.tensor([1.0, 3.0, 3.0, 0.0])
    assert [int(token_rank(logits, i)) for i in range(4)] == [3, 1, 1, 4]


def test_token_rank_rejects_bad_ids():
    with pytest.raises(ValueError, match="token_id"):
        token_rank(torch.zeros(5), 5)
    with pytest.raises(ValueError, match="token_id"):
        token_rank(torch.zeros(5), True)


def test_answer_depth_by_hand():
    top = torch.tensor([5.0, 0.0, 0.0])        # token 0 first
    low = torch.tensor([0.0, 5.0, 0.0])        # token 1 first
    def lens(*rows):
        return torch.stack(rows)[:, None, None, :]                          # [L+1, 1, 1, V]
    assert answer_depth(lens(top, top, top, top), 0) == 0
    assert answer_depth(lens(low, top, low, top), 0) == 3
    assert answer_depth(lens(low, top, top, top), 0) == 1
    assert answer_depth(lens(top, top, top, low), 0) is None
    with pytest.raises(ValueError, match="lens"):
        answer_depth(torch.zeros(3, 5), 0)
