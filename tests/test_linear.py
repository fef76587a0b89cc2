"""``tokenflow.model.linear.linear``: the pre-packed CPU GEMM gives ``F.linear``'s values,
follows changes to the weight, and leaves small weights and training on ``F.linear``."""
import pytest
import torch
import torch.nn.functional as F

from tokenflow.model import linear as linear_mod
from tokenflow.model.linear import PACK_MIN_NUMEL, linear

needs_pack = pytest.mark.skipif(not linear_mod._CAN_PACK, reason="PyTorch built without oneDNN")


@needs_pack
@pytest.mark.parametrize("rows", [1, 3, 16, 257])
def test_packed_matches_f_linear(rows):
    torch.manual_seed(0)
    w = torch.randn(PACK_MIN_NUMEL // 512, 512) * 0.02               # [2048, 512]
    x = torch.randn(2, rows, 512)
    with torch.inference_mode():
        got = linear(x, w)
    assert hasattr(w, "_tf_packed"), "a large fp32 CPU weight should be packed"
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)


@needs_pack
def test_repacks_after_an_in_place_change():
    w = torch.randn(2048, 512) * 0.02
    x = torch.randn(4, 512)
    with torch.no_grad():
        linear(x, w)
        w.mul_(-2.0)                                   # load_state_dict copies in place too
        got = linear(x, w)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_small_weight_and_grad_use_f_linear():
    small = torch.randn(64, 64)
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(linear(x, small), F.linear(x, small))
    assert not hasattr(small, "_tf_packed")
    big = torch.randn(2048, 512, requires_grad=True)
    y = linear(torch.randn(2, 512), big)               # grad on: autograd reaches the weight
    y.sum().backward()
    assert big.grad is not None and not hasattr(big, "_tf_packed")


def test_a_non_fp32_input_takes_f_linears_path():
    """A large fp32 weight with a float64 input: F.linear's own answer (its dtype error), not
    oneDNN's packed kernel on mismatched dtypes."""
    w = torch.randn(2048, 512) * 0.02
    x = torch.randn(3, 512, dtype=torch.float64)
    with torch.no_grad():
        with pytest.raises(RuntimeError) as ours:
            linear(x, w)
        with pytest.raises(RuntimeError) as ref:
            F.linear(x, w)
    assert str(ours.value) == str(ref.value)
    assert not hasattr(w, "_tf_packed")


def test_inside_torch_compile_it_is_f_linear(monkeypatch):
    """While ``torch.compile`` traces, the packed op is not used (Inductor cannot lower it with
    a packed weight input): the call is ``F.linear``, bit for bit, and nothing is packed."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    w = torch.randn(2048, 512) * 0.02
    x = torch.randn(5, 512)
    with torch.inference_mode():
        got = linear(x, w)
    assert torch.equal(got, F.linear(x, w))
    assert not hasattr(w, "_tf_packed")
