"""Group helpers of dynamic sampling (DAPO filter_groups), against hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from hf_algos.advantages.grouping import first_groups_rows, group_ids, varied_group_rows


def test_varied_group_rows_drops_all_equal_groups_keeps_singletons() -> None:
    # uid: a a | b b b | c | d d ; scores: a all 1, b mixed, c alone, d all 0
    ids = group_ids(["a", "a", "b", "b", "b", "c", "d", "d"])
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.0, 0.0])
    kept = varied_group_rows(ids, scores)
    assert kept.tolist() == [False, False, True, True, True, True, False, False]


def test_varied_group_rows_interleaved_rows_and_tiny_differences() -> None:
    # rows of a group need not be adjacent; any difference counts (verl: std > 0)
    ids = torch.tensor([0, 1, 0, 1])
    scores = torch.tensor([0.25, 2.0, 0.25 + 1e-6, 2.0])
    assert varied_group_rows(ids, scores).tolist() == [True, False, True, False]


def test_varied_group_rows_empty_and_mismatch() -> None:
    empty = torch.zeros(0, dtype=torch.long)
    assert varied_group_rows(empty, torch.zeros(0)).tolist() == []
    with pytest.raises(ValueError, match="one uid per response row"):
        varied_group_rows(torch.tensor([0, 0]), torch.tensor([1.0]))


def test_first_groups_rows_by_first_appearance() -> None:
    ids = torch.tensor([7, 7, 3, 9, 3, 9, 4])
    assert first_groups_rows(ids, 2).tolist() == [True, True, True, False, True, False, False]
    assert first_groups_rows(ids, 0).tolist() == [False] * 7
    assert first_groups_rows(ids, 10).tolist() == [True] * 7
    with pytest.raises(ValueError, match="count=-1"):
        first_groups_rows(ids, -1)
