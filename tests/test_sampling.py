"""Sampling is exactly Hugging Face transformers' sampling.

``filter_logits`` is compared with transformers' own ``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper`` and ``MinPLogitsWarper``, in the order that
transformers' ``_get_logits_processor`` itself builds (asked from a tiny, randomly initialised
``LlamaForCausalLM``; nothing is downloaded), on random logits of several shapes, on ties and
on cases built to sit at the top-k / top-p / min-p boundaries. Kept sets must be identical and
probabilities equal within 1e-6. ``sample`` is then dropped into transformers' own
``generate(do_sample=True)`` loop and must reproduce its tokens draw for draw.
"""
from __future__ import annotations

import math

import pytest
import torch

from tokenflow import KVCache, decode_step, generate, prefill
from tokenflow.inference.sampling import (GREEDY_TEMPERATURE, apply_min_p, apply_temperature,
                                apply_top_k, apply_top_p, check_sampling_args, filter_logits,
                                filter_steps, sample)
# transformers is a pinned dependency: a missing install fails here instead of skipping.
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (
    MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

PROMPT = "北京是中国的首"
SHAPES = [(1, 2), (1, 7), (3, 17), (4, 64), (2, 512), (8, 1000), (1, 32000)]
SEEDS = {2: 500, 7: 500, 17: 500, 64: 500, 512: 300, 1000: 100, 32000: 20}   # per vocab size
ATOL = 1e-6


# --------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def hf_model():
    """A tiny random transformers model: only used to ask transformers which processors
    ``generate(do_sample=True)`` builds, and to run its real ``generate`` loop."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(100)        # spread the next-token distribution
    return model


def hf_processors(hf_model, temperature, top_k, top_p, min_p):
    """The processor list transformers builds for these settings (its own order)."""
    gc = GenerationConfig(do_sample=True, temperature=temperature,
                          top_k=0 if top_k is None else top_k,        # 0 = off in transformers
                          top_p=1.0 if top_p is None else top_p, min_p=min_p)
    return hf_model._get_logits_processor(gc, device="cpu")


def hf_filter(hf_model, logits, temperature, top_k, top_p, min_p):
    procs = hf_processors(hf_model, temperature, top_k, top_p, min_p)
    ids = torch.zeros(logits.shape[0], 1, dtype=torch.long)
    return procs(ids, logits.to(torch.float32).clone())


def assert_same_as_hf(hf_model, logits, temperature, top_k, top_p, min_p):
    ours = filter_logits(logits, temperature, top_k, top_p, min_p)
    ref = hf_filter(hf_model, logits, temperature, top_k, top_p, min_p)
    kept_ours, kept_ref = torch.isfinite(ours), torch.isfinite(ref)
    assert torch.equal(kept_ours, kept_ref), (
        f"kept sets differ (T={temperature}, k={top_k}, p={top_p}, min_p={min_p}): "
        f"ours {kept_ours.sum(-1).tolist()} tokens, HF {kept_ref.sum(-1).tolist()}")
    assert kept_ours.any(-1).all()
    torch.testing.assert_close(ours.softmax(-1), ref.softmax(-1), atol=ATOL, rtol=0)


def random_settings(g: torch.Generator, V: int):
    """Random (temperature, top_k, top_p, min_p); each filter off about a quarter of the time."""
    u = torch.rand(5, generator=g).tolist()
    temperature = [1.0, 0.05 + 3 * u[0]][u[0] > 0.2]
    top_k = None if u[1] < 0.25 else int(torch.randint(1, V + 3, (1,), generator=g))
    top_p = None if u[2] < 0.25 else [1.0, max(u[2], 1e-3)][u[2] < 0.95]
    min_p = None if u[3] < 0.25 else [0.0, u[3] * 0.5, 1.0][int(u[4] * 3)]
    return temperature, top_k, top_p, min_p


# --------------------------------------------------------------------------- equal to HF

def test_each_step_equals_the_transformers_warper_at_the_same_place(hf_model):
    """Our pipeline, stage by stage, equals transformers' processor list applied one warper
    at a time, in the order transformers itself builds (so a swapped order fails)."""
    procs = list(hf_processors(hf_model, 0.7, 5, 0.9, 0.05))
    assert [type(p) for p in procs] == [TemperatureLogitsWarper, TopKLogitsWarper,
                                        TopPLogitsWarper, MinPLogitsWarper]
    g = torch.Generator().manual_seed(3)
    ids = torch.zeros(4, 1, dtype=torch.long)
    for _ in range(20):
        logits = torch.randn(4, 40, generator=g) * 3
        ours = filter_steps(logits, 0.7, 5, 0.9, 0.05)
        ref = logits.clone()
        for name, proc in zip(("temperature", "top_k", "top_p", "min_p"), procs):
            ref = proc(ids, ref)
            assert torch.equal(torch.isfinite(ours[name]), torch.isfinite(ref)), name
            torch.testing.assert_close(ours[name].softmax(-1), ref.softmax(-1),
                                       atol=ATOL, rtol=0)


@pytest.mark.parametrize("B,V", SHAPES)
def test_random_logits_match_hf(hf_model, B, V):
    for seed in range(SEEDS[V]):
        g = torch.Generator().manual_seed(1000 * V + seed)
        logits = torch.randn(B, V, generator=g) * float(0.5 + 4 * torch.rand(1, generator=g))
        assert_same_as_hf(hf_model, logits, *random_settings(g, V))


@pytest.mark.parametrize("B,V", SHAPES[:-1])
def test_tied_logits_match_hf(hf_model, B, V):
    """Many exact ties (integer logits, few distinct values): top-k keeps every token tied
    with the k-th; at the top-p boundary the same tied tokens survive as in HF."""
    for seed in range(SEEDS[V]):
        g = torch.Generator().manual_seed(7 + 1000 * V + seed)
        levels = int(torch.randint(1, 6, (1,), generator=g))
        logits = torch.randint(0, levels, (B, V), generator=g).float()
        assert_same_as_hf(hf_model, logits, *random_settings(g, V))


@pytest.mark.parametrize("V", [2, 7, 17, 64, 512])
def test_top_p_at_the_boundary_matches_hf(hf_model, V):
    """top_p set to the exact cumulative mass of the j best tokens, and one float32 step
    either side: the crossing token is decided identically."""
    for seed in range(40):
        g = torch.Generator().manual_seed(31 + 100 * V + seed)
        logits = torch.randn(1, V, generator=g) * 2
        probs = logits.double().softmax(-1).sort(descending=True).values[0]
        j = int(torch.randint(1, V, (1,), generator=g))
        p = float(probs[:j].sum())
        for top_p in (p, math.nextafter(p, 0), math.nextafter(p, 2), p - 1e-7, p + 1e-7):
            if 0 < top_p <= 1:
                assert_same_as_hf(hf_model, logits, 1.0, None, top_p, None)


@pytest.mark.parametrize("V", [7, 64, 512])
def test_min_p_and_top_k_at_the_boundary_match_hf(hf_model, V):
    for seed in range(40):
        g = torch.Generator().manual_seed(77 + V + seed)
        logits = torch.randn(2, V, generator=g) * 2
        probs = logits.softmax(-1)
        i = int(torch.randint(0, V, (1,), generator=g))
        ratio = float(probs[0, i] / probs[0].max())            # min_p exactly at token i
        for min_p in (ratio, math.nextafter(ratio, 0), math.nextafter(ratio, 2)):
            if 0 <= min_p <= 1:
                assert_same_as_hf(hf_model, logits, 1.0, None, None, min_p)
        logits[:, :3] = logits[:, 3:4]                         # 4 tokens tied
        k = int((logits[0] > logits[0, 3]).sum()) + 1          # the k-th value is the tie
        assert_same_as_hf(hf_model, logits, 1.0, k, None, None)
        assert int(torch.isfinite(filter_logits(logits[:1], top_k=k)).sum()) == k + 3


def test_special_inputs_match_hf(hf_model):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 50, generator=g)
    x[:, ::3] = float("-inf")                                  # already banned tokens
    for s in range(50):
        assert_same_as_hf(hf_model, x, *random_settings(torch.Generator().manual_seed(s), 50))
    bf16 = torch.randn(3, 40, generator=g).to(torch.bfloat16)   # many ties after rounding
    for s in range(50):
        assert_same_as_hf(hf_model, bf16, *random_settings(torch.Generator().manual_seed(s), 40))
    one = torch.randn(2, 1, generator=g)                       # V = 1
    assert_same_as_hf(hf_model, one, 0.5, 3, 0.1, 1.0)


def test_sample_reproduces_hf_generate(hf_model):
    """Our ``sample`` inside the same loop gives the tokens of transformers' own
    ``generate(do_sample=True)``, draw for draw (same filters, softmax, torch.multinomial)."""
    settings = [dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
                dict(temperature=1.3, top_k=None, top_p=0.7, min_p=None),
                dict(temperature=1.0, top_k=5, top_p=None, min_p=0.2)]
    for s in range(12):
        kw = settings[s % 3]
        ids = torch.randint(0, 97, (3, 4), generator=torch.Generator().manual_seed(s))
        gc = GenerationConfig(do_sample=True, max_new_tokens=6, use_cache=False,
                              temperature=kw["temperature"], top_k=kw["top_k"] or 0,
                              top_p=kw["top_p"] or 1.0, min_p=kw["min_p"])
        torch.manual_seed(s)
        with torch.no_grad():
            ref = hf_model.generate(ids, generation_config=gc,
                                    attention_mask=torch.ones_like(ids))
        torch.manual_seed(s)
        seq = ids
        with torch.no_grad():
            for _ in range(6):
                logits = hf_model(seq).logits[:, -1].float()         # [B, V]
                seq = torch.cat([seq, sample(logits, **kw)[:, None]], dim=1)
        assert torch.equal(seq, ref)


# --------------------------------------------------------------------------- the rules

def _kept(x):
    return torch.isfinite(x).nonzero().flatten().tolist()


def test_boundary_rules_on_a_small_example():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert _kept(filter_logits(logits, top_p=0.6)) == [0, 1]      # 0.3 crosses 0.6: kept
    assert _kept(filter_logits(logits, top_p=0.4)) == [0]
    assert _kept(filter_logits(logits, top_p=0.85)) == [0, 1, 2]
    assert _kept(filter_logits(logits, top_p=1e-9)) == [0]        # at least one token
    assert _kept(filter_logits(logits, min_p=0.3)) == [0, 1, 2]   # 0.15 >= 0.3 * 0.5
    assert _kept(filter_logits(logits, min_p=0.31)) == [0, 1]
    ties = torch.tensor([2.0, 1.0, 1.0, 0.0])
    assert _kept(filter_logits(ties, top_k=2)) == [0, 1, 2]       # tie at the k-th kept
    assert _kept(filter_logits(ties, top_k=1)) == [0]
    assert _kept(filter_logits(ties, min_p=1.0)) == [0]
    assert _kept(filter_logits(torch.tensor([1.0, 3.0, 3.0]), temperature=0)) == [1]
    assert sample(torch.tensor([1.0, 3.0, 3.0]), temperature=0).item() == 1


def test_order_matters():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    # temperature before top-p: a hotter distribution needs more tokens to reach p
    assert len(_kept(filter_logits(logits, 0.5, top_p=0.8))) < \
        len(_kept(filter_logits(logits, 2.0, top_p=0.8)))
    # ...but top-k is blind to temperature (ranking unchanged)
    assert _kept(filter_logits(logits, 0.3, top_k=2)) == _kept(filter_logits(logits, 3.0, top_k=2))
    # top-k then top-p (renormalised over the k) keeps fewer than top-p alone
    assert _kept(filter_logits(logits, top_k=3, top_p=0.75)) == [0, 1]
    assert _kept(filter_logits(logits, top_p=0.75)) == [0, 1, 2]
    # min-p last (transformers) vs first (vLLM's order)
    hf = filter_logits(logits, top_p=0.75, min_p=0.3)
    vllm_order = apply_top_p(apply_min_p(logits[None], 0.3), 0.75)[0]
    assert _kept(hf) == [0, 1, 2] and _kept(vllm_order) == [0, 1]


def test_filter_steps_are_the_pipeline():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 40, generator=g)
    steps = filter_steps(x, 1.7, 12, 0.8, 0.1)
    assert list(steps) == ["input", "temperature", "top_k", "top_p", "min_p"]
    assert torch.equal(steps["min_p"], filter_logits(x, 1.7, 12, 0.8, 0.1))
    manual = apply_min_p(apply_top_p(apply_top_k(apply_temperature(x, 1.7), 12), 0.8), 0.1)
    assert torch.equal(steps["min_p"], manual)
    counts = [int(torch.isfinite(v).sum()) for v in steps.values()]
    assert counts == sorted(counts, reverse=True)             # each step only removes


def test_inputs_are_not_modified_and_shapes_kept():
    x = torch.randn(2, 30)
    before = x.clone()
    out = filter_logits(x, 0.7, 5, 0.5, 0.1)
    assert torch.equal(x, before) and out.shape == x.shape and out.dtype == torch.float32
    assert filter_logits(x, top_k=None) is not x
    assert filter_logits(x[0], top_k=3).shape == (30,)
    assert sample(x[0], generator=torch.Generator().manual_seed(0)).shape == ()
    assert sample(x, generator=torch.Generator().manual_seed(0)).shape == (2,)


# --------------------------------------------------------------------------- sampling

def test_empirical_frequencies_match_filtered_probabilities():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, generator=g) * 2
    kw = dict(temperature=1.5, top_k=20, top_p=0.9, min_p=0.02)
    probs = filter_logits(logits, **kw).softmax(-1)
    N = 20000
    draws = sample(logits.expand(N, -1), generator=torch.Generator().manual_seed(1), **kw)
    freq = torch.bincount(draws, minlength=64).float() / N
    assert set(draws.unique().tolist()) <= set(_kept(filter_logits(logits, **kw)))
    bound = 5 * (probs * (1 - probs) / N).sqrt() + 1e-9            # 5 standard errors
    assert ((freq - probs).abs() <= bound).all()


def test_seeded_sampling_is_reproducible_and_stays_in_the_kept_set():
    x = torch.randn(4, 100, generator=torch.Generator().manual_seed(0)) * 2
    a = [sample(x, 1.2, 50, 0.95, generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert torch.equal(a[0], a[1])
    many = [sample(x[0].expand(256, -1), 2.0, generator=torch.Generator().manual_seed(s))
            for s in (1, 2)]
    assert not torch.equal(many[0], many[1])
    # every draw comes from the filtered set: top-k's k best, top-p's nucleus
    rows = x[0].expand(2000, -1)
    top3 = set(x[0].topk(3).indices.tolist())
    drawn = sample(rows, 5.0, top_k=3, generator=torch.Generator().manual_seed(4))
    assert set(drawn.tolist()) == top3            # all 3 appear at T=5, nothing else
    flat = x[0] * 0.3                                         # a wide distribution
    probs = flat.softmax(-1)
    order = probs.argsort(descending=True)
    cum = probs[order].cumsum(0)
    nucleus = set(order[:int((cum < 0.5).sum()) + 1].tolist())  # smallest set reaching 0.5
    assert 3 < len(nucleus) < 50
    drawn = sample(flat.expand(2000, -1), 1.0, top_p=0.5,
                   generator=torch.Generator().manual_seed(5))
    assert set(drawn.tolist()) <= nucleus and len(set(drawn.tolist())) > 1


@pytest.mark.parametrize("temperature", [0, 1e-38, 1e-30, 1e-12, 9.99e-6])
def test_tiny_temperature_is_greedy(temperature):
    """Below GREEDY_TEMPERATURE (1e-5, vLLM's threshold) sampling is the argmax: no inf/NaN."""
    x = torch.tensor([[10.0, 9.0, 1.0], [-3.0, 4.0, 4.5]])
    assert torch.equal(sample(x, temperature=temperature), torch.tensor([0, 2]))
    kept = filter_logits(x, temperature=temperature, top_k=2, top_p=0.5)
    assert not torch.isposinf(kept).any() and not torch.isnan(kept).any()
    assert torch.isfinite(kept).sum(-1).tolist() == [1, 1]


def test_temperature_at_the_greedy_threshold_still_samples():
    x = torch.tensor([[0.0, 0.0, 0.0]])                    # all tied: argmax would be 0
    draws = sample(x.expand(300, -1), temperature=GREEDY_TEMPERATURE,
                   generator=torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1, 2}
    assert torch.isfinite(filter_logits(x, GREEDY_TEMPERATURE)).all()


def test_overflowing_temperature_division_is_a_clear_error():
    x = torch.tensor([[3e38, 0.0, 1.0]])
    with pytest.raises(ValueError, match="temperature"):
        filter_logits(x, temperature=0.5)
    with pytest.raises(ValueError, match="temperature"):
        sample(x, temperature=0.5)
    assert int(sample(x, temperature=0)) == 0             # greedy needs no division


def test_filter_logits_never_returns_plus_inf():
    g = torch.Generator().manual_seed(1)
    for T in (1e-5, 1e-4, 0.01, 0.5, 1.0, 3.0):
        x = torch.randn(3, 50, generator=g) * 50
        out = filter_logits(x, T, top_k=10, top_p=0.9, min_p=0.01)
        assert not torch.isposinf(out).any() and not torch.isnan(out).any()


def test_greedy_generation_is_argmax_at_every_step(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)])
    n = 6
    out = generate(model, ids, n, temperature=0.0, stop_at_eos=False)
    cache = KVCache(model.config, 1, ids.shape[1] + n)
    logits = prefill(model, ids, cache)                         # [1, V]
    for step in range(n):
        nxt = out[:, ids.shape[1] + step]
        assert torch.equal(nxt, logits.argmax(-1))
        assert torch.equal(sample(logits, temperature=0), nxt)
        logits = decode_step(model, nxt, cache)
    assert tok.id_to_token(int(out[0, ids.shape[1]])) == "都"


