"""The serving engine under bad input, failures and the features users of vLLM expect
(issues R2 and F13): every argument checked and copied when a request is added, one bad
request never wedges the engine, stop ids, abort, logprobs, frozen parameters, and the
request shapes and reports the first suite never exercised (prefix keys registered over
several steps, k x block_size + 1 prompts after a hit, EOS as the last allowed token, a
request arriving mid chunked prefill, step labels, hit rate, TPOT).

The reference for a request's tokens is :func:`tokenflow.generate` on that request alone,
with a ``torch.Generator`` seeded like the request.
"""
import copy
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from tokenflow import generate
from tokenflow.serving import (LLMEngine, RequestOutput, SamplingParams, request_timeline,
                               run_with_arrivals)
from tokenflow.serving import sampler as sampler_mod

from helpers import wide_random_model

BS = 4


def _ids(n, seed):
    return torch.randint(4, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _ref(model, prompt, sp=None, **kw):
    """``generate`` on this request alone (``sp``: the caller's SamplingParams)."""
    sp = sp or SamplingParams(**kw)
    g = torch.Generator().manual_seed(0 if sp.seed is None else int(sp.seed))
    out = generate(model, torch.tensor([prompt]), int(sp.max_new_tokens), float(sp.temperature),
                   sp.top_k, sp.top_p, sp.min_p, generator=g, eos_token_id=sp.eos_token_id,
                   stop_at_eos=not sp.ignore_eos)
    return out[0, len(prompt):].tolist()


def _engine(model, **kw):
    kw = dict(num_blocks=32, block_size=BS, max_num_seqs=4, max_num_batched_tokens=16) | kw
    return LLMEngine(model, **kw)


def _drain(engine):
    while engine.has_unfinished():
        engine.step()


def _all_blocks_free(engine):
    bm = engine.block_manager
    return (sorted(bm.free_block_ids) == list(range(bm.num_blocks))
            and all(b.ref_count == 0 for b in bm.blocks) and len(engine.runner.strategy) == 0
            and not engine.has_unfinished())


def _untouched(engine):
    return not engine.has_unfinished() and not engine.outputs and not engine.steps


# =================================================================== arguments (items 1-6)
def _sp(**bad):
    """A valid SamplingParams whose fields are then set to ``bad`` (construction checks
    them, so this is how a caller reaches add_request with them)."""
    sp = SamplingParams(4)
    for k, v in bad.items():
        setattr(sp, k, v)
    return sp


BAD_FIELDS = [  # (field, value, error) -- item 1, 2, 4, 5 and neighbours
    ("temperature", "0.5", TypeError), ("temperature", None, TypeError),
    ("temperature", True, TypeError), ("temperature", Decimal("0.5"), TypeError),
    ("temperature", float("nan"), ValueError), ("temperature", float("inf"), ValueError),
    ("temperature", -1.0, ValueError),
    ("top_k", 2.0, TypeError), ("top_k", Fraction(2, 1), TypeError), ("top_k", "2", TypeError),
    ("top_k", True, TypeError), ("top_k", 0, ValueError),
    ("top_p", "0.9", TypeError), ("top_p", float("nan"), ValueError), ("top_p", 1.5, ValueError),
    ("min_p", -0.1, ValueError), ("min_p", float("inf"), ValueError),
    ("max_new_tokens", 4.0, TypeError), ("max_new_tokens", Fraction(4, 1), TypeError),
    ("max_new_tokens", True, TypeError), ("max_new_tokens", None, TypeError),
    ("max_new_tokens", "4", TypeError), ("max_new_tokens", 0, ValueError),
    ("seed", 2**64, ValueError), ("seed", -1, ValueError), ("seed", 1.5, TypeError),
    ("seed", True, TypeError), ("seed", "7", TypeError),
    ("ignore_eos", "no", TypeError), ("ignore_eos", 1, TypeError), ("ignore_eos", None, TypeError),
    ("eos_token_id", 10**6, ValueError), ("eos_token_id", 512, ValueError),
    ("eos_token_id", -1, ValueError), ("eos_token_id", 2.0, TypeError),
    ("eos_token_id", "2", TypeError), ("eos_token_id", [2, 10**6], ValueError),
    ("eos_token_id", True, TypeError),
    ("stop_token_ids", 7, TypeError), ("stop_token_ids", [600], ValueError),
    ("stop_token_ids", ["a"], TypeError), ("stop_token_ids", "ab", TypeError),
    ("logprobs", -1, ValueError), ("logprobs", 1.0, TypeError), ("logprobs", 513, ValueError),
    ("logprobs", True, TypeError),
]


@pytest.mark.parametrize("field, value, error", BAD_FIELDS)
def test_bad_field_raises_naming_it_and_queues_nothing(model, field, value, error):
    engine = _engine(model)
    with pytest.raises(error, match=field):
        engine.add_request([5, 6, 7], _sp(**{field: value}))
    assert _untouched(engine)
    with pytest.raises(error, match=field):                     # a dict of fields too
        engine.add_request([5, 6, 7], {"max_new_tokens": 4, field: value})
    assert _untouched(engine)
    vocab_dependent = error is ValueError and value != -1 and field in (
        "eos_token_id", "stop_token_ids", "logprobs")            # checked when added
    if not vocab_dependent:                                     # and the constructor itself
        with pytest.raises(error, match=field):
            SamplingParams(**({"max_new_tokens": 4} | {field: value}))


def test_numeric_types_are_normalised_to_plain_python(model):
    """Item 1: a Fraction temperature used to pass validation and then make every step raise
    (``Tensor / Fraction``). Numbers of other types become plain int / float / bool at add
    time, and the request gives what the plain values give."""
    engine = _engine(model)
    odd = SamplingParams(np.int64(6), Fraction(1, 2), top_k=np.int32(50),
                         top_p=np.float32(0.875), min_p=Fraction(1, 100), seed=np.uint64(3),
                         ignore_eos=np.bool_(True), eos_token_id=np.int64(2),
                         stop_token_ids=(np.int64(3),), logprobs=np.int8(2))
    plain = SamplingParams(6, 0.5, top_k=50, top_p=0.875, min_p=0.01, seed=3, ignore_eos=True,
                           eos_token_id=2, stop_token_ids=[3], logprobs=2)
    prompt = _ids(6, 1)
    a, b = engine.run([prompt, prompt], [odd, plain], use_tqdm=False)
    assert a.finish_reason == b.finish_reason == "length"
    assert a.output_token_ids == b.output_token_ids == _ref(model, prompt, plain)
    stored = odd.normalized(512)
    for name, kind in [("max_new_tokens", int), ("temperature", float), ("top_k", int),
                       ("top_p", float), ("min_p", float), ("seed", int), ("ignore_eos", bool),
                       ("logprobs", int)]:
        assert type(getattr(stored, name)) is kind, name
    assert stored.eos_token_id == (2,) and type(stored.eos_token_id[0]) is int
    assert stored.stop_token_ids == (3,) and type(stored.stop_token_ids[0]) is int


BAD_PROMPTS = [(None, TypeError), ("abc", TypeError), (5, TypeError), ({5, 6}, TypeError),
               ([5.0, 6], TypeError), ([True, 5], TypeError), ([[5, 6]], TypeError),
               ([5, "6"], TypeError), (torch.tensor([5.0, 6.0]), TypeError),
               (torch.tensor([[5, 6]]), ValueError), (np.array([[5, 6]]), ValueError),
               ([], ValueError), ([5, 512], ValueError), ([-1, 5], ValueError)]


@pytest.mark.parametrize("prompt, error", BAD_PROMPTS)
def test_bad_prompt_raises_naming_it(model, prompt, error):
    engine = _engine(model)
    with pytest.raises(error, match="prompt_token_ids"):
        engine.add_request(prompt, SamplingParams(2))
    assert _untouched(engine)


def test_prompt_containers_accepted(model):
    engine = _engine(model)
    prompt = [5, 6, 7]
    outs = engine.run([prompt, tuple(prompt), torch.tensor(prompt), np.array(prompt),
                       [np.int64(t) for t in prompt]], SamplingParams(3), use_tqdm=False)
    assert {tuple(o.output_token_ids) for o in outs} == {tuple(_ref(model, prompt,
                                                                    max_new_tokens=3))}
    assert all(type(t) is int for o in outs for t in o.prompt_token_ids)


@pytest.mark.parametrize("params, error, word", [
    ("greedy", TypeError, "params"), (0.5, TypeError, "params"),
    ([SamplingParams(2)], TypeError, "params"), ({"beam_width": 2}, TypeError, "beam_width")])
def test_bad_params_object_raises(model, params, error, word):
    engine = _engine(model)
    with pytest.raises(error, match=word):
        engine.add_request([5, 6, 7], params)
    assert _untouched(engine)


@pytest.mark.parametrize("value, error", [("soon", TypeError), (True, TypeError),
                                          (float("nan"), ValueError), (float("inf"), ValueError),
                                          (-1.0, ValueError), (None, None),
                                          (Fraction(3, 2), None), (np.float64(2.5), None)])
def test_arrival_time_checked(model, value, error):
    """Item 2: ``arrival_time="soon"`` used to be accepted and make ``metrics()`` raise; a NaN
    made the mean TTFT NaN."""
    engine = _engine(model)
    if error is not None:
        with pytest.raises(error, match="arrival_time"):
            engine.add_request([5, 6], SamplingParams(2), arrival_time=value)
        assert _untouched(engine)
        return
    engine.add_request([5, 6], SamplingParams(2), arrival_time=value)
    _drain(engine)
    out = engine.outputs[0]
    assert type(out.arrival_time) is float
    assert math.isfinite(engine.metrics()["mean_e2e_s"])


def test_request_ids(model):
    """Item 3: automatic ids skip the ones the caller chose; duplicates and unhashable ids
    raise before anything is queued."""
    engine = _engine(model)
    assert engine.add_request([5, 6], SamplingParams(2), request_id=1) == 1
    outs = engine.run([[7, 8], [9, 10]], SamplingParams(2), use_tqdm=False)
    assert [o.request_id for o in outs] == [0, 2]
    assert engine.add_request([5], SamplingParams(2)) == 3
    assert engine.add_request([5], SamplingParams(2), request_id="x") == "x"
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request([5], SamplingParams(2), request_id=2)          # finished earlier
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request([5], SamplingParams(2), request_id="x")        # still waiting
    with pytest.raises(TypeError, match="request_id"):
        engine.add_request([5], SamplingParams(2), request_id=[1])
    with pytest.raises(TypeError, match="request_id"):
        engine.add_request([5], SamplingParams(2), request_id={"a": 1})
    assert len(engine.scheduler.waiting) == 2
    _drain(engine)
    assert _all_blocks_free(engine) and set(engine.outputs) == {0, 1, 2, 3, "x"}


@pytest.mark.parametrize("bad_index, prompts, params", [
    (1, [[5, 6, 7], [8, 9]], [SamplingParams(2), "greedy"]),              # item 2's example
    (2, [[5, 6], [7], None], SamplingParams(2)),
    (0, [[5, 600]], SamplingParams(2)),
    (1, [[5], [6]], [SamplingParams(2), _sp(seed=2**64)]),
    (2, [[5], [6], [7]], [None, {}, {"ignore_eos": "no"}])])
def test_run_checks_every_request_before_queueing_any(model, bad_index, prompts, params):
    engine = _engine(model)
    with pytest.raises((TypeError, ValueError), match=f"request {bad_index}"):
        engine.run(prompts, params, use_tqdm=False)
    assert _untouched(engine)
    outs = engine.run([[5, 6, 7]], SamplingParams(2), use_tqdm=False)    # ids start at 0
    assert outs[0].request_id == 0 and _all_blocks_free(engine)


def test_seed_range_ends_where_torch_generator_ends(model):
    """Item 4: ``seed=2**64`` used to fail inside torch with "Overflow when unpacking long
    long"; the largest seed torch takes works and draws what generate draws."""
    engine = _engine(model)
    prompt = _ids(5, 2)
    sp = SamplingParams(6, 1.0, seed=2**64 - 1)
    out = engine.run([prompt], sp, use_tqdm=False)[0]
    assert out.output_token_ids == _ref(model, prompt, sp)
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(6, 1.0, seed=2**64)


def test_eos_outside_vocab_one_check_for_generate_and_engine(model):
    """Item 5: the engine accepted ``eos_token_id=10**6`` while generate refused it; both now
    call :func:`tokenflow.sampling.check_token_ids` and say the same."""
    engine = _engine(model)
    with pytest.raises(ValueError) as e_engine:
        engine.add_request([5, 6], SamplingParams(2, eos_token_id=10**6))
    with pytest.raises(ValueError) as e_gen:
        generate(model, torch.tensor([[5, 6]]), 2, eos_token_id=10**6)
    assert str(e_engine.value) == str(e_gen.value) and "eos_token_id" in str(e_gen.value)
    with pytest.raises(TypeError) as t_engine:
        engine.add_request([5, 6], _sp(eos_token_id=2.0))
    with pytest.raises(TypeError) as t_gen:
        generate(model, torch.tensor([[5, 6]]), 2, eos_token_id=2.0)
    assert str(t_engine.value) == str(t_gen.value)
    assert _untouched(engine)


def test_parameters_frozen_when_added(model):
    """Item 6: one SamplingParams reused with max_new_tokens 2, 4, 6 gave lengths [6, 6, 6].
    Later changes to the caller's object (fields, or a list it holds) reach no request."""
    engine = _engine(model)
    prompt = _ids(4, 3)
    sp = SamplingParams(2, ignore_eos=True, stop_token_ids=[])
    ids = []
    for n in (2, 4, 6):
        sp.max_new_tokens = n
        ids.append(engine.add_request(prompt, sp))
    sp.temperature = 1.5
    sp.stop_token_ids.append(_ref(model, prompt, max_new_tokens=6, ignore_eos=True)[0])
    sp.ignore_eos = False
    _drain(engine)
    outs = [engine.outputs[i] for i in ids]
    assert [len(o.output_token_ids) for o in outs] == [2, 4, 6]
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[2].output_token_ids == _ref(model, prompt, max_new_tokens=6, ignore_eos=True)


# =================================================================== robustness (item 1)
def _fail_for_seed(monkeypatch, seed, exc=ZeroDivisionError("planted")):
    real = sampler_mod.sample_token

    def fake(logits, req, *greedy):
        if req.params.seed == seed:
            raise exc
        return real(logits, req, *greedy)
    monkeypatch.setattr(sampler_mod, "sample_token", fake)


@pytest.mark.parametrize("storage", ["paged", "contiguous"])
def test_one_failing_request_finishes_with_error_and_others_go_on(model, monkeypatch, storage):
    """An exception while sampling one request finishes it (``"error"``, the reason says
    what); the others in the same steps equal generate; every block comes back and the
    engine serves a later request."""
    _fail_for_seed(monkeypatch, 13)
    engine = _engine(model, kv_storage=storage)
    prompts = [_ids(7, 10), _ids(9, 11), _ids(5, 12)]
    params = [SamplingParams(5, seed=1), SamplingParams(6, 0.8, seed=13),
              SamplingParams(4, 1.0, seed=2)]
    outs = engine.run(prompts, params, use_tqdm=False)
    assert outs[1].finish_reason == "error" and "ZeroDivisionError: planted" in outs[1].reason
    for i in (0, 2):
        assert outs[i].output_token_ids == _ref(model, prompts[i], params[i])
    assert _all_blocks_free(engine)
    later = engine.run([prompts[1]], SamplingParams(3, seed=4), use_tqdm=False)[0]
    assert later.output_token_ids == _ref(model, prompts[1], SamplingParams(3, seed=4))
    assert engine.metrics()["num_requests"] == 4


def test_failure_after_some_tokens_keeps_them(model, monkeypatch):
    calls = {"n": 0}
    real = sampler_mod.sample_token

    def fake(logits, req, *greedy):
        if req.request_id == "b":
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("third draw")
        return real(logits, req, *greedy)
    monkeypatch.setattr(sampler_mod, "sample_token", fake)
    engine = _engine(model)
    prompt = _ids(6, 20)
    engine.add_request(prompt, SamplingParams(8, ignore_eos=True), request_id="a")
    engine.add_request(prompt, SamplingParams(8, ignore_eos=True), request_id="b")
    _drain(engine)
    a, b = engine.outputs["a"], engine.outputs["b"]
    assert b.finish_reason == "error" and b.output_token_ids == a.output_token_ids[:2]
    assert a.finish_reason == "length" and _all_blocks_free(engine)


@pytest.mark.parametrize("storage", ["paged", "contiguous"])
def test_a_failing_forward_never_wedges_the_engine(model, monkeypatch, storage):
    """A forward that raises cannot be pinned on one request: that step's requests finish with
    ``"error"``; the engine steps on and serves the next requests exactly."""
    engine = _engine(model, kv_storage=storage)
    real = engine.runner.strategy.forward
    calls = {"n": 0}

    def flaky(chunks):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device lost")
        return real(chunks)
    monkeypatch.setattr(engine.runner.strategy, "forward", flaky)
    prompts = [_ids(6, 30), _ids(6, 31)]
    outs = engine.run(prompts, SamplingParams(5, ignore_eos=True), use_tqdm=False)
    assert [o.finish_reason for o in outs] == ["error", "error"]
    assert "device lost" in outs[0].reason and _all_blocks_free(engine)
    outs = engine.run(prompts, SamplingParams(5, ignore_eos=True), use_tqdm=False)
    assert [o.output_token_ids for o in outs] == [
        _ref(model, p, max_new_tokens=5, ignore_eos=True) for p in prompts]
    assert _all_blocks_free(engine)


def test_good_requests_survive_every_bad_kind(model, monkeypatch):
    """Good requests added together with every bad kind of this file (each raises and
    queues nothing), one too long (rejected), one whose sampling fails (error) and one
    aborted: the good ones equal generate and every block is free at the end."""
    _fail_for_seed(monkeypatch, 666)
    engine = _engine(model, num_blocks=24, max_num_seqs=3, max_num_batched_tokens=12)
    system = _ids(8, 40)
    good = [(system + _ids(5, 41), SamplingParams(8, seed=1)),
            (_ids(20, 42), SamplingParams(10, 0.9, top_p=0.9, seed=2)),
            (system + _ids(3, 43), SamplingParams(12, Fraction(7, 10), seed=3)),
            (_ids(11, 44), SamplingParams(9, 1.0, min_p=0.05, seed=4, logprobs=2)),
            (system + _ids(6, 45), SamplingParams(7, seed=5, stop_token_ids=[0]))]
    bad = [([5, 6], _sp(**{f: v})) for f, v, _ in BAD_FIELDS] + \
          [(p, SamplingParams(2)) for p, _ in BAD_PROMPTS] + \
          [([5, 6], "greedy"), ([5, 6], {"beam_width": 2})]
    ids, raised = [], 0
    for i in range(max(len(good), len(bad))):
        if i < len(bad):
            with pytest.raises((TypeError, ValueError)):
                engine.add_request(*bad[i])
            raised += 1
        if i < len(good):
            ids.append(engine.add_request(*good[i]))
        if i == 2:
            rejected = engine.add_request(_ids(100, 46), SamplingParams(40))
            failing = engine.add_request(_ids(9, 47), SamplingParams(6, 1.0, seed=666))
            aborted = engine.add_request(_ids(9, 48), SamplingParams(6))
            engine.step()
            engine.step()
            assert engine.abort(aborted)
        if i % 3 == 0:
            engine.step()
    _drain(engine)
    assert raised == len(bad)
    for rid, (prompt, sp) in zip(ids, good):
        assert engine.outputs[rid].output_token_ids == _ref(model, prompt, sp), rid
    assert engine.outputs[rejected].finish_reason == "rejected"
    assert engine.outputs[failing].finish_reason == "error"
    assert engine.outputs[aborted].finish_reason == "abort"
    assert _all_blocks_free(engine)
    m = engine.metrics()
    assert math.isfinite(m["mean_ttft_s"])
    assert (m["num_rejected"], m["num_errors"], m["num_aborted"]) == (1, 1, 1)
    assert m["num_requests"] == len(good) + 3


# =================================================================== F13: what users expect
def _greedy_ref(model, prompt, n):
    return _ref(model, prompt, max_new_tokens=n, ignore_eos=True)


def _new_token(ref, start):
    """Index and value of the first token of ``ref`` from ``start`` on not seen before it."""
    return next((i, t) for i, t in enumerate(ref) if i >= start and t not in ref[:i])


def test_stop_token_ids_stop_at_any(model):
    prompt = _ids(6, 50)
    ref = _greedy_ref(model, prompt, 12)
    i, t = _new_token(ref, 3)
    j, u = _new_token(ref, i + 1)
    engine = _engine(model)
    outs = engine.run([prompt] * 3, [SamplingParams(12, ignore_eos=True, stop_token_ids=[u, t]),
                                     SamplingParams(12, ignore_eos=True, stop_token_ids=[u]),
                                     SamplingParams(12, stop_token_ids=[ref[0]],
                                                    eos_token_id=ref[0])], use_tqdm=False)
    assert outs[0].output_token_ids == ref[:i + 1] and outs[0].finish_reason == "stop"
    assert outs[1].output_token_ids == ref[:j + 1] and outs[1].finish_reason == "stop"
    assert outs[2].output_token_ids == ref[:1] and outs[2].finish_reason == "eos"
    assert _all_blocks_free(engine)


def test_config_with_several_eos_ids_stops_at_any(model):
    """Item 5 / F13: a config ``eos_token_id`` list (Llama 3's ``[128001, 128009]``) is kept
    whole: a request that leaves its EOS unset stops at whichever comes, as generate does."""
    prompt = _ids(6, 51)
    ref = _greedy_ref(model, prompt, 12)
    i, t = _new_token(ref, 2)
    m = copy.deepcopy(model)
    m.config.eos_token_id = [511 if t != 511 else 510, t]
    engine = _engine(m)
    out = engine.run([prompt], SamplingParams(12), use_tqdm=False)[0]
    assert out.output_token_ids == ref[:i + 1] and out.finish_reason == "eos"
    assert out.output_token_ids == _ref(m, prompt, max_new_tokens=12)


def test_abort_frees_blocks_at_once(model):
    engine = _engine(model, max_num_seqs=2)
    prompts = [_ids(9, 60), _ids(10, 61), _ids(7, 62)]
    for k, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(10, ignore_eos=True), request_id=k)
    engine.step()
    engine.step()
    running = {r.request_id: len(r.block_table) for r in engine.scheduler.running}
    assert set(running) == {0, 1} and [r.request_id for r in engine.scheduler.waiting] == [2]
    free = engine.block_manager.num_free_blocks
    assert engine.abort(1) is True
    assert engine.block_manager.num_free_blocks == free + running[1]     # at once
    assert 1 not in engine.runner.strategy
    assert engine.abort(2) is True                                       # a waiting one
    assert engine.abort(1) is False and engine.abort("nobody") is False
    out1 = engine.outputs[1]
    assert out1.finish_reason == "abort" and out1.output_token_ids == \
        _greedy_ref(model, prompts[1], 10)[:len(out1.output_token_ids)]
    assert engine.outputs[2].output_token_ids == []
    new = engine.step()
    assert {o.request_id for o in new} >= {1, 2}
    _drain(engine)
    assert engine.outputs[0].output_token_ids == _greedy_ref(model, prompts[0], 10)
    assert _all_blocks_free(engine)


