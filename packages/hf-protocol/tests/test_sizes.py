import pytest

from hf_protocol.sizes import balanced_chunk_sizes, fixed_split_sizes, offsets


def test_ten_rows_on_four_workers_is_three_three_two_two() -> None:
    assert balanced_chunk_sizes(10, 4) == [3, 3, 2, 2]


@pytest.mark.parametrize(("total", "chunks"), [(0, 3), (3, 5), (7, 7), (100, 3), (1, 1)])
def test_balanced_sizes_cover_total_and_differ_by_at_most_one(total: int, chunks: int) -> None:
    sizes = balanced_chunk_sizes(total, chunks)
    assert len(sizes) == chunks
    assert sum(sizes) == total
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_bad_chunk_count_names_the_value(bad: object) -> None:
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(").replace(")", r"\)")):
        balanced_chunk_sizes(10, bad)  # type: ignore[arg-type]


def test_fixed_split_keeps_remainder_last() -> None:
    assert fixed_split_sizes(10, 4) == [4, 4, 2]
    assert fixed_split_sizes(8, 4) == [4, 4]
    assert fixed_split_sizes(0, 4) == []
    with pytest.raises(ValueError, match="split_size"):
        fixed_split_sizes(10, 0)


def test_offsets_are_consecutive() -> None:
    assert offsets([3, 0, 2]) == [(0, 3), (3, 3), (3, 5)]