def test_seeded_generate_is_reproducible(pretrained):
    model, tok = pretrained
    ids = torch.tensor([tok.encode(PROMPT)] * 4)
    runs = [generate(model, ids, 6, temperature=3.0, top_p=0.95,
                     generator=torch.Generator().manual_seed(s)) for s in (11, 11, 12)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(temperature=-0.1), ValueError, "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(temperature="1"), TypeError, "temperature must be a number"),
    (dict(top_k=0), ValueError, "top_k must be >= 1"),
    (dict(top_k=-3), ValueError, "top_k must be >= 1"),
    (dict(top_k=2.5), TypeError, "top_k"),
    (dict(top_k=True), TypeError, "top_k"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.01), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=float("nan")), ValueError, "top_p"),
    (dict(min_p=-0.01), ValueError, r"min_p must be in \[0, 1\]"),
    (dict(min_p=1.5), ValueError, r"min_p must be in \[0, 1\]"),
])
def test_bad_arguments(kwargs, exc, match):
    x = torch.randn(2, 10)
    for fn in (filter_logits, sample, filter_steps):
        with pytest.raises(exc, match=match):
            fn(x, **kwargs)
    with pytest.raises(exc, match=match):
        check_sampling_args(**kwargs)


@pytest.mark.parametrize("logits,exc,match", [
    (torch.tensor([[0.0, float("nan")]]), ValueError, "NaN"),
    (torch.tensor([[0.0, float("inf")]]), ValueError, r"\+inf"),
    (torch.tensor([[0.0, 1.0], [float("-inf")] * 2]), ValueError, "all -inf"),
    (torch.tensor([[1, 2]]), TypeError, "floating-point"),
    (torch.zeros(2, 3, 4), ValueError, r"shape \[B, V\]"),
    (torch.zeros(2, 0), ValueError, "shape"),
    ([[0.0, 1.0]], TypeError, "torch.Tensor"),
])
def test_bad_logits(logits, exc, match):
    for temperature in (0, 1.0):
        with pytest.raises(exc, match=match):
            sample(logits, temperature=temperature)
        with pytest.raises(exc, match=match):
            filter_logits(logits, temperature=temperature)