def _full_logits(model, prompt, out):
    """Logits ``[n, V]`` predicting each output token, computed without any cache."""
    with torch.no_grad():
        x = model(torch.tensor([prompt + out]))[0].float()               # [S + n, V]
    return x[len(prompt) - 1:len(prompt) - 1 + len(out)]


@pytest.mark.parametrize("storage", ["paged", "contiguous"])
def test_logprobs_equal_log_softmax_of_the_raw_logits(model, storage):
    """Per output token: the chosen token and the top-n, each equal to ``log_softmax`` of the
    model's logits at that position **before** temperature (vLLM's raw logprobs), also
    across a preemption (tiny pool)."""
    engine = _engine(model, num_blocks=9, max_num_seqs=3, kv_storage=storage)
    prompts = [_ids(9, 70), _ids(10, 71), _ids(6, 72)]
    params = [SamplingParams(10, 0.7, seed=1, logprobs=3, ignore_eos=True),
              SamplingParams(8, seed=2, logprobs=0, ignore_eos=True),
              SamplingParams(6, 1.3, top_k=5, seed=3, logprobs=5, ignore_eos=True)]
    outs = engine.run(prompts, params, use_tqdm=False)
    assert engine.metrics()["num_preemptions"] >= 1
    for prompt, sp, o in zip(prompts, params, outs):
        assert o.output_token_ids == _ref(model, prompt, sp)
        assert len(o.logprobs) == len(o.output_token_ids)
        want = torch.log_softmax(_full_logits(model, prompt, o.output_token_ids), -1)
        for pos, (tok, lp) in enumerate(zip(o.output_token_ids, o.logprobs)):
            top = torch.topk(want[pos], sp.logprobs)
            ids = top.indices.tolist()
            assert list(lp)[:sp.logprobs] == ids
            assert set(lp) == set(ids) | {tok}
            got = torch.tensor([lp[k] for k in lp])
            assert torch.allclose(got, want[pos, list(lp)], atol=1e-4)
    no = engine.run([prompts[0]], SamplingParams(3), use_tqdm=False)[0]
    assert no.logprobs is None


