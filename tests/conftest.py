"""Shared fixtures: the trained tiny model (loaded once) and small random models."""
import pytest
import torch

from tokenflow import ModelConfig, TokenFlowModel, load_pretrained, preset

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def pretrained():
    """(model, tokenizer) of the shipped tiny model, eval mode."""
    return load_pretrained()


def random_model(seed: int = 0, **overrides) -> TokenFlowModel:
    """An untrained model of the tiny preset with some fields changed, eval mode."""
    torch.manual_seed(seed)
    cfg = preset("tiny", **overrides)
    return TokenFlowModel(cfg).eval()


def wide_random_model(seed: int = 0) -> TokenFlowModel:
    """:func:`random_model` with matrices drawn wider (std 0.08) than the default init, so
    greedy decoding makes clear choices (no near-ties that batching could flip)."""
    m = random_model(seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    return m


@pytest.fixture
def make_model():
    return random_model


@pytest.fixture(scope="session")
def traced_prompt(pretrained):
    """The running example traced with tensors kept: (model, tokenizer, tokens, trace)."""
    from tokenflow import Trace
    model, tok = pretrained
    prompt = "北京是中国的首"
    trace = Trace(keep_tensors=True)
    with torch.no_grad():
        model(torch.tensor([tok.encode(prompt)]), trace=trace)
    return model, tok, tok.tokens(prompt), trace
