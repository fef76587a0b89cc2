"""Save and load weights with safetensors (no pickle); ``load_pretrained()`` for the book.

The file stores every parameter and persistent buffer as a named tensor, and the
:class:`~tokenflow.model.config.ModelConfig` as JSON in the safetensors metadata (key ``config``).
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tokenflow.model.config import ModelConfig
from tokenflow.model.transformer import TokenFlowModel
from tokenflow.tokenizer import Tokenizer

__all__ = ["save_model", "load_model", "load_pretrained", "DEFAULT_WEIGHTS"]

DEFAULT_WEIGHTS = "tiny.safetensors"


def _data_path(name: str) -> Path:
    return Path(str(resources.files("tokenflow") / "data" / name))


def save_model(model: TokenFlowModel, path: str | Path, metadata: dict | None = None) -> None:
    """Write ``model``'s state dict and config to a ``.safetensors`` file.

    Raises:
        ValueError: if the model ties its LM head (save untied models only).
    """
    if model.config.tie_word_embeddings:
        raise ValueError("save_model: tied embeddings are not supported; "
                         "set tie_word_embeddings=False")
    meta = {"config": json.dumps(model.config.to_dict())}
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata=meta)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> TokenFlowModel:
    """Build a :class:`TokenFlowModel` from a file written by :func:`save_model`, in eval mode.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file has no ``config`` metadata or its tensors do not match.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no weights file at {path}")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "config" not in meta:
        raise ValueError(f"{path} has no 'config' metadata; was it written by save_model?")
    config = ModelConfig.from_dict(json.loads(meta["config"]))
    model = TokenFlowModel(config)
    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    if missing or unexpected:
        raise ValueError(f"weights in {path} do not match the config: missing={missing}, "
                         f"unexpected={unexpected}")
    return model.to(dtype).eval()


def load_pretrained(dtype: torch.dtype = torch.float32) -> tuple[TokenFlowModel, Tokenizer]:
    """The book's trained tiny model and its tokenizer, from the package data, in eval mode.

    Returns:
        ``(model, tokenizer)``.
    """
    return load_model(_data_path(DEFAULT_WEIGHTS), dtype), Tokenizer.from_file()
