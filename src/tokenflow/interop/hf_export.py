"""Write a Hugging Face checkpoint folder: the road from the book to vLLM / SGLang.

The folder holds what ``transformers.AutoModelForCausalLM.from_pretrained(folder)`` and
``AutoTokenizer.from_pretrained(folder)`` read, offline, and what serving engines that load
Hugging Face checkpoints (vLLM, SGLang) read too:

* ``config.json``: :func:`tokenflow.interop.to_hf_config` (Llama, Mixtral or Qwen2-MoE);
* ``generation_config.json``: the special token ids;
* ``model.safetensors``: :func:`tokenflow.interop.state_dict_to_hf`'s tensors in the layout of
  the family's published checkpoints (:func:`checkpoint_layout`: one tensor per expert, and
  Mixtral's ``block_sparse_moe.experts.{j}.w1/w2/w3``), which vLLM's loaders read and
  transformers converts to its fused experts on load;
* ``tokenizer.json`` (the ``tokenizers`` file of our BPE tokenizer) and
  ``tokenizer_config.json`` (``PreTrainedTokenizerFast`` with ``<bos>``, ``<eos>``,
  ``<pad>``, ``<unk>`` and ``split_special_tokens: true``, so that text spelling ``<eos>``
  is encoded as characters, as :meth:`tokenflow.tokenizer.Tokenizer.encode` does), plus
  ``special_tokens_map.json``. A reader that ignores ``tokenizer_config.json`` (the bare
  ``tokenizers`` file, or an engine reading only ``tokenizer.json``) still matches special
  spellings in text; pass ``split_special_tokens=True`` or encode the text yourself.
"""
from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from .hf_architectures import hf_architecture, to_hf_config
from .hf_models import state_dict_to_hf
from .vllm_peer import vllm_problem
from tokenflow.tokenizer import SPECIAL_TOKENS, Tokenizer

__all__ = ["save_hf_checkpoint", "checkpoint_layout"]

_MIXTRAL_EXPERT = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
"""Mixtral's published names for an expert's three matrices."""


def checkpoint_layout(weights: dict, arch: str) -> dict:
    """HF runtime tensors (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj
    [E, H, I]``, as :func:`state_dict_to_hf` gives) as the family's checkpoints store them:
    ``experts.{j}.{gate,up,down}_proj.weight`` (Qwen2-MoE, DeepSeek-V3) or, for Mixtral,
    ``block_sparse_moe.experts.{j}.{w1,w3,w2}.weight`` and ``block_sparse_moe.gate``.

    Sources: transformers 5 ``conversion_mapping.py`` (the ``mixtral`` and ``qwen2_moe``
    entries, used for DeepSeek-V3 too, undo exactly this on load); vLLM 0.32
    ``models/mixtral.py`` / ``qwen2_moe.py`` / ``deepseek_v2.py`` ``load_weights``.
    """
    out = {}
    for k, v in weights.items():
        if k.endswith(".experts.gate_up_proj"):
            stem = k[:-len("gate_up_proj")]
            gate, up = v.chunk(2, dim=1)                        # [E, I, H] each
            for j in range(v.shape[0]):
                out[f"{stem}{j}.gate_proj.weight"] = gate[j]
                out[f"{stem}{j}.up_proj.weight"] = up[j]
        elif k.endswith(".experts.down_proj"):
            stem = k[:-len("down_proj")]
            for j in range(v.shape[0]):
                out[f"{stem}{j}.down_proj.weight"] = v[j]
        else:
            out[k] = v
    if arch != "mixtral":
        return out
    renamed = {}
    for k, v in out.items():
        if ".mlp.experts." in k or k.endswith(".mlp.gate.weight"):
            k = k.replace(".mlp.", ".block_sparse_moe.")
            for ours, theirs in _MIXTRAL_EXPERT.items():
                k = k.replace(f".{ours}.weight", f".{theirs}.weight")
        renamed[k] = v
    return renamed


