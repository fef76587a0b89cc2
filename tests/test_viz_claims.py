"""``shapes`` and ``checks``: the tables the chapters show instead of one ``print`` per tensor
shape or per claim. Expected rows are counted by hand from the inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenflow.viz import Table, agree, checks, set_language, shapes


def test_shapes_rows_name_shape_and_elements_in_order():
    t = shapes(input_ids=torch.zeros(1, 5, dtype=torch.long), hidden=torch.zeros(1, 5, 64))
    assert isinstance(t, Table)
    assert t.headers == ["tensor", "shape", "elements"]
    # 1 * 5 = 5 and 1 * 5 * 64 = 320 elements
    assert t.rows == [["input_ids", "[1, 5]", 5], ["hidden", "[1, 5, 64]", 320]]
    assert t.align == ["<", "<", ">"]


def test_shapes_takes_a_mapping_first_then_keywords_and_arrays():
    t = shapes({"x (tokens)": np.zeros((3, 7))}, scalar=torch.tensor(2.0), title="MoE")
    # a 0-d tensor has shape [] and one element; 3 * 7 = 21
    assert t.rows == [["x (tokens)", "[3, 7]", 21], ["scalar", "[]", 1]]
    assert t.title == "MoE"
    assert "21" in t.to_text() and t.to_text().splitlines()[0] == "MoE"


def test_shapes_counts_elements_of_a_meta_tensor_without_memory():
    t = shapes(x=torch.empty(8, 4096, 12288, device="meta"))
    assert t.rows[0][2] == 402_653_184          # 8 * 4096 * 12288
    assert "402,653,184" in t.to_text()


@pytest.mark.parametrize("bad, err, match", [
    ((), ValueError, "at least one"),
    (([1, 2],), TypeError, "mapping"),
    (({"ids": [1, 2, 3]},), TypeError, "'ids' must have a .shape"),
])
def test_shapes_rejects_bad_input(bad, err, match):
    with pytest.raises(err, match=match):
        shapes(*bad)


def test_checks_rows_show_each_claim_and_whether_it_holds():
    t = checks({"a == a": True, "a == b": False, "one-element tensor": torch.tensor(True),
                "numpy bool": np.bool_(False)})
    assert t.headers == ["claim", "holds"]
    assert t.rows == [["a == a", "True"], ["a == b", "False"], ["one-element tensor", "True"],
                      ["numpy bool", "False"]]


def test_checks_show_an_agreement_with_its_tolerance_and_the_gap_only_when_it_fails():
    ok = agree(torch.ones(3), torch.ones(3) + 1e-9, 1e-6, what="ignored name")
    bad = agree(torch.ones(3), torch.ones(3) + 0.5, 1e-6)
    t = checks(close=ok, far=bad)
    assert t.rows[0] == ["close", "equal within 1e-6: True"]
    assert t.rows[1] == ["far", "equal within 1e-6: False (max |a - b| = 0.5)"]
    assert "ignored name" not in t.to_text()


def test_checks_title_and_html():
    t = checks({"K < 1": True}, title="next token: 都")
    html = t._repr_html_()
    assert "<caption>next token: 都</caption>" in html and "K &lt; 1" in html


@pytest.mark.parametrize("value, match", [
    (1, "must be a bool"),
    ("True", "must be a bool"),
    (torch.tensor([True, False]), "shape \\[2\\]"),
    (None, "must be a bool"),
])
def test_checks_refuse_what_is_not_one_boolean(value, match):
    with pytest.raises(TypeError, match=match):
        checks({"claim": value})


def test_checks_needs_a_claim():
    with pytest.raises(ValueError, match="at least one"):
        checks()


def test_checks_and_shapes_headers_in_chinese():
    set_language("zh")
    try:
        assert checks(x=True).headers == ["结论", "成立"]
        assert shapes(x=torch.zeros(2)).headers == ["张量", "形状", "元素数"]
    finally:
        set_language("en")
