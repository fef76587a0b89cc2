"""Save and load weights with safetensors (no pickle); ``load_pretrained()`` for the book.

The file stores every parameter and persistent buffer as a named tensor, and the
:class:`~tokenflow.config.ModelConfig` as JSON in the safetensors metadata (key ``config``).
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from tokenflow.config import ModelConfig
from tokenflow.model.transformer import TokenFlowModel
from tokenflow.tokenizer import Tokenizer

__all__ = ["save_model", "load_model", "load_pretrained", "DEFAULT_WEIGHTS"]

DEFAULT_WEIGHTS = "tiny.safetensors"


def _data_path(name: str) -> Path:
    return Path(str(resources.files("tokenflow") / "data" / name))


def _check_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got "
                        f"{type(dtype).__name__} {dtype!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype (torch.float32, torch.bfloat16, "
                         f"...), got {dtype}")
    return dtype


def save_model(model: TokenFlowModel, path: str | Path, metadata: dict | None = None) -> None:
    """Write ``model``'s state dict (in the model's dtype) and config to a ``.safetensors``
    file.

    Args:
        model: the model (untied LM head).
        path: the file to write (str or ``Path``).
        metadata: more ``{key: value}`` strings for the file's metadata (values are written
            with ``str``); ``config`` is the key of the model's config and cannot be set.

    Raises:
        ValueError: if the model ties its LM head (save untied models only), or ``metadata``
            sets ``config``.
        TypeError: ``metadata`` is not a dict with str keys.
    """
    if model.config.tie_word_embeddings:
        raise ValueError("save_model: tied embeddings are not supported; "
                         "set tie_word_embeddings=False")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise TypeError(f"metadata must be a dict with str keys or None, got {metadata!r}")
    if "config" in metadata:
        raise ValueError("metadata must not set 'config': that key holds the model's config")
    meta = {"config": json.dumps(model.config.to_dict())}
    meta.update({k: str(v) for k, v in metadata.items()})
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata=meta)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> TokenFlowModel:
    """Build a :class:`TokenFlowModel` from a file written by :func:`save_model`, in eval mode.

    Every tensor is checked against the model the stored config builds before any is loaded,
    so a damaged or foreign file fails with a ``ValueError`` that names the file (and the
    tensor), never a bare ``SafetensorError`` or ``RuntimeError: size mismatch``.

    Args:
        path: the ``.safetensors`` file (str or ``Path``).
        dtype: the floating dtype of the returned model's weights, whatever the file holds
            (``torch.float32`` default; ``torch.bfloat16`` halves the memory).

    Raises:
        TypeError: ``dtype`` is not a ``torch.dtype``.
        FileNotFoundError: if ``path`` does not exist.
        ValueError: naming ``path``, if it is a directory; is not a complete safetensors file
            (empty, truncated at any point, extra bytes, not safetensors at all); has no
            ``config`` metadata or one that is not a valid :class:`ModelConfig`; lacks a
            tensor the config needs or holds one it does not (listing the names); or holds a
            tensor of the wrong shape (naming it, with the file's and the model's shape) or a
            non-floating dtype where the model has a floating one; ``dtype`` not floating.
    """
    _check_dtype(dtype)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no weights file at {path}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a .safetensors weights file")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if "config" not in meta:
                raise ValueError(f"{path} has no 'config' metadata; was it written by "
                                 "save_model?")
            try:
                config = ModelConfig.from_dict(json.loads(meta["config"]))
            except (ValueError, TypeError) as e:      # json.JSONDecodeError is a ValueError
                raise ValueError(f"{path}: its 'config' metadata is not a valid ModelConfig "
                                 f"({e})") from e
            model = TokenFlowModel(config)
            expected = model.state_dict()
            names = set(f.keys())
            missing = sorted(set(expected) - names)
            unexpected = sorted(names - set(expected))
            if missing or unexpected:
                raise ValueError(f"weights in {path} do not match the config: "
                                 f"missing={missing}, unexpected={unexpected}")
            state = {}
            for name in sorted(names):
                t = f.get_tensor(name)
                want = expected[name]
                if t.shape != want.shape:
                    raise ValueError(f"{path}: tensor {name!r} has shape {list(t.shape)} but "
                                     f"the model built from its config needs "
                                     f"{list(want.shape)}")
                if want.is_floating_point() and not t.is_floating_point():
                    raise ValueError(f"{path}: tensor {name!r} has dtype {t.dtype} but the "
                                     f"model needs a floating dtype ({want.dtype})")
                state[name] = t
    except SafetensorError as e:
        raise ValueError(f"{path} is not a complete safetensors file (truncated, damaged or "
                         f"another format): {e}") from e
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def load_pretrained(dtype: torch.dtype = torch.float32) -> tuple[TokenFlowModel, Tokenizer]:
    """The book's trained tiny model and its tokenizer, from the package data, in eval mode.

    Args:
        dtype: the model's floating dtype (as :func:`load_model`).

    Returns:
        ``(model, tokenizer)``.

    Raises:
        TypeError, ValueError: a ``dtype`` that is not a floating ``torch.dtype``.
        ValueError: the shipped weights file is damaged (see :func:`load_model`; the message
            names the file).
    """
    return load_model(_data_path(DEFAULT_WEIGHTS), dtype), Tokenizer.from_file()
