"""The model: embedding -> decoder blocks -> final norm -> LM head, in chapter 0's actions::

    input_ids [B,S] --lookup--> hidden [B,S,H]
      for each block:  hidden += Attention(RMSNorm(hidden))    (write KV, read KV)
                       hidden += FFN or MoE(RMSNorm(hidden))   (route top-k, dispatch/combine)
    RMSNorm(hidden) --project vocab--> logits [B,S,V]

Llama's math (HF ``LlamaForCausalLM``) with a Mixtral / DeepSeek-style MoE; HF module names.
"""
from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from tokenflow.config import ModelConfig
from .ffn import FFN
from .kv_cache import CacheStep, CacheStorage, KVCache, uncached_step
from .mla import MLAttention
from .moe import MoE, _check_token_mask
from .norm import RMSNorm
from .rope import RotaryEmbedding
from tokenflow.validate import reads_free, token_id_tensor

__all__ = ["RMSNorm", "DecoderBlock", "TokenFlowModel"]


class DecoderBlock(nn.Module):
    """Pre-norm block ``h += attn(norm(h)); h += mlp(norm(h))``: GQA or MLA (``is_mla``),
    FFN or MoE (``config.layer_is_moe``)."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLAttention(config, layer_idx) if config.is_mla else \
            Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.is_moe = config.layer_is_moe(layer_idx)
        self.mlp = MoE(config, layer_idx) if self.is_moe else FFN(
            config.hidden_size, config.intermediate_size, config.hidden_act)

    def forward(self, h, cos, sin, step, kv_cache=None, token_mask=None):
        """``h [B,S,H] -> [B,S,H]``; ``token_mask [B,S]`` goes to the MoE's aux loss."""
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, step, kv_cache)
        x = self.post_attention_layernorm(h)
        if self.is_moe:
            return h + self.mlp(x, token_mask)
        return h + self.mlp(x)