def _check_tokenizer(config, tokenizer: Tokenizer) -> None:
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model's "
                         f"vocab_size is {config.vocab_size}")
    for name in ("pad_token_id", "bos_token_id"):
        if getattr(tokenizer, name) != getattr(config, name):
            raise ValueError(f"{name} differs: tokenizer {getattr(tokenizer, name)}, model "
                             f"config {getattr(config, name)}")
    if tokenizer.eos_token_id not in config.eos_token_ids:      # one of several is fine
        raise ValueError(f"eos_token_id differs: tokenizer {tokenizer.eos_token_id}, model "
                         f"config {config.eos_token_id}")


def _write_tokenizer(tokenizer: Tokenizer, folder: Path, max_len: int) -> None:
    tokenizer.save(folder / "tokenizer.json")
    pad, bos, eos, unk = SPECIAL_TOKENS
    special = {"bos_token": bos, "eos_token": eos, "pad_token": pad, "unk_token": unk}
    # split_special_tokens: text that spells "<eos>" stays text, as in Tokenizer.encode
    cfg = dict(special, tokenizer_class="PreTrainedTokenizerFast", model_max_length=max_len,
               clean_up_tokenization_spaces=False, add_bos_token=False, add_eos_token=False,
               split_special_tokens=True)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2),
                                                    encoding="utf-8")


def save_hf_checkpoint(model, folder: str | Path, tokenizer: Tokenizer | None = None,
                       architecture: str | None = None, check_vllm: bool = True) -> Path:
    """Write ``model`` (and its tokenizer) as a Hugging Face checkpoint folder.

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel` (weights saved in its dtype).
        folder: directory to write (created if missing; files in it are overwritten).
        tokenizer: a :class:`~tokenflow.tokenizer.Tokenizer`; default the shipped one.
        architecture: ``"llama"``, ``"mixtral"``, ``"qwen2_moe"`` or ``"deepseek_v3"``;
            default :func:`tokenflow.interop.hf_architecture`.
        check_vllm: refuse a model whose attention vLLM's CPU build cannot run
            (:func:`tokenflow.interop.vllm_peer.vllm_problem`: head sizes, the MLA latent);
            ``False`` writes it anyway (transformers still loads it).

    Returns:
        the folder's ``Path``. ``AutoModelForCausalLM.from_pretrained(folder)`` gives logits
        equal to ours (fp32: within 1e-4, tested) and ``AutoTokenizer.from_pretrained(folder)``
        the same ids as ``tokenizer.encode`` (with ``add_special_tokens=False``).

    Raises:
        ValueError: no HF family expresses the config (see ``hf_architecture``); the
            tokenizer is larger than ``vocab_size`` or its special ids differ from the
            config's; with ``check_vllm``, an attention shape vLLM's CPU kernels refuse.
        ImportError: if ``transformers`` is not installed.
    """
    from transformers import GenerationConfig
    config = model.config
    if not isinstance(check_vllm, bool):
        raise TypeError(f"check_vllm must be a bool, got {check_vllm!r}")
    problem = vllm_problem(config) if check_vllm else None
    if problem:
        raise ValueError(f"{problem}; pass check_vllm=False to write the checkpoint anyway "
                         f"(transformers loads it, vLLM's CPU build does not)")
    arch = architecture or hf_architecture(config)
    tokenizer = tokenizer if tokenizer is not None else Tokenizer.from_file()
    _check_tokenizer(config, tokenizer)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf_config = to_hf_config(config, arch)
    hf_config.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    hf_config.save_pretrained(folder)
    GenerationConfig.from_model_config(hf_config).save_pretrained(folder)
    weights = checkpoint_layout(state_dict_to_hf(model, None, arch), arch)
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight")                  # HF ties it to the embedding on load
    weights = {k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(tokenizer, folder, config.max_position_embeddings)
    return folder