# =================================================================== item 10: shapes, reports
def test_prefix_keys_chained_across_steps_of_registration(model):
    """A's 13-token prompt is prefilled 4 tokens a step, so its blocks X, Y, Z are registered
    in three different steps. B starts with A's blocks Y and Z: their keys must chain on X,
    so B gets no hit (A's Y block holds K/V computed after X, not B's). C = X + Y + ...
    hits both."""
    X, Y, Z = _ids(4, 80), _ids(4, 81), _ids(4, 82)
    a, b, c = X + Y + Z + [7], Y + Z + [9, 9], X + Y + [11, 12]
    engine = _engine(model, max_num_batched_tokens=4, max_num_seqs=1)
    sp = SamplingParams(4, ignore_eos=True)
    engine.run([a], sp, use_tqdm=False)
    prefills = [n for s in engine.steps for _, n in s.prefill]
    assert prefills[:4] == [4, 4, 4, 1]
    ob, oc = engine.run([b, c], sp, use_tqdm=False)
    assert ob.num_cached_tokens == 0 and ob.output_token_ids == _greedy_ref(model, b, 4)
    assert oc.num_cached_tokens == 8 and oc.output_token_ids == _greedy_ref(model, c, 4)


@pytest.mark.parametrize("k, extra", [(2, 1), (3, 1), (2, 0), (3, 2)])
def test_prompt_of_k_blocks_plus_one_after_a_prefix_hit(model, k, extra):
    """B shares A's first k blocks and has ``k * block_size + extra`` tokens: with extra = 1
    only its last token is computed (it starts block k + 1); with extra = 0 the last block's
    last token is recomputed (num_computed = (k - 1) blocks)."""
    shared = _ids(k * BS, 90 + k)
    a, b = shared + [5, 6, 7], shared + _ids(extra, 95)
    engine = _engine(model)
    engine.run([a], SamplingParams(3, ignore_eos=True), use_tqdm=False)
    ob = engine.run([b], SamplingParams(6, ignore_eos=True), use_tqdm=False)[0]
    assert ob.num_cached_tokens == (k if extra else k - 1) * BS
    assert ob.finish_reason == "length" and ob.output_token_ids == _greedy_ref(model, b, 6)
    assert _all_blocks_free(engine)


