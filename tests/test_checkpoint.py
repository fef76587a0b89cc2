"""Damaged weights files (issue R2 item 8): load_model / load_pretrained raise the documented
ValueError naming the file, and for a wrong tensor its name and both shapes."""
import json
import re
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import tokenflow.interop.checkpoint as checkpoint
from tokenflow import load_model, load_pretrained, save_model
from tokenflow.interop.checkpoint import DEFAULT_WEIGHTS


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A small model saved once: (path, its bytes, state dict, metadata)."""
    from conftest import random_model
    path = tmp_path_factory.mktemp("ckpt") / "good.safetensors"
    save_model(random_model(0), path)
    with safe_open(str(path), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    return path, path.read_bytes(), state, meta


def _header_len(data: bytes) -> int:
    return struct.unpack("<Q", data[:8])[0]


def _cuts(data: bytes) -> dict:
    n, h = len(data), _header_len(data)
    return {"empty": 0, "4 bytes": 4, "length only": 8, "mid header": 8 + h // 2,
            "header only": 8 + h, "header + 1": 8 + h + 1, "half": n // 2, "last byte": n - 1}


def _expect_named(path, *parts):
    return pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + ".*".join(
        re.escape(p) for p in parts))


@pytest.mark.parametrize("where", list(_cuts(b"\x10" + b"\x00" * 7 + b"x" * 40)))
def test_truncated_file_names_the_file(good, tmp_path, where):
    _, data, _, _ = good
    bad = tmp_path / f"cut {where}.safetensors"
    bad.write_bytes(data[:_cuts(data)[where]])
    with _expect_named(bad):
        load_model(bad)


@pytest.mark.parametrize("payload", [b"not a safetensors file at all\n" * 20, bytes(64),
                                     b"\xff" * 64, b'{"config": 1}', b"PK\x03\x04" + bytes(60)])
def test_foreign_bytes_name_the_file(tmp_path, payload):
    bad = tmp_path / "foreign.safetensors"
    bad.write_bytes(payload)
    with _expect_named(bad):
        load_model(bad)


def test_extra_bytes_after_the_data(good, tmp_path):
    _, data, _, _ = good
    bad = tmp_path / "extra.safetensors"
    bad.write_bytes(data + b"\x00" * 3)
    with _expect_named(bad):
        load_model(bad)


def test_wrong_shape_names_tensor_and_both_shapes(good, tmp_path):
    _, _, state, meta = good
    name = "layers.0.self_attn.q_proj.weight"
    want = list(state[name].shape)
    changed = dict(state, **{name: torch.zeros(want[0] + 1, want[1])})
    bad = tmp_path / "shape.safetensors"
    save_file(changed, str(bad), metadata=meta)
    with _expect_named(bad, name, str([want[0] + 1, want[1]]), str(want)):
        load_model(bad)
    # neighbours: the embedding transposed, a 1-D norm weight as 2-D
    for name, t in [("embed_tokens.weight", state["embed_tokens.weight"].T.contiguous()),
                    ("norm.weight", state["norm.weight"][None])]:
        save_file(dict(state, **{name: t}), str(bad), metadata=meta)
        with _expect_named(bad, name, str(list(t.shape)), str(list(state[name].shape))):
            load_model(bad)


def test_integer_tensor_where_weights_are_float(good, tmp_path):
    _, _, state, meta = good
    name = "lm_head.weight"
    bad = tmp_path / "dtype.safetensors"
    save_file(dict(state, **{name: state[name].to(torch.int32)}), str(bad), metadata=meta)
    with _expect_named(bad, name, "int32"):
        load_model(bad)


def test_missing_and_unexpected_tensors_are_named(good, tmp_path):
    _, _, state, meta = good
    gone = "layers.1.mlp.gate.weight"
    bad = tmp_path / "names.safetensors"
    save_file({k: v for k, v in state.items() if k != gone}, str(bad), metadata=meta)
    with _expect_named(bad, "missing", gone):
        load_model(bad)
    save_file(dict(state, extra_tensor=torch.zeros(2)), str(bad), metadata=meta)
    with _expect_named(bad, "unexpected", "extra_tensor"):
        load_model(bad)


@pytest.mark.parametrize("config", [None, "{not json", json.dumps({"hidden_size": -4}),
                                    json.dumps([1, 2])])
def test_bad_config_metadata_names_the_file(good, tmp_path, config):
    _, _, state, meta = good
    bad = tmp_path / "meta.safetensors"
    save_file(state, str(bad), metadata=None if config is None else dict(meta, config=config))
    with _expect_named(bad, "config"):
        load_model(bad)


def test_directory_and_missing_path(tmp_path):
    with _expect_named(tmp_path, "directory"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
        load_model(tmp_path / "nothing.safetensors")


def test_good_copy_still_loads(good, tmp_path):
    path, data, _, _ = good
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(data)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(load_model(copy)(ids), load_model(path)(ids))


def test_load_pretrained_names_a_damaged_shipped_file(tmp_path, monkeypatch):
    shipped = checkpoint._data_path(DEFAULT_WEIGHTS).read_bytes()
    (tmp_path / DEFAULT_WEIGHTS).write_bytes(shipped[: len(shipped) // 2])
    monkeypatch.setattr(checkpoint, "_data_path", lambda name: tmp_path / name)
    with _expect_named(tmp_path / DEFAULT_WEIGHTS):
        load_pretrained()
