"""Damaged weights files: load_model / load_pretrained raise the documented
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
    from helpers import random_model
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


# ------------------------------------------------------------------ every argument matters
def _saved(tmp_path, model=None, name="m.safetensors", **kw):
    from helpers import random_model
    model = model or random_model(3)
    path = tmp_path / name
    save_model(model, path, **kw)
    return model, path


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16])
def test_load_model_dtype_sets_the_weights_dtype(tmp_path, dtype):
    """``dtype`` is the dtype of every weight of the result; the values are the saved
    float32 ones cast to it (so float64 equals them exactly)."""
    model, path = _saved(tmp_path)
    back = load_model(path, dtype=dtype)
    assert {p.dtype for p in back.parameters()} == {dtype}
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a.to(dtype), b), k
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert back(ids).dtype == dtype


def test_load_model_default_is_float32_even_for_a_bfloat16_file(tmp_path):
    from helpers import random_model
    model = random_model(4).to(torch.bfloat16)
    _, path = _saved(tmp_path, model)
    with safe_open(str(path), framework="pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.bfloat16      # saved as it was
    back = load_model(path)
    assert back.lm_head.weight.dtype == torch.float32
    assert torch.equal(back.lm_head.weight, model.lm_head.weight.float())


@pytest.mark.parametrize("bad, err", [("float16", TypeError), (None, TypeError),
                                      (torch.int64, ValueError), (torch.bool, ValueError)])
def test_load_model_refuses_a_dtype_that_is_not_floating(tmp_path, bad, err):
    _, path = _saved(tmp_path)
    with pytest.raises(err, match="dtype"):
        load_model(path, dtype=bad)
    with pytest.raises(err, match="dtype"):
        load_pretrained(dtype=bad)


def test_load_model_path_as_str_or_path(tmp_path):
    model, path = _saved(tmp_path)
    a, b = load_model(str(path)), load_model(path)
    assert a.config == b.config == model.config
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_save_model_keeps_the_config_fields_and_the_metadata(tmp_path):
    """The config round-trips, new fields included (``hidden_act``, ``topk_method``); each
    ``metadata`` entry is stored as a string next to it; ``config`` cannot be overwritten."""
    from helpers import random_model
    model = random_model(5, hidden_act="gelu", topk_method="group_limited_greedy")
    _, path = _saved(tmp_path, model, metadata={"step": 300, "note": "after warm-up"})
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["step"] == "300" and meta["note"] == "after warm-up"
    back = load_model(path)
    assert back.config == model.config
    assert back.config.hidden_act == "gelu"
    assert back.config.topk_method == "group_limited_greedy"
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(back(ids), model(ids))
    with pytest.raises(ValueError, match="config"):
        save_model(model, tmp_path / "x.safetensors", metadata={"config": "{}"})
    with pytest.raises(TypeError, match="metadata"):
        save_model(model, tmp_path / "y.safetensors", metadata=[("a", 1)])
    _, plain = _saved(tmp_path, model, name="plain.safetensors")
    with safe_open(str(plain), framework="pt") as f:
        assert set(f.metadata()) == {"config"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_pretrained_dtype(dtype):
    model, tok = load_pretrained(dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert not model.training and tok.vocab_size == model.config.vocab_size