def test_eos_as_the_last_allowed_token_finishes_as_eos(model):
    prompt = _ids(7, 100)
    ref = _greedy_ref(model, prompt, 12)
    i, t = _new_token(ref, 2)
    engine = _engine(model)
    outs = engine.run([prompt] * 3, [SamplingParams(i + 1, eos_token_id=t),
                                     SamplingParams(i + 1, stop_token_ids=[t]),
                                     SamplingParams(i + 1, eos_token_id=t, ignore_eos=True)],
                      use_tqdm=False)
    assert [o.finish_reason for o in outs] == ["eos", "stop", "length"]
    assert all(o.output_token_ids == ref[:i + 1] for o in outs)


def test_request_leaving_eos_unset_takes_the_models(model):
    prompt = _ids(7, 101)
    ref = _greedy_ref(model, prompt, 12)
    i, t = _new_token(ref, 2)
    m = copy.deepcopy(model)
    m.config.eos_token_id = t
    out = _engine(m).run([prompt], SamplingParams(12), use_tqdm=False)[0]
    assert out.finish_reason == "eos" and out.output_token_ids == ref[:i + 1]
    out = _engine(m).run([prompt], SamplingParams(12, ignore_eos=True), use_tqdm=False)[0]
    assert out.output_token_ids == ref


