"""Rule-based scoring functions and the data_source registry."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hf_algos.rewards import (
    SCORING_FUNCTIONS,
    compute_gsm8k_score,
    compute_math_score,
    extract_gsm8k_answer,
    get_scoring_function,
    last_boxed_content,
    last_token_index,
    math_answers_equal,
    place_on_last_token,
    register_scoring_function,
)


def test_gsm8k_extraction_and_score() -> None:
    assert extract_gsm8k_answer("so 3+4 = 7\n#### 1,234") == "1234"
    assert extract_gsm8k_answer("#### 1 then #### -2.50") == "-2.5"
    assert extract_gsm8k_answer("the answer is 12 or 13") is None
    assert extract_gsm8k_answer("the answer is 12 or 13", strict=False) == "13"
    assert compute_gsm8k_score("work... #### 72", "72") == 1.0
    assert compute_gsm8k_score("work... #### 72", "Natalia sold ... #### 72") == 1.0
    assert compute_gsm8k_score("#### 1,000", 1000) == 1.0
    assert compute_gsm8k_score("#### 71", "72", format_score=0.1) == 0.1
    assert compute_gsm8k_score("it is 72", "72") == 0.0
    assert compute_gsm8k_score("it is 72", "72", strict=False) == 1.0


def test_math_boxed_extraction_and_equivalence() -> None:
    assert last_boxed_content(r"first \boxed{1} then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed_content(r"\fbox{x^{2}}") == "x^{2}"
    assert last_boxed_content(r"so \boxed 5$") == "5"
    assert last_boxed_content(r"\boxed{unclosed") is None
    assert last_boxed_content("no box") is None
    assert math_answers_equal(r"\dfrac{1}{2}", r"\frac12")
    assert math_answers_equal("0.5", r"\frac{1}{2}")
    assert math_answers_equal(r"x = \left( 1, 2 \right)", "(1,2)")
    assert math_answers_equal(r"30^\circ", "30")
    assert math_answers_equal(r"\text{5}", "5")
    assert not math_answers_equal("3", "4")
    assert compute_math_score(r"thus \boxed{\frac{3}{4}}", "0.75") == 1.0
    assert compute_math_score(r"thus \boxed{3}", r"the answer is \boxed{3}.") == 1.0
    assert compute_math_score(r"thus \boxed{2}", "3") == 0.0
    assert compute_math_score("3", "3") == 0.0  # no box, no credit


def test_math_verify_compares_answers_as_math() -> None:
    """Equal answers the former string and fraction checks scored 0."""
    assert math_answers_equal(r"\sqrt{4}", "2")
    assert math_answers_equal(r"\frac{\pi}{2}", r"\pi/2")
    assert math_answers_equal("x+1", "1+x")
    assert math_answers_equal(r"\{1, 2\}", r"\{2, 1\}")
    assert not math_answers_equal(r"\sqrt{5}", "2")
    assert not math_answers_equal("x+2", "1+x")
    assert compute_math_score(r"so \boxed{\sqrt{4}}", "2") == 1.0
    assert compute_math_score(r"so \boxed{0.5}", r"\frac{1}{2}") == 1.0
    assert compute_math_score(r"so \boxed{2\sqrt{2}}", r"\sqrt{8}") == 1.0
    assert compute_math_score(r"so \boxed{2\sqrt{2}}", r"\sqrt{6}") == 0.0
    assert compute_gsm8k_score("#### 18", "$18") == 1.0
    assert compute_gsm8k_score("#### 0.5", "1/2") == 1.0
    assert compute_gsm8k_score("#### 72", "72.00") == 1.0
    assert compute_gsm8k_score("#### 18", "$19", format_score=0.1) == 0.1


def test_math_verify_runs_outside_the_main_thread() -> None:
    """Its own SIGALRM timeouts are off (the scoring worker bounds time), so a thread works."""
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(compute_math_score, r"\boxed{\frac{1}{2}}", "0.5").result() == 1.0
        assert pool.submit(compute_gsm8k_score, "#### 18", "$18").result() == 1.0


def test_registry_is_explicit() -> None:
    assert get_scoring_function("openai/gsm8k") is compute_gsm8k_score
    assert get_scoring_function("lighteval/MATH") is compute_math_score
    with pytest.raises(KeyError, match="no scoring function for data_source 'nope'"):
        get_scoring_function("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_scoring_function("gsm8k", compute_math_score)
    mine: dict = {}
    register_scoring_function("mine", compute_math_score, registry=mine)
    assert "mine" not in SCORING_FUNCTIONS and get_scoring_function("mine", mine)


def test_scores_sit_on_the_last_valid_token() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert last_token_index(mask).tolist() == [2, 0, 3, 0]
    placed = place_on_last_token(torch.tensor([1.0, 0.5, 0.25, 2.0]), mask)
    assert placed.dtype == torch.float32
    assert placed.tolist() == [
        [0, 0, 1.0, 0],
        [0.5, 0, 0, 0],
        [0, 0, 0, 0.25],
        [2.0, 0, 0, 0],
    ]
