"""The shared argument checks: each accepts the edges of its range, refuses one step past
them, and names the argument and the allowed range in the message."""
import numpy as np
import pytest
import torch

from tokenflow.validate import (ArgTypeError, boolean, choice, index, integer, number,
                                token_id_list, token_id_tensor)


def test_integer_accepts_its_bounds_and_numpy_ints():
    assert integer("n", 1, 1, 4) == 1 and integer("n", 4, 1, 4) == 4
    assert type(integer("n", np.int64(3), 0)) is int
    assert integer("n", None, 1, none=True) is None


@pytest.mark.parametrize("v, msg", [(0, r"n must be in \[1, 4\], got 0"),
                                    (5, r"n must be in \[1, 4\], got 5")])
def test_integer_refuses_one_past_each_bound(v, msg):
    with pytest.raises(ValueError, match=msg):
        integer("n", v, 1, 4)


def test_integer_names_the_upper_bound_and_a_lower_only_range():
    with pytest.raises(ValueError, match=r"top_k must be in \[1, num_experts=4\], got 5"):
        integer("top_k", 5, 1, 4, hi_name="num_experts")
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        integer("n", -1, 0)


@pytest.mark.parametrize("v", [True, 1.0, "1", None])
def test_integer_refuses_other_types_as_both_type_and_value_errors(v):
    with pytest.raises(ArgTypeError, match=f"n must be an int, got {type(v).__name__}"):
        integer("n", v, 0)
    assert issubclass(ArgTypeError, TypeError) and issubclass(ArgTypeError, ValueError)


@pytest.mark.parametrize("v", [-1, 3, 1.0, True])
def test_index_is_half_open(v):
    assert index("i", 2, 3, "size") == 2
    with pytest.raises(ValueError, match=r"i must be an int in \[0, size=3\)"):
        index("i", v, 3, "size")


def test_number_ranges_open_and_closed():
    assert number("p", 1, 0, 1, lo_open=True) == 1
    for bad in (0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
            number("p", bad, 0, 1, lo_open=True)
    with pytest.raises(ValueError, match="t must be a finite number >= 0, got inf"):
        number("t", float("inf"), 0)
    with pytest.raises(TypeError, match="t must be a number"):
        number("t", True, 0)


def test_boolean_and_choice():
    assert boolean("b", np.bool_(True)) is True
    with pytest.raises(TypeError, match="b must be a bool, got int 1"):
        boolean("b", 1)
    assert choice("c", "x", ("x", "y")) == "x"
    with pytest.raises(ValueError, match=r"c must be one of \('x', 'y'\), got 'z'"):
        choice("c", "z", ("x", "y"))
    with pytest.raises(ValueError, match="c must be one of"):
        choice("c", ["unhashable"], {"x"})


def test_token_ids_at_the_vocabulary_edges():
    assert token_id_list("eos", [0, 9], 10) == (0, 9)
    with pytest.raises(ValueError, match=r"eos must be in \[0, vocab_size=10\), got 10"):
        token_id_list("eos", [0, 10], 10)
    ids = torch.tensor([[0, 9]])
    assert token_id_tensor("input_ids", ids, 10) is ids
    with pytest.raises(ValueError, match="found token id -1"):
        token_id_tensor("input_ids", torch.tensor([[-1, 3]]), 10)
    with pytest.raises(TypeError, match="integer tensor"):
        token_id_tensor("input_ids", ids.float(), 10)
    with pytest.raises(ValueError, match=r"shape \[B, S\]"):
        token_id_tensor("input_ids", torch.zeros(1, 0, dtype=torch.long), 10)


def test_integer_says_why_an_upper_bound_exists_only_above_it():
    with pytest.raises(ValueError, match=r"got 5 \(no more experts than exist\)$"):
        integer("k", 5, 1, 4, above="no more experts than exist")
    with pytest.raises(ValueError, match=r"got 0$"):
        integer("k", 0, 1, 4, above="no more experts than exist")