def test_prompt_plus_new_tokens_exactly_max_positions(model):
    P = model.config.max_position_embeddings
    prompt = _ids(P - 5, 102)
    engine = _engine(model, num_blocks=P // BS, max_num_batched_tokens=64)
    ok, over = engine.run([prompt, prompt + [9]], SamplingParams(5, ignore_eos=True),
                          use_tqdm=False)
    assert ok.finish_reason == "length" and ok.output_token_ids == _greedy_ref(model, prompt, 5)
    assert over.finish_reason == "rejected" and "max_position_embeddings" in over.reason


def test_request_arriving_mid_chunked_prefill_hits_its_blocks(model):
    """A (24 tokens) is prefilled 10 tokens a step. B arrives after step 0 with A's first 16
    tokens: at step 2, while A still prefills, B is admitted, finds A's 4 registered blocks
    (the same physical blocks) and computes only its last 3 tokens."""
    a = _ids(24, 110)
    b = a[:16] + _ids(3, 111)
    engine = _engine(model, max_num_batched_tokens=10)
    sp = SamplingParams(5, ignore_eos=True)
    engine.add_request(a, sp, request_id="a")
    engine.step()
    engine.add_request(b, sp, request_id="b")
    engine.step()
    engine.step()
    assert engine.steps[2].prefill == [("a", 4), ("b", 3)]
    tables = {r.request_id: r.block_table for r in engine.scheduler.running}
    assert tables["b"][:4] == tables["a"][:4]
    _drain(engine)
    assert engine.outputs["b"].num_cached_tokens == 16
    assert engine.outputs["b"].output_token_ids == _greedy_ref(model, b, 5)
    assert engine.outputs["a"].output_token_ids == _greedy_ref(model, a, 5)


def test_one_token_last_prompt_chunk_is_prefill(model):
    """A 9-token prompt at 4 tokens a step: chunks 4, 4, 1. The 1-token last chunk is still
    prefill (it samples the first token), the next step is the first decode."""
    engine = _engine(model, max_num_batched_tokens=4)
    _, arrivals = engine.run([_ids(9, 120)], SamplingParams(3, ignore_eos=True),
                             use_tqdm=False), {0: 0}
    assert [(s.prefill, s.decode) for s in engine.steps] == [
        ([(0, 4)], []), ([(0, 4)], []), ([(0, 1)], []), ([], [0]), ([], [0])]
    tl = request_timeline(engine, arrivals)[0]
    assert tl.first_token_step == 2 and tl.count("prefill") == 3 and tl.count("decode") == 2


def test_prefix_cache_hit_rate_is_hits_over_looked_up_blocks(model):
    """A: 12 tokens, looks up (12 - 1) // 4 = 2 full blocks, hits 0. B: A's first 8 + 3:
    looks up 2, hits 2. Rate 2 / 4."""
    a = _ids(12, 130)
    b = a[:8] + _ids(3, 131)
    engine = _engine(model)
    engine.run([a], SamplingParams(2), use_tqdm=False)
    engine.run([b], SamplingParams(2), use_tqdm=False)
    bm = engine.block_manager
    assert (bm.num_hit_blocks, bm.num_queried_blocks) == (2, 4)
    assert engine.metrics()["prefix_cache_hit_rate"] == 0.5


def test_ttft_tpot_e2e_from_known_times(model):
    """TPOT averages the n - 1 intervals from the first to the last token."""
    o = RequestOutput(0, [1], [5, 6, 7, 8, 9], "length", arrival_time=1.0,
                      first_token_time=1.5, finish_time=3.5, last_token_time=3.5)
    assert o.ttft == 0.5 and o.e2e_latency == 2.5 and o.tpot == 0.5
    assert RequestOutput(0, [1], [5], "length", 0, 1.0, 1.5, 1.5,
                         last_token_time=1.5).tpot is None
    engine = _engine(model)
    engine.outputs = {0: o, 1: RequestOutput(1, [1], [5, 6], "length", None, 0.0, 1.0, 2.0,
                                             last_token_time=2.0)}
    m = engine.metrics()
    assert m["mean_tpot_s"] == pytest.approx(0.75) and m["mean_ttft_s"] == pytest.approx(0.75)
    assert m["num_generated_tokens"] == 7


def test_config_without_eos_never_stops_early(model):
    """A config whose ``eos_token_id`` is None (some HF configs): generate and the engine both
    run to ``max_new_tokens``; a request can still set its own EOS."""
    prompt = _ids(7, 140)
    ref = _greedy_ref(model, prompt, 10)
    i, t = _new_token(ref, 2)
    m = copy.deepcopy(model)
    m.config.eos_token_id = None
    assert generate(m, torch.tensor([prompt]), 10)[0, 7:].tolist() == ref
    a, b = _engine(m).run([prompt, prompt],
                          [SamplingParams(10), SamplingParams(10, eos_token_id=t)],
                          use_tqdm=False)
    assert a.output_token_ids == ref and a.finish_reason == "length"
    assert b.output_token_ids == ref[:i + 1] and b.finish_reason == "eos"


# =================================================================== F13: n > 1 samples
def test_n_samples_share_the_prompt_blocks_by_reference_count(model):
    """``n=3``: three samples ``(rid, i)``, seeded ``seed + i``, each equal to generate with
    that seed. Samples 1 and 2 wait one step for sample 0's prompt, then hold its 3 full
    prompt blocks too (reference count 3) instead of computing and storing them again."""
    prompt = _ids(14, 150)                                        # 3 full blocks + 2 tokens
    engine = _engine(model)
    sp = SamplingParams(6, 1.0, seed=7, n=3, ignore_eos=True)
    rid = engine.add_request(prompt, sp)
    engine.step()
    assert engine.steps[0].prefill == [((rid, 0), 14)]
    engine.step()
    assert engine.steps[1].prefill == [((rid, 1), 2), ((rid, 2), 2)]
    tables = {r.request_id: r.block_table for r in engine.scheduler.running}
    shared = tables[(rid, 0)][:3]
    assert tables[(rid, 1)][:3] == tables[(rid, 2)][:3] == shared
    assert [engine.block_manager.blocks[b].ref_count for b in shared] == [3, 3, 3]
    _drain(engine)
    outs = [engine.outputs[(rid, i)] for i in range(3)]
    for i, o in enumerate(outs):
        one = SamplingParams(6, 1.0, seed=7 + i, ignore_eos=True)
        assert o.output_token_ids == _ref(model, prompt, one), i
    assert [o.num_cached_tokens for o in outs] == [0, 12, 12]
    assert len({tuple(o.output_token_ids) for o in outs}) == 3
    assert _all_blocks_free(engine) and rid not in engine.outputs


def test_n_samples_in_run_abort_and_ids(model):
    engine = _engine(model)
    engine.add_request([5, 6], SamplingParams(2), request_id=(1, 0))
    with pytest.raises(ValueError, match="already in use"):          # (1, 0) is taken
        engine.add_request([5, 6], SamplingParams(2, n=2), request_id=1)
    with pytest.raises(ValueError, match="request 1"):
        engine.run([[5, 6], [7]], [SamplingParams(2, n=2), _sp(n=0)], use_tqdm=False)
    outs = engine.run([[5, 6, 7], [8, 9]], [SamplingParams(3, n=2, seed=1), SamplingParams(3)],
                      use_tqdm=False)
    assert [o.request_id for o in outs] == [(0, 0), (0, 1), 1]
    other = _engine(model)
    other.add_request([5], SamplingParams(2), request_id=(1, 0))
    assert other.add_request([5], SamplingParams(2)) == 0
    assert other.add_request([5], SamplingParams(2, n=2)) == 2       # 1: (1, 0) is taken
    _drain(other)
    assert set(other.outputs) == {(1, 0), 0, (2, 0), (2, 1)}
    rid = engine.add_request(_ids(9, 151), SamplingParams(8, 1.0, n=3, seed=2))
    engine.step()
    assert engine.abort(rid) is True and engine.abort(rid) is False
    assert [engine.outputs[(rid, i)].finish_reason for i in range(3)] == ["abort"] * 3
    assert _all_blocks_free(engine)


# =================================================================== mutation-test additions
def test_logprobs_may_ask_for_the_whole_vocabulary(model):
    """``logprobs=vocab_size`` is the top of the range: every token's log-probability, the
    probabilities summing to 1; one more is refused."""
    V = model.config.vocab_size
    engine = _engine(model)
    o = engine.run([_ids(5, 160)], SamplingParams(2, logprobs=V), use_tqdm=False)[0]
    assert [len(lp) for lp in o.logprobs] == [V, V]
    assert math.isclose(sum(math.exp(v) for v in o.logprobs[0].values()), 1.0, rel_tol=1e-4)
    with pytest.raises(ValueError, match="logprobs"):
        engine.add_request([5], SamplingParams(2, logprobs=V + 1))


def test_request_one_token_over_the_pool_is_rejected(model):
    """4 blocks of 4: prompt + max_new_tokens = 16 runs, 17 (5 blocks) is rejected at once
    (it could never be admitted) and says why; the other request is unaffected."""
    engine = _engine(model, num_blocks=4)
    prompt, sp = _ids(12, 161), SamplingParams(4, ignore_eos=True)
    over = engine.outputs[engine.add_request(prompt + [9], sp)]   # rejected when added
    assert over.finish_reason == "rejected" and "num_blocks=4" in over.reason
    assert not engine.has_unfinished()
    ok = engine.run([prompt], sp, use_tqdm=False)[0]
    assert ok.finish_reason == "length" and ok.output_token_ids == _greedy_ref(model, prompt, 4)


def test_n_samples_wait_for_the_whole_prompt_of_sample_0(model):
    """Sample 0's 14-token prompt takes two steps (budget 13): samples 1 and 2 are admitted
    only in the step after its last prompt token was computed, never with it."""
    prompt = _ids(14, 162)
    engine = _engine(model, max_num_batched_tokens=13)
    rid = engine.add_request(prompt, SamplingParams(3, 1.0, seed=5, n=3, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert [s.prefill for s in engine.steps] == [
        [((rid, 0), 13)], [((rid, 0), 1)], [((rid, 1), 2), ((rid, 2), 2)]]
    _drain(engine)
    assert [engine.outputs[(rid, i)].num_cached_tokens for i in range(3)] == [0, 12, 12]


def test_metrics_count_aborts_and_errors_apart(model, monkeypatch):
    """Two aborted requests, one failed, one finished: the counts do not mix."""
    engine = _engine(model)
    ids = [engine.add_request(_ids(5, 163 + i), SamplingParams(4, seed=i)) for i in range(4)]
    engine.step()
    assert engine.abort(ids[0]) and engine.abort(ids[1])
    _fail_for_seed(monkeypatch, 2)
    _drain(engine)
    m = engine.metrics()
    assert (m["num_aborted"], m["num_errors"], m["num_requests"]) == (2, 1, 4)
    assert [engine.outputs[i].finish_reason for i in ids] == ["abort", "abort", "error",
                                                               "length"]


def test_decode_rows_are_attended_as_one_batch(model):
    """A step with decode rows and a prompt chunk puts the decode rows first, so the packed
    step attends them as one batch (``num_decode``), whatever the plan's order."""
    engine = _engine(model)
    seen, forward = [], engine.model.forward_packed

    def spy(ids, step, *a):
        seen.append((step.num_decode, step.cu_seqlens_q.tolist()))
        return forward(ids, step, *a)

    engine.model.forward_packed = spy
    try:
        engine.add_request(_ids(5, 170), SamplingParams(6, ignore_eos=True))
        engine.add_request(_ids(6, 171), SamplingParams(6, ignore_eos=True))
        engine.step()                                            # two prompts
        engine.add_request(_ids(18, 172), SamplingParams(2, ignore_eos=True))
        engine.step()                                            # 2 decodes + 14-token chunk
        engine.step()                                            # 2 decodes + 4-token chunk
    finally:
        del engine.model.forward_packed
    assert seen == [(0, [0, 5, 11]), (2, [0, 1, 2, 16]), (2, [0, 1, 2, 6])]


def test_throughput_counts_generated_tokens(model):
    """``throughput_tok_s`` = generated tokens / elapsed, not the computed (prompt) tokens."""
    engine = _engine(model)
    engine.run([_ids(9, 173), _ids(7, 174)], SamplingParams(3, ignore_eos=True), use_tqdm=False)
    m = engine.metrics()
    assert (m["num_generated_tokens"], m["num_computed_tokens"]) == (6, 20)
    assert m["throughput_tok_s"] == pytest.approx(6 / m["elapsed_s"])


def test_arrivals_out_of_prompt_order(model):
    """``arrival_steps`` need not be sorted: request 1 comes before step 0, request 0 before
    step 2 (while request 1 still runs)."""
    prompts = [_ids(5, 175), _ids(6, 176)]
    sp = SamplingParams(5, ignore_eos=True)
    outs, arrivals = run_with_arrivals(_engine(model), prompts, [sp, sp], [2, 0])
    assert arrivals == {1: 0, 0: 2}
    assert [o.output_token_ids for o in outs] == [_greedy_ref(model, p, 5) for p in prompts]


def test_greedy_tokens_are_each_rows_argmax():
    """The step's greedy rows sampled as one batch give each row's own argmax; a row with a
    NaN and a sampled row are left to ``sample_token``; a missing row disables the batch."""
    from types import SimpleNamespace as NS
    g = torch.Generator().manual_seed(0)
    logits = {i: torch.randn(50, generator=g) for i in "abcd"}
    logits["c"][3] = float("nan")
    reqs = [NS(request_id=i, params=NS(temperature=t))
            for i, t in zip("abcd", (0.0, 0.0, 0.0, 0.8))]
    assert sampler_mod.greedy_tokens(reqs, logits) == {i: int(logits[i].argmax()) for i in "ab"}
    assert sampler_mod.greedy_tokens(reqs + [NS(request_id="e", params=NS(temperature=0.0))],
                                     logits) == {}


def test_a_greedy_row_whose_sum_overflows_still_gets_its_argmax():
    """``greedy_tokens`` takes a row as finite when its sum is: a row of finite logits
    whose sum overflows float32 is left to ``sample_token``, which gives its argmax."""
    from types import SimpleNamespace as NS
    row = torch.full((6,), 3e38)
    row[2] = 3.2e38                                     # every entry finite, the sum is inf
    req = NS(request_id="a", params=NS(temperature=0.0, logprobs=None), generator=None)
    assert bool(torch.isfinite(row).all()) and not bool(torch.isfinite(row.sum()))
    assert sampler_mod.greedy_tokens([req], {"a": row}) == {}
    assert sampler_mod.sample_requests([req], {"a": row})["a"].token == 2


# =================================================================== plants 2: the survivors
@pytest.mark.parametrize("steps_before_abort", [0, 1, 3])
def test_n_samples_go_on_when_sample_0_is_aborted(model, steps_before_abort):
    """Sample 0 aborted before its prefill (0 steps), in the middle of its chunked prefill
    (1 step of 8 of its 20 prompt tokens) or after it (3 steps): sample 1 still runs to its
    length with the greedy tokens, instead of waiting on a prompt that will never be
    computed."""
    prompt = _ids(20, 170)
    engine = _engine(model, max_num_batched_tokens=8)
    rid = engine.add_request(prompt, SamplingParams(3, ignore_eos=True, n=2))
    for _ in range(steps_before_abort):
        engine.step()
    assert engine.abort((rid, 0))
    for _ in range(12):                              # 20 + 3 tokens at 8 a step: ~5 steps
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished()
    s0, s1 = engine.outputs[(rid, 0)], engine.outputs[(rid, 1)]
    assert (s0.finish_reason, s1.finish_reason) == ("abort", "length")
    assert s1.output_token_ids == _greedy_ref(model, prompt, 3)
    assert _all_blocks_free(engine)


@pytest.mark.parametrize("storage", ["paged", "padded", "contiguous"])
def test_storage_counts_after_a_prefix_cache_hit(model, storage):
    """b's 14-token prompt shares a's 12 (3 full blocks): the step schedules b's 2 new
    tokens; the paged storages compute those 2 positions, the contiguous one recomputes the
    12 hit tokens too (14). Either way the storage holds K/V of all 14 positions, and b's
    tokens are the greedy ones."""
    a = _ids(12, 171)
    engine = _engine(model, kv_storage=storage)
    engine.add_request(a, SamplingParams(2, ignore_eos=True), request_id="a")
    _drain(engine)
    assert (engine.steps[0].num_tokens, engine.steps[0].num_positions) == (12, 12)
    b = a + [20, 21]
    engine.add_request(b, SamplingParams(3, ignore_eos=True), request_id="b")
    engine.step()
    req = engine.scheduler.running[0]
    assert (req.num_cached_tokens, req.num_computed_tokens) == (12, 14)
    assert engine.runner.strategy.num_computed("b") == 14
    s = engine.steps[-1]
    assert s.prefill == [("b", 2)]
    assert (s.num_tokens, s.num_positions) == (2, 14 if storage == "contiguous" else 2)
    assert engine.runner.num_positions == s.num_positions
    assert engine.metrics()["num_recomputed_tokens"] == (12 if storage == "contiguous" else 0)
    engine.step()                                    # a decode step after the hit
    assert engine.runner.strategy.num_computed("b") == 15
    _drain(engine)
    assert engine.outputs["b"].output_token_ids == _greedy_ref(model, b, 3)


@pytest.mark.parametrize("storage, positions", [("paged", [16, 2, 2]), ("padded", [18, 2, 2]),
                                                ("contiguous", [16, 2, 2])])
def test_positions_and_computed_tokens_of_two_prompts(model, storage, positions):
    """Prompts of 7 and 9 tokens in one step, then two decode steps: 16, 2, 2 tokens
    scheduled. Padded computes B * S_max = 2 * 9 = 18 positions for the first; the metric
    ``num_computed_tokens`` is the scheduled tokens (20), not the positions."""
    engine = _engine(model, kv_storage=storage)
    engine.run([_ids(7, 172), _ids(9, 173)], SamplingParams(3, ignore_eos=True),
               use_tqdm=False)
    assert [s.num_tokens for s in engine.steps] == [16, 2, 2]
    assert [s.num_positions for s in engine.steps] == positions
    assert engine.metrics()["num_computed_tokens"] == 20


def test_metric_computed_tokens_not_the_recomputed_positions(model):
    """Contiguous storage after a 12-token prefix hit: 14 positions computed for 2 scheduled
    tokens; ``num_computed_tokens`` counts 12 + 1 (a) + 2 + 1 (b) = 16."""
    a = _ids(12, 174)
    engine = _engine(model, kv_storage="contiguous")
    engine.run([a], SamplingParams(2, ignore_eos=True), use_tqdm=False)
    engine.run([a + [20, 21]], SamplingParams(2, ignore_eos=True), use_tqdm=False)
    assert [s.num_tokens for s in engine.steps] == [12, 1, 2, 1]
    assert [s.num_positions for s in engine.steps] == [12, 1, 14, 1]
    assert engine.metrics()["num_computed_tokens"] == 16


@pytest.mark.parametrize("storage", ["paged", "contiguous"])
def test_step_record_counts_the_tokens_of_a_chunk_that_failed(model, monkeypatch, storage):
    """Prompts of 7 and 9 tokens in one step, the 9-token one fails while sampling: the
    step still computed 16 tokens (its record says so), and the metric counts them:
    16 + 1 + 1 (the other's two decode steps) = 18."""
    _fail_for_seed(monkeypatch, 1)
    engine = _engine(model, kv_storage=storage)
    p0, p1 = _ids(7, 175), _ids(9, 176)
    outs = engine.run([p0, p1], [SamplingParams(3, seed=0, ignore_eos=True),
                                 SamplingParams(3, seed=1, ignore_eos=True)], use_tqdm=False)
    assert [o.finish_reason for o in outs] == ["length", "error"]
    assert [s.num_tokens for s in engine.steps] == [16, 1, 1]
    assert engine.steps[0].num_positions == 16
    assert engine.steps[0].prefill == [(outs[0].request_id, 7), (outs[1].request_id, 9)]
    assert engine.metrics()["num_computed_tokens"] == 18
    assert outs[0].output_token_ids == _greedy_ref(model, p0, 3)


def test_max_num_tokens_and_contiguous_capacity(model):
    """A 5-token prompt with 4 new tokens can reach 9 tokens: the contiguous cache gets
    ceil(9 / 4) * 4 = 12 slots (8 when max_new_tokens is 3, 5 + 3 = 8 already a multiple)."""
    from tokenflow.serving import Request
    prompt = _ids(5, 177)
    assert Request("x", prompt, SamplingParams(4)).max_num_tokens == 9
    assert Request("x", prompt, SamplingParams(3)).max_num_tokens == 8
    engine = _engine(model, kv_storage="contiguous")
    engine.add_request(prompt, SamplingParams(4, ignore_eos=True), request_id="a")
    engine.add_request(prompt, SamplingParams(3, ignore_eos=True), request_id="b")
    engine.step()
    caches = engine.runner.strategy.caches
    assert [caches[r].k[0].shape[2] for r in ("a", "b")] == [12, 8]
    _drain(engine)
    assert engine.outputs["a"].output_token_ids == _greedy_ref(model, prompt, 4)


@pytest.mark.parametrize("field, value, eos_ids, stop_ids", [
    ("eos_token_id", 0, (0,), ()), ("eos_token_id", [0], (0,), ()),
    ("eos_token_id", [0, 5], (0, 5), ()), ("stop_token_ids", [0], None, (0,))])
def test_token_id_zero_is_a_real_eos_or_stop_id(model, field, value, eos_ids, stop_ids):
    """``eos_token_id=0`` is id 0, not "unset": the config's EOS does not replace it (only
    None does); a stop id 0 is kept as well."""
    assert model.config.eos_token_id == 2
    engine = _engine(model)
    engine.add_request(_ids(5, 178), SamplingParams(3, **{field: value}), request_id="a")
    req = engine.scheduler.waiting[0]
    assert tuple(req.eos_ids) == ((2,) if eos_ids is None else eos_ids)
    assert tuple(req.stop_ids) == stop_ids


def test_eos_token_id_zero_stops_at_token_zero(model, monkeypatch):
    """A request whose eos_token_id is 0 finishes as "eos" when its first token is 0 (the
    logits are forced to choose 0), one with the config's EOS goes on to its length."""
    real = sampler_mod.sample_token

    def zero_first(logits, req, *greedy):
        if not req.output_token_ids:
            logits = torch.full_like(logits, -1.0)
            logits[0] = 1.0
            return real(logits, req)
        return real(logits, req, *greedy)
    monkeypatch.setattr(sampler_mod, "sample_token", zero_first)
    monkeypatch.setattr(sampler_mod, "greedy_tokens", lambda reqs, logits: {})
    engine = _engine(model)
    prompt = _ids(5, 179)
    outs = engine.run([prompt, prompt], [SamplingParams(3, eos_token_id=0),
                                         SamplingParams(3, ignore_eos=True)], use_tqdm=False)
    assert [(o.finish_reason, o.output_token_ids[0]) for o in outs] == [("eos", 0),
                                                                          ("length", 0)]
    assert len(outs[0].output_token_ids) == 1 and len(outs[1].output_token_ids) == 3


def test_n_sample_seeds_wrap_at_2_64(model):
    """n=2 with seed 2**64 - 1: the samples get seeds 2**64 - 1 and 0 (wrapped, as a torch
    generator's seed range ends there); sample 1 draws what a lone request with seed 0
    draws."""
    prompt = _ids(5, 180)
    engine = _engine(model)
    sp = SamplingParams(3, 1.0, seed=2**64 - 1, n=2, ignore_eos=True)
    rid = engine.add_request(prompt, sp)
    assert [r.params.seed for r in engine.scheduler.waiting] == [2**64 - 1, 0]
    _drain(engine)
    assert engine.outputs[(rid, 1)].output_token_ids == _ref(
        model, prompt, max_new_tokens=3, temperature=1.0, seed=0, ignore_eos=True)
    assert engine.outputs[(rid, 0)].finish_reason == "length"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("bad, error", [(float("nan"), "NaN"), (float("inf"), "+inf"),
                                        (float("-inf"), None)])
def test_non_finite_logits_greedy_and_sampled(temperature, bad, error):
    """NaN or +inf in a row: greedy and sampled rows alike raise ValueError (no token is
    taken from such a row; ``sample_requests`` turns it into that row's error); -inf only
    masks its token out."""
    from tokenflow.serving import Request
    from tokenflow.serving.sampler import sample_requests, sample_token
    logits = torch.tensor([1.0, bad, 0.5, 0.0])
    req = Request("a", [1], SamplingParams(temperature=temperature, seed=0).normalized(4))
    req.generator = req.params.make_generator()
    if error is None:
        assert sample_token(logits, req).token != 1
        assert sample_requests([req], {"a": logits})["a"].token not in (None, 1)
        if temperature == 0.0:
            assert sample_token(logits, req).token == 0
        return
    with pytest.raises(ValueError, match=error.replace("+", r"\+")):
        sample_token(logits, req)
    s = sample_requests([req], {"a": logits})["a"]
    assert s.token is None and s.error.startswith("ValueError") and error in s.error


# =================================================================== plants 3: the survivors
def test_arrival_time_zero_is_accepted(model):
    """0 is the bottom of the allowed range (``>= 0``), as an int or a float."""
    engine = _engine(model)
    engine.add_request([5, 6], SamplingParams(2), arrival_time=0.0)
    engine.add_request([5, 6], SamplingParams(2), arrival_time=0)
    assert [r.arrival_time for r in engine.scheduler.waiting] == [0.0, 0.0]


def test_n_samples_share_one_arrival_time(model, monkeypatch):
    """The ``n`` samples of one request arrived together: one clock reading for all (a
    clock that ticks at every reading shows a second one)."""
    import itertools
    import time
    clock = itertools.count(100.0)
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(clock)))
    engine = _engine(model)
    engine.add_request([5, 6, 7], SamplingParams(2, n=3))
    assert len({r.arrival_time for r in engine.scheduler.waiting}) == 1


def test_abort_parent_after_one_sample_finished(model):
    """Sample 0 already finished (aborted): aborting the parent still aborts sample 1 and
    says so; once nothing is left it says False."""
    engine = _engine(model)
    rid = engine.add_request([5, 6, 7, 8, 9], SamplingParams(4, n=2))
    assert engine.abort((rid, 0)) is True
    assert engine.abort(rid) is True
    assert engine.outputs[(rid, 1)].finish_reason == "abort"
    assert engine.abort(rid) is False and not engine.has_unfinished()


class _RecordingTokenizer:
    """Character-level ids (long enough to be cut); remembers every encoding."""

    def __init__(self):
        self.encoded = []

    def encode(self, text):
        self.encoded.append([ord(ch) % 5000 + 4 for ch in text])
        return list(self.encoded[-1])


def test_mixed_workload_cut_keeps_the_end_of_the_prompt():
    """A prompt longer than ``max_len - max_new_tokens`` loses its head: the sentence to
    complete (the prompt's end) stays."""
    from tokenflow.serving import mixed_workload
    tok = _RecordingTokenizer()
    prompts, params, _ = mixed_workload(tok, 8, seed=0, max_len=64)
    assert len(tok.encoded) == 8
    cut = 0
    for p, sp, full in zip(prompts, params, tok.encoded):
        assert len(p) == min(len(full), 64 - sp.max_new_tokens)
        assert full[len(full) - len(p):] == p
        cut += len(p) < len(full)
    assert cut >= 3


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_mixed_workload_first_arrival_is_step_0(seed):
    """The first request arrives at step 0, each next one 0 to ``max_gap`` steps later."""
    from tokenflow.serving import mixed_workload
    _, _, arrivals = mixed_workload(_RecordingTokenizer(), 8, seed=seed)
    assert arrivals[0] == 0
    assert all(0 <= b - a <= 3 for a, b in zip(arrivals, arrivals[1:]))


@pytest.mark.parametrize("max_len", [56, 40, 0, 64.0, True])
def test_mixed_workload_refuses_a_max_len_without_room(max_len):
    """A ``max_len`` that cannot hold one prompt token next to the longest output (56) would
    cut prompts from the wrong end (a negative slice); it is refused, naming the argument."""
    from tokenflow.serving import mixed_workload
    with pytest.raises(ValueError, match="max_len"):
        mixed_workload(None, 4, max_len=max_len)


# =================================================================== plants 4: the survivors
def test_step_record_names_the_preempted_request(model):
    """A pool too small for two growing requests preempts one; the step that did it lists its
    id, and the count matches the metrics and the request's own output."""
    engine = _engine(model, num_blocks=6, enable_prefix_caching=False)
    outs = engine.run([_ids(5, 1), _ids(5, 2)], SamplingParams(max_new_tokens=12, ignore_eos=True))
    listed = [rid for s in engine.steps for rid in s.preempted]
    assert listed and len(listed) == engine.metrics()["num_preemptions"] \
        == sum(o.num_preemptions for o in outs)
    assert all(rid in (o.request_id for o in outs) for rid in listed)


def test_mean_tpot_is_the_mean_of_each_requests_tpot(model):
    engine = _engine(model)
    outs = engine.run([_ids(6, 3), _ids(9, 4)], SamplingParams(max_new_tokens=5, ignore_eos=True))
    m = engine.metrics()
    assert m["mean_tpot_s"] == pytest.approx(sum(o.tpot for o in outs) / len(outs))
    assert m["mean_ttft_s"] == pytest.approx(sum(o.ttft for o in outs) / len(outs))


@pytest.mark.parametrize("prompt", [torch.tensor(5), torch.zeros(1, 3, dtype=torch.long)])
def test_a_prompt_tensor_that_is_not_1d_raises_value_error(model, prompt):
    engine = _engine(model)
    with pytest.raises(ValueError, match="1-D"):
        engine.add_request(prompt, SamplingParams(max_new_tokens=2))
    assert _untouched(engine)


@pytest.mark.parametrize("block_size", [5, 7])
def test_contiguous_capacity_capped_at_max_position_embeddings(block_size):
    """Contiguous storage rounds a request's capacity up to whole blocks, but never past
    ``max_position_embeddings``: with a block size that does not divide it, a request whose
    prompt + max_new_tokens is exactly the limit runs to ``length`` and equals ``generate``."""
    model = wide_random_model(seed=0, max_position_embeddings=32)
    limit = model.config.max_position_embeddings
    assert limit % block_size != 0
    prompt = _ids(limit - 6, 179)
    engine = _engine(model, kv_storage="contiguous", block_size=block_size,
                     max_num_batched_tokens=64)
    engine.add_request(prompt, SamplingParams(6, ignore_eos=True), request_id="a")
    engine.step()
    assert engine.runner.strategy.caches["a"].k[0].shape[2] == limit
    _drain(engine)
    out = engine.outputs["a"]
    assert out.finish_reason == "length"
    assert out.output_token_ids == _greedy_ref(model, prompt, 6)


def test_mixed_workload_context_spans_zero_to_five_lines(monkeypatch):
    """Each prompt is 0-5 context lines plus one cut line, as the docstring promises: over
    many requests every count from 0 to 5 occurs and none outside it."""
    from tokenflow.serving import workload
    monkeypatch.setattr(workload, "corpus_lines", lambda: [f"L{i}x" for i in range(50)])

    class Chars:
        def encode(self, text):
            return [ord(c) for c in text]

    prompts, _, _ = workload.mixed_workload(Chars(), 300, seed=0, max_len=4096)
    counts = {"".join(map(chr, p)).count(" ") for p in prompts}
    assert counts == set(range(6))


@pytest.mark.parametrize("batch_size, S", [(1, 1), (3, 1), (2, 2)])
def test_paged_begin_step_rejects_another_shape_than_prepared(batch_size, S):
    """``PagedKVCache.begin_step`` raises the documented ValueError when the forward's
    ``[batch_size, S]`` is not the prepared batch's ``[2, 1]`` (a smaller batch must not run
    on the other rows' slots)."""
    from tokenflow.model.config import preset
    from tokenflow.serving.paged_kv_cache import PagedKVCache
    cache = PagedKVCache(preset("tiny"), num_blocks=8, block_size=4)
    cache.prepare([[0, 1], [2, 3]], [2, 3], [1, 1])
    with pytest.raises(ValueError, match=r"\[2, 1\]"):
        cache.begin_step(None, batch_size=batch_size, S=S)


def test_no_request_is_admitted_in_a_step_that_preempted():
    """The scheduler admits no waiting request in a step that preempted (its docstring): a
    preempted request goes back to the queue and is not prefilled again in the same step,
    even when its prefix blocks are still cached. Small random workloads with block_size 1
    and two token ids make such instant re-admissions possible (seed 112 is one)."""
    import random
    from helpers import random_model
    model = random_model(seed=0)
    preempting_steps = 0
    for seed in [112] + list(range(60)):
        rnd = random.Random(seed)
        eng = LLMEngine(model, num_blocks=rnd.randint(6, 12), block_size=1,
                        max_num_seqs=rnd.randint(2, 4), max_num_batched_tokens=rnd.randint(3, 8))
        n = rnd.randint(3, 6)
        prompts = [[rnd.choice([5, 6]) for _ in range(rnd.randint(1, 5))] for _ in range(n)]
        params = [SamplingParams(max_new_tokens=rnd.randint(1, 5), ignore_eos=True)
                  for _ in range(n)]
        run_with_arrivals(eng, prompts, params, sorted(rnd.randint(0, 6) for _ in range(n)))
        running = set()
        for s in eng.steps:
            ids = [r for r, _ in s.prefill] + list(s.decode)
            if s.preempted:
                preempting_steps += 1
                assert set(ids) <= running - set(s.preempted), (seed, s)
            running = (running | set(ids)) - set(s.preempted)
    assert preempting_steps >= 10


# =================================================================== metrics under abort and
# preemption, n > 1 under arrivals, future arrival times
class _Clock:
    """A ``time.perf_counter`` that only moves when a test sets ``now``."""

    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    import time
    c = _Clock()
    monkeypatch.setattr(time, "perf_counter", c)
    return c


def test_aborted_request_tpot_runs_from_first_to_last_token(model, clock):
    """Tokens at t = 101, 102, 103, abort at 103.4: TPOT (103 - 101) / 2 = 1.0 s (the idle
    0.4 s before ``abort()`` made it 1.2), the engine mean 1.0; TTFT 1.0, E2E 3.4."""
    engine = _engine(model)
    engine.add_request(_ids(5, 200), SamplingParams(10, ignore_eos=True))
    for t in (101.0, 102.0, 103.0):
        clock.now = t
        engine.step()
    clock.now = 103.4
    assert engine.abort(0)
    out = engine.outputs[0]
    assert len(out.output_token_ids) == 3 and out.finish_reason == "abort"
    assert (out.first_token_time, out.last_token_time, out.finish_time) == (101.0, 103.0, 103.4)
    assert out.tpot == pytest.approx(1.0) and out.ttft == pytest.approx(1.0)
    assert out.e2e_latency == pytest.approx(3.4)
    m = engine.metrics()
    assert m["mean_tpot_s"] == pytest.approx(1.0) and m["mean_ttft_s"] == pytest.approx(1.0)


def test_tpot_of_aborts_with_fewer_than_two_tokens_and_of_a_normal_finish(model, clock):
    """An abort before any token has no TTFT and no TPOT; after one token a TTFT and no
    TPOT; neither enters the mean TPOT. A request that finishes normally has its last token
    and its finish in the same step."""
    engine = _engine(model)
    for k in range(3):
        engine.add_request(_ids(5, 210 + k), SamplingParams(3, ignore_eos=True), request_id=k)
    assert engine.abort(0)                                   # still waiting: no token
    clock.now = 101.0
    engine.step()                                            # 1 and 2 get a first token
    clock.now = 101.5
    assert engine.abort(1)
    for t in (102.0, 104.0):
        clock.now = t
        engine.step()
    o0, o1, o2 = (engine.outputs[k] for k in range(3))
    assert (o0.ttft, o0.tpot, o0.last_token_time) == (None, None, None)
    assert o1.ttft == pytest.approx(1.0) and o1.tpot is None and o1.last_token_time == 101.0
    assert o2.finish_reason == "length" and o2.last_token_time == o2.finish_time == 104.0
    assert o2.tpot == pytest.approx(1.5)                     # (104 - 101) / 2
    assert engine.metrics()["mean_tpot_s"] == pytest.approx(1.5)


def _preempting_run(model, prompts, **kw):
    """Four 12-token prompts (or ``prompts``) with 12 new tokens each on 10 blocks of 4:
    the pool cannot hold them all, so requests are preempted and recomputed."""
    engine = _engine(model, num_blocks=10, max_num_batched_tokens=64, **kw)
    outs = engine.run(prompts, SamplingParams(12, ignore_eos=True), use_tqdm=False)
    return engine, outs


def test_recompute_after_preemption_is_no_prefix_cache_hit(model):
    """No two prompts share a block, so no request reuses another's: hit rate 0 of the
    4 x (12 - 1) // 4 = 8 blocks looked up at first admission (it was 0.4: the recomputes
    found their own freed blocks). The recompute's hits are reported apart."""
    engine, outs = _preempting_run(model, [_ids(12, 220 + k) for k in range(4)])
    m, bm = engine.metrics(), engine.block_manager
    assert m["num_preemptions"] >= 1
    assert (bm.num_hit_blocks, bm.num_queried_blocks) == (0, 8)
    assert m["prefix_cache_hit_rate"] == 0.0
    assert bm.num_preempted_queried_blocks > 0 and bm.num_preempted_hit_blocks > 0
    assert m["preempted_prefix_cache_hit_rate"] == \
        bm.num_preempted_hit_blocks / bm.num_preempted_queried_blocks
    assert [o.output_token_ids for o in outs] == \
        [_ref(model, p, max_new_tokens=12, ignore_eos=True) for p in [o.prompt_token_ids
                                                                      for o in outs]]


def test_shared_prefix_hits_still_count_with_preemption(model):
    """The four prompts share their first 8 tokens (2 blocks). Requests 0-2 are admitted
    together in step 0 (3 blocks each), before any block is registered: no hit. Request 3
    is admitted later and hits both shared blocks: 2 of the 4 x 2 looked up at first
    admission, whatever the recomputes of the preempted requests look up."""
    system = _ids(8, 230)
    engine, outs = _preempting_run(model, [system + _ids(4, 231 + k) for k in range(4)])
    bm = engine.block_manager
    assert engine.steps[0].prefill == [(0, 12), (1, 12), (2, 12)]
    assert engine.metrics()["num_preemptions"] >= 1
    assert (bm.num_hit_blocks, bm.num_queried_blocks) == (2, 8)
    assert engine.metrics()["prefix_cache_hit_rate"] == 0.25


@pytest.mark.parametrize("shared", [False, True])
def test_num_cached_tokens_is_the_first_admissions_prompt_hit(model, shared):
    """``num_cached_tokens`` counts prompt tokens the prefix cache supplied at the first
    admission: 0 without a shared prefix; with one, 8 (2 blocks) for request 3, the only one
    admitted after the shared blocks were registered (see the test above); never more than
    the prompt (a 12-token prompt reported 16 or 20 after a preemption)."""
    system = _ids(8, 240)
    prompts = [(system if shared else _ids(8, 241 + k)) + _ids(4, 245 + k) for k in range(4)]
    engine, outs = _preempting_run(model, prompts)
    assert any(o.num_preemptions for o in outs)
    assert [o.num_cached_tokens for o in outs] == ([0, 0, 0, 8] if shared else [0] * 4)


def test_num_cached_tokens_bounded_by_the_prompt_without_prefix_caching(model):
    engine, outs = _preempting_run(model, [_ids(12, 250 + k) for k in range(4)],
                                   enable_prefix_caching=False)
    assert any(o.num_preemptions for o in outs)
    assert all(o.num_cached_tokens == 0 for o in outs)
    assert engine.metrics()["preempted_prefix_cache_hit_rate"] == 0.0


def test_first_token_step_of_a_request_preempted_before_its_first_decode(model):
    """Blocks of 4, a pool of 4. Step 0 prefills A (7 tokens) and B (8 tokens), both sample
    their first token. In step 1 B's 9th token needs a third block: none is free, so B (the
    newest) is preempted before its first decode; A finishes (2 tokens) and B is recomputed
    in step 2. B's first token is still step 0's (it was reported as step 2)."""
    engine = _engine(model, num_blocks=4, enable_prefix_caching=False)
    outs, arrivals = run_with_arrivals(
        engine, [_ids(7, 260), _ids(8, 261)],
        [SamplingParams(2, ignore_eos=True), SamplingParams(3, ignore_eos=True)], [0, 0])
    assert [(s.prefill, s.decode, s.preempted) for s in engine.steps[:3]] == [
        ([(0, 7), (1, 8)], [], []), ([], [0], [1]), ([(1, 9)], [], [])]
    a, b = request_timeline(engine, arrivals, outs)
    assert (a.first_token_step, b.first_token_step) == (0, 0)
    assert b.ttft_steps == 1 and b.count("prefill") == 2
    assert outs[1].num_preemptions == 1
    assert outs[1].output_token_ids == _ref(model, _ids(8, 261), max_new_tokens=3,
                                            ignore_eos=True)


def test_step_record_lists_the_requests_that_sampled(model):
    engine = LLMEngine(model, num_blocks=32, block_size=BS, max_num_batched_tokens=8)
    run_with_arrivals(engine, [_ids(12, 270), _ids(3, 271)],
                      SamplingParams(2, ignore_eos=True), [0, 0])
    # step 0: the first 8 of request 0's 12 tokens (no sample); step 1: its last 4 and
    # request 1's 3 (both sample); step 2: both decode
    assert [s.sampled for s in engine.steps] == [[], [0, 1], [0, 1]]


def test_run_with_arrivals_and_timeline_with_n_samples(model):
    """A prompt with ``n = 2`` samples gives its two results in its place (it raised
    ``KeyError: 0`` after running everything); the timeline has a row per sample."""
    prompts = [_ids(6, 280), _ids(5, 281)]
    params = [SamplingParams(3, n=2, temperature=1.0, seed=7), SamplingParams(4)]
    engine = _engine(model)
    outs, arrivals = run_with_arrivals(engine, prompts, params, [0, 1])
    assert [o.request_id for o in outs] == [(0, 0), (0, 1), 1]
    assert arrivals == {(0, 0): 0, (0, 1): 0, 1: 1}
    ref = _engine(model).run(prompts, params, use_tqdm=False)
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in ref]
    rows = request_timeline(engine, arrivals, outs)
    assert [r.request_id for r in rows] == [(0, 0), (0, 1), 1]
    assert all(r.first_token_step is not None for r in rows)
    assert engine.sample_ids(0) == [(0, 0), (0, 1)] and engine.sample_ids(1) == [1]
    with pytest.raises(KeyError, match="never added"):
        engine.sample_ids(2)


def test_arrival_time_in_the_future_is_refused(model, clock):
    """A future ``arrival_time`` gave a negative TTFT; it raises naming the argument, and
    nothing is queued. Now itself and the past are accepted."""
    engine = _engine(model)
    with pytest.raises(ValueError, match="arrival_time.*future"):
        engine.add_request([5, 6], SamplingParams(2), arrival_time=100.5)
    with pytest.raises(ValueError, match="arrival_time"):
        engine.add_request([5, 6], SamplingParams(2, n=2), arrival_time=101.0)
    assert _untouched(engine)
    engine.add_request([5, 6], SamplingParams(2), arrival_time=100.0)
    engine.add_request([5, 6], SamplingParams(2), arrival_time=99.0)
    clock.now = 100.25
    _drain(engine)
    assert [engine.outputs[k].ttft for k in (0, 1)] == [0.25, 1.25]
