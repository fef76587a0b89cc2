"""Logit lens: read the residual stream with the model's own output head, layer by layer.

The hidden state after the embedding and after every block is put through the final
RMSNorm and the LM head, as if the model stopped there (nostalgebraist, "interpreting GPT:
the logit lens", LessWrong 2020; the "logit lens" of Belrose et al. 2023, arXiv:2303.08112,
section 2). The last entry is, by construction, the model's own logits.

Shape letters: L layers (``num_hidden_layers``), B batch, S sequence, V vocabulary.
"""
from __future__ import annotations

import torch

from tokenflow.validate import index

__all__ = ["logit_lens", "token_rank", "answer_depth"]


@torch.inference_mode()
def logit_lens(model, input_ids: torch.Tensor,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits read from every depth of the residual stream.

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel`.
        input_ids: ``[B, S]`` int64 token ids (one uncached forward pass).
        attention_mask: optional ``[B, S]`` left-padding mask, as the model's forward.

    Returns:
        ``[L+1, B, S, V]`` float: index 0 reads the embedding output, index ``l`` the hidden
        state after block ``l-1``; each is ``lm_head(norm(h))``. Index ``L`` equals the
        model's own logits ``model(input_ids)`` (tested to 1e-6).

    Raises:
        TypeError / ValueError: as the model's forward (ids, shapes, mask).
    """
    hidden: list[torch.Tensor] = []                                      # L+1 x [B, S, H]
    modules = [model.embed_tokens, *model.layers]
    # forward hooks on the embedding and every block: their outputs are the residual stream
    hooks = [m.register_forward_hook(lambda _m, _in, out: hidden.append(out)) for m in modules]
    try:
        model(input_ids, attention_mask=attention_mask)
    finally:
        for h in hooks:
            h.remove()
    # the same norm + head calls as the model's forward, at every depth
    return torch.stack([model.lm_head(model.norm(h)) for h in hidden])  # [L+1, B, S, V]


def token_rank(logits: torch.Tensor, token_id: int) -> torch.Tensor:
    """Rank of ``token_id`` in ``logits [..., V]``: 1 + the number of entries with a
    strictly larger logit (1 = top; ties share the better rank). Returns ``[...]`` int64.

    Raises:
        ValueError: if ``token_id`` is not in ``[0, V)``.
    """
    V = logits.shape[-1]
    index("token_id", token_id, V, "V")
    return 1 + (logits > logits[..., token_id:token_id + 1]).sum(-1)


def answer_depth(lens: torch.Tensor, token_id: int, batch: int = 0,
                 position: int = -1) -> int | None:
    """The first depth (0 = embedding, ``l`` = after block ``l-1``) from which ``token_id``
    ranks first at ``(batch, position)`` at every deeper layer too; ``None`` if the final
    layer does not rank it first.

    Args:
        lens: ``[L+1, B, S, V]`` from :func:`logit_lens`.

    Raises:
        ValueError: if ``lens`` is not 4-D; as :func:`token_rank`.
    """
    if lens.dim() != 4:
        raise ValueError(f"lens must be [L+1, B, S, V], got shape {list(lens.shape)}")
    top = (token_rank(lens[:, batch, position], token_id) == 1).tolist()   # [L+1]
    if not top[-1]:
        return None
    depth = len(top) - 1
    while depth > 0 and top[depth - 1]:
        depth -= 1
    return depth
