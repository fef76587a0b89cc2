"""What one sequence keeps per layer, for every attention kind: K/V that grows with the context,
or a state that does not.

The K/V bytes of MHA / GQA / MQA, MLA and sliding windows are :mod:`tokenflow.analysis.costmodel`'s
(``kv_cache_bytes``; this module never repeats that formula). Added here:

* the constant state of a **linear-attention layer**, Gated DeltaNet as in Qwen3-Next (Yang,
  Kautz and Hatamizadeh 2024, "Gated Delta Networks", arXiv:2412.06464; HF
  ``Qwen3NextGatedDeltaNet``): a matrix ``[n_v, d_k, d_v]`` per sequence plus the last
  ``k - 1`` inputs of a short causal convolution of width ``k``, the same size at 10 tokens
  or 1M;
* :class:`CacheLayout`, a model's layers grouped by what they keep, so a hybrid model (3
  Gated DeltaNet layers per full-attention layer) is one object;
* :func:`gated_delta_rule`, the recurrence itself, token by token, so a chunked prefill can be
  shown to carry the state across chunk boundaries exactly;
* :func:`sparse_decode_reads`, what a decode step reads with DeepSeek Sparse Attention
  (DeepSeek-V3.2-Exp: a lightning indexer scores every cached token, attention then reads only
  the top ``index_topk``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tokenflow.config import ModelConfig
from tokenflow.model.kv_cache import KVCache

from . import costmodel
from tokenflow.validate import integer
from .costmodel import kv_cache_bytes_per_token

__all__ = ["with_kv_heads", "gated_deltanet_state_elements", "CacheLayout", "hybrid_layout",
           "example_layouts", "kv_per_token_rows", "kv_per_token_table", "gated_delta_rule",
           "sparse_decode_reads", "kv_cache_size",
           "FLASHMLA_SPARSE_FP8_ENTRY_BYTES"]




def with_kv_heads(config: ModelConfig, num_key_value_heads: int) -> ModelConfig:
    """``config`` with another number of K/V heads: ``num_attention_heads`` gives the MHA
    variant, 1 the MQA variant (Shazeer 2019), anything that divides the query heads a GQA
    variant (Ainslie et al. 2023). Not a published model: a what-if on a real config.

    Raises:
        ValueError: ``num_key_value_heads`` not an int in ``[1, num_attention_heads]``
            dividing ``num_attention_heads``, or an MLA config (it has no K/V heads to change).
    """
    if config.is_mla:
        raise ValueError("config is MLA: it caches a latent, not K/V heads")
    n = config.num_attention_heads
    integer("num_key_value_heads", num_key_value_heads, 1)
    if num_key_value_heads > n or n % num_key_value_heads:
        raise ValueError(f"num_key_value_heads must divide num_attention_heads={n}, "
                         f"got {num_key_value_heads}")
    heads = f"{num_key_value_heads} KV head{'s' * (num_key_value_heads != 1)}"
    return config.replace(num_key_value_heads=num_key_value_heads,
                          name=f"{config.name} ({heads})")


def gated_deltanet_state_elements(num_key_heads: int, num_value_heads: int, key_head_dim: int,
                                  value_head_dim: int, conv_kernel_dim: int,
                                  conv_inputs_kept: int | None = None) -> dict:
    """Elements one sequence keeps in one Gated DeltaNet layer, whatever its length.

    ``recurrent``: the state matrix ``[n_v, d_k, d_v]`` (query/key heads are shared by
    ``n_v / n_k`` value heads). ``conv``: the causal depthwise convolution of width ``k =
    conv_kernel_dim`` over the q, k, v channels ``2 * n_k * d_k + n_v * d_v`` needs the last
    ``k - 1`` inputs to compute the next output (the new input is the ``k``-th), the default
    of ``conv_inputs_kept`` and what vLLM keeps; HF ``Qwen3NextDynamicCache`` keeps ``k``
    columns (pass ``conv_inputs_kept=conv_kernel_dim``). HF names: ``linear_num_key_heads``,
    ``linear_num_value_heads``, ``linear_key_head_dim``, ``linear_value_head_dim``,
    ``linear_conv_kernel_dim``.

    Returns:
        dict with ``recurrent``, ``conv`` and ``total`` (elements; times the state's bytes per
        element for bytes: HF keeps the recurrent state in float32, servers often in bf16).

    Raises:
        ValueError: a count not an int >= 1, ``num_value_heads`` not a multiple of
            ``num_key_heads``, or ``conv_inputs_kept`` outside ``[0, conv_kernel_dim]``.
    """
    for name, v in (("num_key_heads", num_key_heads), ("num_value_heads", num_value_heads),
                    ("key_head_dim", key_head_dim), ("value_head_dim", value_head_dim),
                    ("conv_kernel_dim", conv_kernel_dim)):
        integer(name, v, 1)
    if num_value_heads % num_key_heads:
        raise ValueError(f"num_value_heads ({num_value_heads}) must be a multiple of "
                         f"num_key_heads ({num_key_heads})")
    kept = conv_kernel_dim - 1 if conv_inputs_kept is None else conv_inputs_kept
    if isinstance(kept, bool) or not isinstance(kept, int) or not 0 <= kept <= conv_kernel_dim:
        raise ValueError(f"conv_inputs_kept must be an int in [0, conv_kernel_dim="
                         f"{conv_kernel_dim}] or None, got {conv_inputs_kept!r}")
    recurrent = num_value_heads * key_head_dim * value_head_dim
    conv = (2 * num_key_heads * key_head_dim + num_value_heads * value_head_dim) * kept
    return {"recurrent": recurrent, "conv": conv, "total": recurrent + conv}


@dataclass(frozen=True)
class CacheLayout:
    """A model's layers grouped by what they keep for one sequence.

    Attributes:
        name: a label for tables.
        kv_config: the layers that keep K/V (or MLA latents), as a :class:`ModelConfig`
            (sliding layers included); their bytes are ``costmodel.kv_cache_bytes``.
        num_state_layers: layers that keep a constant state instead (linear attention).
        state_elements_per_layer: elements of that state per sequence
            (:func:`gated_deltanet_state_elements`).
    """

    name: str
    kv_config: ModelConfig
    num_state_layers: int = 0
    state_elements_per_layer: int = 0

    def bytes(self, context_len: int, batch: int = 1, bytes_per_element: float = 2) -> int:
        """Cache bytes of ``batch`` sequences of ``context_len`` tokens: K/V layers
        (``costmodel.kv_cache_bytes``) plus ``batch * num_state_layers * state`` elements,
        all at ``bytes_per_element``.

        Raises:
            ValueError: as ``costmodel.kv_cache_bytes``.
        """
        kv = costmodel.kv_cache_bytes(self.kv_config, batch=batch, context_len=context_len,
                                      bytes_per_element=bytes_per_element)
        state = batch * self.num_state_layers * self.state_elements_per_layer
        return int(kv + state * bytes_per_element)

    def bytes_per_token(self, context_len: int, bytes_per_element: float = 2) -> float:
        """Average cache bytes per token of one sequence of ``context_len`` tokens:
        ``bytes(context_len) / context_len`` (constant for MHA/GQA/MQA/MLA; falling with the
        context for sliding windows and constant states)."""
        return self.bytes(context_len, 1, bytes_per_element) / context_len


def hybrid_layout(name: str) -> CacheLayout:
    """The :class:`CacheLayout` of a bundled hybrid model (``"Qwen3-Next-80B-A3B"``): every
    ``full_attention_interval``-th layer is full (GQA) attention, the others Gated DeltaNet
    (HF ``Qwen3NextConfig``: layer ``i`` is full when ``(i + 1) % interval == 0``).

    Raises:
        ValueError: ``name`` not bundled, or its config has no ``full_attention_interval``.
    """
    models = costmodel.reference_models()
    if name not in models or "full_attention_interval" not in models[name]["config"]:
        hybrids = sorted(k for k, m in models.items() if "full_attention_interval" in m["config"])
        raise ValueError(f"name must be a bundled hybrid model {hybrids}, got {name!r}")
    c = models[name]["config"]
    L, every = c["num_hidden_layers"], c["full_attention_interval"]
    n_full = sum((i + 1) % every == 0 for i in range(L))
    attn = {k: c[k] for k in ("vocab_size", "hidden_size", "num_attention_heads",
                              "num_key_value_heads", "head_dim", "intermediate_size")}
    kv = ModelConfig.from_hf_config({**attn, "num_hidden_layers": n_full},
                                    name=f"{name} full-attention layers")
    state = gated_deltanet_state_elements(
        c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
        c["linear_value_head_dim"], c["linear_conv_kernel_dim"])["total"]
    return CacheLayout(name, kv, L - n_full, state)


def example_layouts() -> list:
    """The layouts chapter 8 compares, all from bundled configs (``costmodel.reference_config``):
    Llama-3-8B as MHA (32 K/V heads: a what-if), as published (GQA, 8) and as MQA (1: a
    what-if); DeepSeek-V3 (MLA); Mistral-7B-v0.1 (every layer a 4,096-token window);
    gpt-oss-120b (sliding 128 and full layers alternating); Qwen3-Next-80B-A3B
    (:func:`hybrid_layout`: 12 full-attention layers, 36 Gated DeltaNet layers)."""
    llama = costmodel.reference_config("Llama-3-8B")
    return [
        CacheLayout("MHA  Llama-3-8B, 32 KV heads*", with_kv_heads(llama, 32)),
        CacheLayout("GQA  Llama-3-8B, 8 KV heads", llama),
        CacheLayout("MQA  Llama-3-8B, 1 KV head*", with_kv_heads(llama, 1)),
        CacheLayout("MLA  DeepSeek-V3", costmodel.reference_config("DeepSeek-V3")),
        CacheLayout("SWA  Mistral-7B-v0.1, W=4096", costmodel.reference_config("Mistral-7B-v0.1")),
        CacheLayout("SWA/full  gpt-oss-120b, W=128", costmodel.reference_config("gpt-oss-120b")),
        dataclasses.replace(hybrid_layout("Qwen3-Next-80B-A3B"),
                            name="GDN+full  Qwen3-Next-80B-A3B")]


def kv_per_token_rows(layouts: list, contexts: list, bytes_per_element: float = 2) -> list:
    """One row per :class:`CacheLayout`: its name, then the average cache bytes per token
    (:meth:`CacheLayout.bytes_per_token`, rounded down, an int) at each context length."""
    return [[lay.name] + [int(lay.bytes_per_token(n, bytes_per_element)) for n in contexts]
            for lay in layouts]


def kv_per_token_table(layouts: list, contexts: list, bytes_per_element: float = 2) -> str:
    """:func:`kv_per_token_rows` as a text table (``tokenflow.viz.kv_per_token_view``
    gives the same rows as an HTML table)."""
    head = f"{'layout':<34}" + "".join(f"{f'{n:,} tok':>13}" for n in contexts)
    return "\n".join([head] + [f"{row[0]:<34}" + "".join(f"{b:>13,}" for b in row[1:])
                               for row in kv_per_token_rows(layouts, contexts,
                                                            bytes_per_element)])


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, state: torch.Tensor | None = None):
    """The gated delta rule, one token at a time (Yang et al. 2024, arXiv:2412.06464, eq. for
    Gated DeltaNet; HF ``torch_recurrent_gated_delta_rule`` without its q/k L2 norm):
    ``S_t = a_t S_{t-1} + k_t (beta_t (v_t - (a_t S_{t-1})^T k_t))^T``, ``o_t = S_t^T q_t``
    with ``a_t = exp(g_t)`` and ``q`` scaled by ``d_k ** -0.5``.

    Args:
        q, k: ``[B, S, Hv, Dk]`` (key heads already repeated to the value heads).
        v: ``[B, S, Hv, Dv]``.
        g: ``[B, S, Hv]`` log decay (<= 0). beta: ``[B, S, Hv]`` write strength in [0, 1].
        state: ``[B, Hv, Dk, Dv]`` from an earlier chunk, or None (zeros).

    Returns:
        ``(out [B, S, Hv, Dv], state [B, Hv, Dk, Dv])``, float32. Feeding the returned
        state to the next chunk gives the same outputs as one call over both chunks.

    Raises:
        ValueError: shapes that do not match.
    """
    B, S, H, Dk = q.shape
    if k.shape != q.shape or v.shape[:3] != (B, S, H) or g.shape != (B, S, H) \
            or beta.shape != (B, S, H):
        raise ValueError(f"shapes must be q, k [B,S,H,Dk], v [B,S,H,Dv], g, beta [B,S,H]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, "
                         f"{tuple(g.shape)}, {tuple(beta.shape)}")
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    q = q * Dk ** -0.5
    S_ = torch.zeros(B, H, Dk, v.shape[-1]) if state is None else state.float().clone()
    if S_.shape != (B, H, Dk, v.shape[-1]):
        raise ValueError(f"state must be [B, H, Dk, Dv] = {(B, H, Dk, v.shape[-1])}, "
                         f"got {tuple(S_.shape)}")
    out = torch.empty(B, S, H, v.shape[-1])
    for t in range(S):
        S_ = S_ * g[:, t].exp()[..., None, None]                          # decay
        recalled = (S_ * k[:, t, :, :, None]).sum(-2)                     # [B, H, Dv]
        delta = (v[:, t] - recalled) * beta[:, t, :, None]                # [B, H, Dv]
        S_ = S_ + k[:, t, :, :, None] * delta[:, :, None, :]              # [B, H, Dk, Dv]
        out[:, t] = (S_ * q[:, t, :, :, None]).sum(-2)                    # [B, H, Dv]
    return out, S_


FLASHMLA_SPARSE_FP8_ENTRY_BYTES = 512 + 4 * 4 + 64 * 2
"""Bytes per token and layer of the FP8 MLA cache FlashMLA's sparse decoding kernel reads
(FlashMLA README, FP8 KV cache of the sparse kernels for DeepSeek-V3.2): the 512-wide latent
in FP8 (512 B), four FP32 scales, one per 128 values (16 B), and the 64-wide RoPE key kept
in BF16 (128 B): 656."""


def sparse_decode_reads(config: ModelConfig, context_len: int, index_topk: int,
                        index_head_dim: int, bytes_per_element: float = 2,
                        index_bytes_per_element: float = 1,
                        sparse_entry_bytes: float | None = FLASHMLA_SPARSE_FP8_ENTRY_BYTES) -> dict:
    """Cache bytes one decode token reads, all layers, with DeepSeek Sparse Attention
    (DeepSeek-V3.2-Exp ``inference/model.py``: an ``Indexer`` per layer caches one fp8 key of
    ``index_head_dim`` per token, scores every cached token, and attention reads only the top
    ``index_topk`` MLA entries) against dense attention over the whole context.

    The selected entries are read in the layout of FlashMLA's sparse decoding kernel,
    ``sparse_entry_bytes`` per token and layer (default
    :data:`FLASHMLA_SPARSE_FP8_ENTRY_BYTES`, 656); ``None`` reads them as the dense cache,
    at ``bytes_per_element``.

    Returns:
        dict, bytes: ``dense`` (every entry, ``costmodel.kv_cache_bytes_per_token`` at
        ``bytes_per_element`` each: FlashMLA's dense kernel reads a BF16 cache),
        ``indexer`` (every indexer key), ``selected`` (``min(context_len, index_topk)``
        entries), ``sparse`` = ``indexer + selected``. Scale factors of the fp8 indexer keys
        are left out.

    Raises:
        ValueError: counts < 1, ``sparse_entry_bytes <= 0``, or as
            ``costmodel.kv_cache_bytes_per_token``.
    """
    for name, v in (("context_len", context_len), ("index_topk", index_topk),
                    ("index_head_dim", index_head_dim)):
        integer(name, v, 1)
    entry = costmodel.kv_cache_bytes_per_token(config, bytes_per_element)
    if sparse_entry_bytes is None:
        sparse_entry = entry
    else:
        if isinstance(sparse_entry_bytes, bool) or \
                not isinstance(sparse_entry_bytes, (int, float)) or sparse_entry_bytes <= 0:
            raise ValueError(f"sparse_entry_bytes must be a number > 0 or None, "
                             f"got {sparse_entry_bytes!r}")
        sparse_entry = config.num_hidden_layers * sparse_entry_bytes
    indexer = config.num_hidden_layers * context_len * index_head_dim * index_bytes_per_element
    selected = min(context_len, index_topk) * sparse_entry
    return {"dense": context_len * entry, "indexer": indexer, "selected": selected,
            "sparse": indexer + selected}


# --------------------------------------------------------------------- sizes (chapter 02)
def kv_cache_size(config: ModelConfig, batch_size: int, seq_len: int,
                  num_key_value_heads: int | None = None,
                  dtype: torch.dtype = torch.float32) -> dict:
    """Build a real :class:`KVCache` on PyTorch's ``meta`` device (shapes and dtypes, no
    memory) and report its size next to the closed formula.

    Works for real-scale configs too (e.g. ``costmodel.reference_config("Llama-3-8B")``),
    since meta tensors allocate nothing.

    Args:
        config: the model config.
        batch_size: B >= 1.
        seq_len: S tokens per sequence, ``1 <= S <= config.max_position_embeddings``.
        num_key_value_heads: K/V heads to use instead of the config's (must divide
            ``num_attention_heads``; equal to it is MHA, 1 is MQA).
        dtype: storage dtype (bytes per element = ``dtype.itemsize``).

    Returns:
        dict with ``shape`` (per layer, of K and of V: ``[B, n_kv, S, D]``; MLA: of the
        latent, ``[B, 1, S, kv_lora_rank]``), ``num_tensors`` (``2 * layers``),
        ``num_key_value_heads``, ``bytes_per_element``, ``nbytes`` (sum of the tensors' ``nbytes``,
        bytes), ``bytes_per_token`` (``KVCache.bytes_per_token()``), ``formula_bytes_per_token``
        (:func:`tokenflow.analysis.costmodel.kv_cache_bytes_per_token`) and ``formula_nbytes``
        (``formula_bytes_per_token * B * S``).

    Raises:
        ValueError: on ``batch_size < 1``, ``seq_len`` out of range, or a
            ``num_key_value_heads`` that does not divide ``num_attention_heads`` or is given
            for an MLA config.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or \
            not 1 <= seq_len <= config.max_position_embeddings:
        raise ValueError(f"seq_len must be an int in [1, max_position_embeddings="
                         f"{config.max_position_embeddings}], got {seq_len!r}")
    if num_key_value_heads is not None and num_key_value_heads != config.num_key_value_heads:
        if config.is_mla:
            raise ValueError("num_key_value_heads has no meaning for an MLA config (its cache "
                             "holds one latent per token, not K/V heads)")
        if isinstance(num_key_value_heads, bool) or not isinstance(num_key_value_heads, int) \
                or num_key_value_heads < 1 \
                or config.num_attention_heads % num_key_value_heads != 0:
            raise ValueError(f"num_key_value_heads must be an int >= 1 dividing "
                             f"num_attention_heads={config.num_attention_heads}, "
                             f"got {num_key_value_heads!r}")
        config = config.replace(num_key_value_heads=num_key_value_heads)
    cache = KVCache(config, batch_size, seq_len, dtype=dtype, device="meta")
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_token = kv_cache_bytes_per_token(config, itemsize)
    return dict(shape=list(cache.layers[0][0].shape),
                num_tensors=sum(len(bufs) for bufs in cache.layers),
                num_key_value_heads=config.num_key_value_heads, bytes_per_element=itemsize,
                nbytes=cache.nbytes(), bytes_per_token=cache.bytes_per_token(),
                formula_bytes_per_token=per_token,
                formula_nbytes=per_token * batch_size * seq_len)
