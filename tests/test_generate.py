"""The running example end to end, generation, sampling arguments."""
import pytest
import torch

from tokenflow import KVCache, decode_step, generate, prefill
from tokenflow.analysis.costmodel import kv_cache_bytes_per_token

PROMPT = "北京是中国的首"


def test_tokenizer_splits_the_seed_example(pretrained):
    _, tok = pretrained
    assert tok.tokens(PROMPT) == ["北京", "是", "中国", "的", "首"]
    assert tok.decode(tok.encode("Beijing is the capital of China.")) == \
        "Beijing is the capital of China."


def test_greedy_continues_with_du(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)])
    out = generate(model, ids, max_new_tokens=1)
    assert tok.decode(out[0, -1:]) == "都"


def test_fu_is_the_runner_up(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)])
    with torch.no_grad():
        top2 = model(ids)[0, -1].topk(2).indices.tolist()
    assert [tok.id_to_token(i) for i in top2] == ["都", "府"]


def test_generate_greedy_equals_stepwise_argmax(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode("东京是日本的")])
    out = generate(model, ids, max_new_tokens=5, stop_at_eos=False)
    seq = ids
    for _ in range(5):
        with torch.no_grad():
            nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(out, seq)


def test_prefill_decode_step_api(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)])
    cache = KVCache(model.config, 1, 12)
    logits = prefill(model, ids, cache)
    assert logits.shape == (1, model.config.vocab_size) and cache.length == 5
    logits2 = decode_step(model, logits.argmax(-1), cache)
    assert logits2.shape == (1, model.config.vocab_size) and cache.length == 6
    assert cache.bytes_per_token() == kv_cache_bytes_per_token(model.config, 4)


def test_seeded_sampling_is_reproducible(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode("巴黎")] * 3)
    runs = [generate(model, ids, 8, temperature=1.5, top_k=50, top_p=0.95,
                     generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_eos_stops_rows(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode("北京是中国的首都。")])
    out = generate(model, ids, 10, eos_token_id=tok.eos_token_id)
    assert out[0, -1].item() == tok.eos_token_id and out.shape[1] < ids.shape[1] + 10


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(temperature=-0.1), ValueError, "temperature"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(top_k=0), ValueError, "top_k must be >= 1"),
    (dict(top_k=2.5), TypeError, "top_k"),
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens"),
    (dict(max_new_tokens=10_000), ValueError, "max_position_embeddings"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens"),
    (dict(max_new_tokens=2.0), TypeError, "max_new_tokens"),
    (dict(eos_token_id=-1), ValueError, "eos_token_id"),
    (dict(eos_token_id=10**6), ValueError, "eos_token_id"),
    (dict(eos_token_id=True), TypeError, "eos_token_id"),
    (dict(eos_token_id=2.0), TypeError, "eos_token_id"),
    (dict(stop_at_eos=1), TypeError, "stop_at_eos"),
    (dict(temperature=1e-38, top_p=0.0), ValueError, "top_p"),
])
def test_generate_bad_arguments(pretrained, kwargs, exc, match):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)])
    with pytest.raises(exc, match=match):
        generate(model, ids, **{"max_new_tokens": 2, **kwargs})


def test_generate_stops_at_config_eos_by_default(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)])
    out = generate(model, ids, 6)
    new = out[0, ids.shape[1]:].tolist()
    assert model.config.eos_token_id in new
    assert new[-1] == model.config.eos_token_id and len(new) < 6
    full = generate(model, ids, 6, stop_at_eos=False)
    assert full.shape[1] == ids.shape[1] + 6
    assert torch.equal(full[0, :out.shape[1]], out[0])


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(input_ids=torch.tensor([5, 6])), ValueError, r"shape \[B, S\]"),
    (dict(input_ids=torch.tensor([[1.0]])), TypeError, "integer"),
    (dict(input_ids=torch.tensor([[10_000]]), max_new_tokens=0), ValueError, "vocab_size"),
    (dict(generator=5, temperature=1.0), TypeError, "torch.Generator"),
])
def test_generate_bad_inputs(pretrained, kwargs, exc, match):
    model, _ = pretrained
    args = {"input_ids": torch.tensor([[5, 6]]), "max_new_tokens": 2, **kwargs}
    with pytest.raises(exc, match=match):
        generate(model, **args)


def test_tokenizer_bad_inputs(pretrained):
    _, tok = pretrained
    with pytest.raises(TypeError, match="list of str"):
        tok.batch_encode("北京")
    with pytest.raises(ValueError, match="vocab_size"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="vocab_size"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="1-D"):
        tok.decode(torch.zeros(2, 2, dtype=torch.long))


def test_eos_at_the_vocab_edges_is_accepted(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)])
    for eos in (0, model.config.vocab_size - 1):
        out = generate(model, ids, 2, eos_token_id=eos)
        assert out.shape[1] <= ids.shape[1] + 2
    import numpy as np
    assert generate(model, ids, np.int64(2), stop_at_eos=False).shape[1] == ids.shape[1] + 2


def test_rows_finishing_at_different_steps_stay_finished(pretrained):
    """A batch whose rows reach <eos> at different steps: each row equals that prompt run
    alone (which stops at its own <eos>), and after its <eos> a row only repeats <eos>."""
    model, tok = pretrained
    prompts = ["北京是中国的首", "中国的首都是", "东京", "新疆的首府是"]
    eos = model.config.eos_token_id
    alone = [generate(model, torch.tensor([tok.encode(p)]), 12)[0, len(tok.encode(p)):].tolist()
             for p in prompts]
    stops = [a.index(eos) if eos in a else None for a in alone]
    assert len({s for s in stops if s is not None}) >= 2, stops    # rows end at different steps
    ids, mask = tok.batch_encode(prompts)
    out = generate(model, ids, 12, attention_mask=mask)
    new = out[:, ids.shape[1]:]
    for b, a in enumerate(alone):
        row = new[b].tolist()
        assert row[:len(a)] == a, (prompts[b], row, a)
        if stops[b] is not None:
            assert set(row[stops[b]:]) == {eos}, (prompts[b], row)


# ---- found by planting bugs (R1 review): each test names a neighbour the suite missed
def test_eos_equal_to_vocab_size_is_rejected(make_model):
    model = make_model()
    ids = torch.tensor([[5, 6]])
    with pytest.raises(ValueError, match="eos_token_id"):
        generate(model, ids, 2, eos_token_id=model.config.vocab_size)


def test_generate_may_fill_max_position_embeddings_exactly(make_model):
    model = make_model(max_position_embeddings=16)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (1, 14), generator=g)
    out = generate(model, ids, 2, stop_at_eos=False)                     # 14 + 2 == 16: allowed
    assert out.shape == (1, 16)
    with torch.no_grad():                                                # last token: argmax of
        assert int(out[0, -1]) == int(model(out[:, :-1])[0, -1].argmax())  # a plain forward
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate(model, ids, 3, stop_at_eos=False)                       # 17 > 16
