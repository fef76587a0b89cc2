"""Boundaries and labels a fresh planting round found unpinned: each test fails when its
check is off by one or dropped."""
import pytest
import torch

from tokenflow import preset


@pytest.mark.parametrize("field", ["pad_token_id", "bos_token_id"])
def test_special_ids_must_be_inside_the_vocabulary(field):
    assert getattr(preset("tiny", **{field: 511}), field) == 511          # the last id
    with pytest.raises(ValueError, match=field):
        preset("tiny", **{field: 512})                                   # vocab_size 512


def test_sliding_layers_count_window_keys_only():
    """Past the window a sliding layer's query attends to exactly sliding_window keys: 2 nh W
    (D + D) FLOPs per token (hand count); a full layer to all past + new keys."""
    from tokenflow.analysis.roofline import forward_flops
    cfg = preset("tiny-dense", sliding_window=8)
    layers = [cfg.layer_is_sliding(i) for i in range(cfg.num_hidden_layers)]
    assert any(layers)
    nh, D = cfg.num_attention_heads, cfg.head_dim
    want = sum(2 * nh * (8 if s else 101) * (D + D) for s in layers)
    assert forward_flops(cfg, new_tokens=1, cached_tokens=100)["attention_scores"] == want
    # at the window exactly (8 keys) nothing is capped yet
    assert forward_flops(cfg, new_tokens=1, cached_tokens=7)["attention_scores"] == \
        cfg.num_hidden_layers * 2 * nh * 8 * (D + D)


def test_a_step_with_a_prompt_chunk_and_decode_rows_is_a_prefill_step(pretrained):
    """The lens labels a mixed step (chunked prefill beside decode rows) "prefill", a step of
    decode rows only "decode"."""
    from tokenflow.analysis.lenses import profile_engine_run
    from tokenflow.serving import LLMEngine, SamplingParams
    model, tok = pretrained
    engine = LLMEngine(model, num_blocks=32, block_size=16, max_num_seqs=4)
    prompts = [tok.encode("北京是中国的首"), tok.encode("东京是日本的首都。 Paris is")]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    prof = profile_engine_run(engine, prompts, params, [0, 2])
    mixed = [s for s in prof.steps if 0 < s.num_decode_rows < s.num_tokens]
    only_decode = [s for s in prof.steps if s.num_tokens == s.num_decode_rows > 0]
    assert mixed and only_decode
    assert {s.phase for s in mixed} == {"prefill"}
    assert {s.phase for s in only_decode} == {"decode"}


def test_traffic_matrix_refuses_a_rank_equal_to_the_world_size():
    from tokenflow.parallel.expert_parallel import traffic_matrix
    idx = torch.tensor([[0, 1], [2, 3]])
    ok = traffic_matrix(idx, torch.tensor([0, 1]), 4, 2)
    assert ok.sum().item() == 4
    with pytest.raises(ValueError, match="token_rank"):
        traffic_matrix(idx, torch.tensor([0, 2]), 4, 2)
    with pytest.raises(ValueError, match="token_rank"):
        traffic_matrix(idx, torch.tensor([-1, 0]), 4, 2)


def test_tokenizer_vocabulary_needs_the_specials_and_all_bytes():
    from tokenflow.tokenizer import SPECIAL_TOKENS, train_tokenizer
    floor = len(SPECIAL_TOKENS) + 256
    assert train_tokenizer(["北京是中国的首都。"], vocab_size=floor).vocab_size == floor
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["北京是中国的首都。"], vocab_size=floor - 1)


@pytest.mark.parametrize("kw", [dict(steps=0), dict(batch_size=0), dict(batch_size=-1)])
def test_train_refuses_empty_steps_and_batches(kw, tmp_path):
    from tokenflow.train import train
    with pytest.raises(ValueError, match="steps and batch_size"):
        train(out_dir=tmp_path, progress=False, **kw)