def test_apply_temperature_rejects_greedy_temperatures():
    for t in (0, 1e-9, 9.99e-6):
        with pytest.raises(ValueError, match="GREEDY_TEMPERATURE"):
            apply_temperature(torch.zeros(1, 3), t)
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature(torch.zeros(1, 3), -1.0)


def test_public_filter_steps_validate_their_argument():
    from tokenflow.inference.sampling import apply_min_p, apply_top_k, apply_top_p
    x = torch.randn(2, 10)
    with pytest.raises(ValueError, match="top_k"):
        apply_top_k(x, 0)
    with pytest.raises(ValueError, match="top_p"):
        apply_top_p(x, 0.0)
    with pytest.raises(ValueError, match="min_p"):
        apply_min_p(x, 1.5)


# --------------------------------------------------------------------------- the chapter's figure

def test_sampling_panel_always_draws_the_sampled_token_in_green():
    """A flat tail: the seeded draw lands outside the 12 best tokens, yet gets a green bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex
    from tokenflow.viz import sampling_panel
    from tokenflow.analysis.trace import COLORS

    class Names:
        def id_to_token(self, i):
            return f"t{i}"
    logits = torch.zeros(200)
    logits[:12] = 0.5                                   # 12 slightly better tokens, 188 others
    chosen = int(sample(logits, 1.0, generator=torch.Generator().manual_seed(0)))
    assert chosen >= 12, "pick a seed whose draw falls in the tail"
    fig = sampling_panel(logits, Names(), temperature=1.0, n=12, seed=0)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(labels) == 12 and labels[-1] == f"t{chosen}"
    filled = [p for p in ax.patches if p.get_fill()][:12]
    greens = [
        i for i, p in enumerate(filled) if to_hex(p.get_facecolor()) == to_hex(COLORS["token"])
    ]
    assert greens == [11]
    plt.close(fig)