class TokenFlowModel(nn.Module):
    """The decoder-only LLM every chapter runs: ``embed_tokens [V,H]``, ``layers``, ``norm``,
    ``lm_head [V,H]`` (tied to ``embed_tokens`` if ``tie_word_embeddings``).

    Raises ``ValueError`` naming the ``config.fields_not_built()`` (cost-model-only fields).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.fields_not_built():
            raise ValueError(f"TokenFlowModel does not build {config.fields_not_built()} "
                             "(cost-model fields); leave them at their defaults")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderBlock(config, i)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(config)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    # ----------------------------------------------------------------- checks
    def _check_inputs(self, input_ids, kv_cache, attention_mask, token_mask=None):
        c = self.config
        token_id_tensor("input_ids", input_ids, c.vocab_size)
        if kv_cache is not None:
            if not isinstance(kv_cache, CacheStorage):
                raise TypeError(f"kv_cache must be a KVCache (a CacheStorage) or None, "
                                f"got {type(kv_cache).__name__}")
            p = self.embed_tokens.weight
            kv_cache.check_model(c, p.dtype, p.device)
        past = kv_cache.length if kv_cache is not None else 0
        S = input_ids.shape[1]
        if past + S > c.max_position_embeddings:
            raise ValueError(f"sequence length {past + S} ({past} cached + {S} new) exceeds "
                             f"max_position_embeddings={c.max_position_embeddings}")
        if attention_mask is not None:
            self._check_mask(attention_mask, input_ids, kv_cache)
        if token_mask is not None and self.training:        # only the MoE aux loss reads it
            _check_token_mask(token_mask, tuple(input_ids.shape), "B, S")

    @staticmethod
    def _check_mask(mask, input_ids, kv_cache):
        """Only left padding is supported: per row zeros, then ones; no padding after a row's
        real tokens have started (also across calls with a cache)."""
        if not isinstance(mask, torch.Tensor) or mask.shape != input_ids.shape:
            shape = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"attention_mask must be a tensor with the shape of input_ids "
                             f"{list(input_ids.shape)}, got {shape}")
        if mask.is_floating_point() or mask.is_complex():
            raise TypeError(f"attention_mask must be an integer or bool tensor of 0/1, "
                            f"got {mask.dtype}")
        if not reads_free(mask):      # the value checks below would wait for the device
            return
        m = mask.long()
        if ((m != 0) & (m != 1)).any():
            raise ValueError("attention_mask values must be 0 (left padding) or 1 (real token)")
        if (m[:, 1:] < m[:, :-1]).any():
            raise ValueError("attention_mask must be left padding only: in each row all 0s "
                             "come before all 1s (right padding or holes are not supported)")
        if kv_cache is not None:
            started = kv_cache.num_real > 0                                  # [B]
            if (started & (m == 0).any(dim=1)).any():
                raise ValueError("attention_mask has padding (0) in a row that already has "
                                 "real tokens in the KV cache; padding must come first")
        elif (m.sum(dim=1) == 0).any():
            raise ValueError("attention_mask has a row with no real token (all 0)")

    # ----------------------------------------------------------------- forward
    def forward(self, input_ids: torch.Tensor, kv_cache: KVCache | None = None, trace=None,
                attention_mask: torch.Tensor | None = None,
                logits_to_keep: int = 0, token_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """``input_ids [B,S]`` (ids in ``[0, vocab_size)``) -> logits ``[B,S,V]`` (the last
        ``logits_to_keep`` positions if > 0). The model's entry point: it checks, the layers trust.

        ``kv_cache``: a :class:`KVCache` of the model's dtype and device; the new tokens' entries
        go after the cached ones (prefill, decode ``S == 1``, chunked prefill); ``None``: attend
        within ``input_ids``. ``trace``: a :class:`~tokenflow.explain.trace.Trace` hooked in for
        this call. ``attention_mask [B,S]``: 1 real, 0 left padding (RoPE positions count from a
        row's first real token). ``token_mask [B,S]``: 1 real, 0 padding anywhere (training's
        right padding), read only by the MoE aux loss; default ``attention_mask``.

        Raises ``TypeError`` (ids not integer, kv_cache not a cache) or ``ValueError``: ids out of
        range; cached + new tokens past ``max_position_embeddings`` or the cache; a mask of
        another shape or not left padding; a cache of another dtype, device or model; in
        training, ``token_mask`` not ``[B,S]`` of 0/1 with a 1.
        """
        if trace is not None:                    # records through hooks, for this call only
            with trace.attach(self):
                return self.forward(input_ids, kv_cache, None, attention_mask, logits_to_keep,
                                    token_mask)
        self._check_inputs(input_ids, kv_cache, attention_mask, token_mask)
        if token_mask is None:
            token_mask = attention_mask
        B, S = input_ids.shape
        if kv_cache is not None:       # claim slots: positions, slots, mask (one descriptor)
            step = kv_cache.begin_step(attention_mask, B, S)
        else:
            step = uncached_step(attention_mask, input_ids)
        cos, sin = self.rotary(step.positions)                              # [B, 1, S, D]

        h = self.embed_tokens(input_ids)                                    # [B, S, H]
        for layer in self.layers:
            h = layer(h, cos, sin, step, kv_cache, token_mask)              # [B, S, H]
        if logits_to_keep > 0:
            h = h[:, -logits_to_keep:]
        h = self.norm(h)                                                    # [B, S, H]
        return self.lm_head(h)                                              # [B, S, V]

    def forward_packed(self, input_ids: torch.Tensor, step: CacheStep,
                       kv_cache: CacheStorage, logits_indices: torch.Tensor) -> torch.Tensor:
        """One serving step: ``input_ids [T]``, the new tokens of ``n`` sequences end to end,
        through the blocks as one row ``[1, T, H]`` (no padding); each sequence attends to its
        own context (:meth:`CacheStep.attend_each`). ``step``: the packed step that
        ``kv_cache`` (e.g. :class:`~tokenflow.serving.paged_kv_cache.PagedKVCache`) made;
        ``logits_indices [N]``: the positions that sample. Returns logits ``[N, V]``.

        Raises ``TypeError`` (not a packed step or a cache storage, ids not integer) or
        ``ValueError`` (ids not ``[T]`` or out of range, a position past
        ``max_position_embeddings``, a cache of another model, dtype or device).
        """
        if not getattr(step, "packed", False) or not isinstance(kv_cache, CacheStorage):
            raise TypeError("forward_packed needs a packed CacheStep (PackedCacheStep) and the "
                            "cache storage that made it (e.g. PagedKVCache.packed_step(...))")
        token_id_tensor("input_ids", input_ids, self.config.vocab_size, dims=1)
        if input_ids.shape[0] != step.num_tokens:
            raise ValueError(f"input_ids must have shape [T={step.num_tokens}], got "
                             f"{list(input_ids.shape)}")
        last = max(step.seqlens_k) - 1           # the largest position (from ints: no .item())
        if last >= self.config.max_position_embeddings:
            raise ValueError(f"a sequence reaches position {last} >= "
                             f"max_position_embeddings={self.config.max_position_embeddings}")
        p = self.embed_tokens.weight
        kv_cache.check_model(self.config, p.dtype, p.device)
        cos, sin = self.rotary(step.positions)                              # [1, 1, T, D]
        h = self.embed_tokens(input_ids)[None]                              # [1, T, H]
        for layer in self.layers:
            h = layer(h, cos, sin, step, kv_cache)                          # [1, T, H]
        h = h[0, logits_indices]                                            # [N, H]
        return self.lm_head(self.norm(h))                                   # [N, V]

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied LM head is counted once)."""
        return sum(p.numel() for p in self.parameters())
