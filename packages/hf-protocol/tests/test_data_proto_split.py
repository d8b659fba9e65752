"""chunk, split, concat, repeat, reorder and mini-batch iteration."""

from collections.abc import Callable

import numpy as np
import pytest
import torch

from hf_protocol import DataProto
from hf_protocol.testing import assert_dataproto_equal


def test_chunk_ten_into_four_is_balanced_and_ordered(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=10)
    parts = data.chunk(4)
    assert [len(p) for p in parts] == [3, 3, 2, 2]
    assert parts[1].non_tensor_batch["score"].tolist() == [3.0, 4.0, 5.0]
    assert all(p.meta_info == data.meta_info for p in parts)
    assert_dataproto_equal(DataProto.concat(parts), data)


def test_chunk_more_parts_than_rows_gives_empty_tail(make_batch: Callable[..., DataProto]) -> None:
    parts = make_batch(length=3).chunk(5)
    assert [len(p) for p in parts] == [1, 1, 1, 0, 0]
    assert parts[4].batch is not None and parts[4].batch["input_ids"].shape == (0, 4)


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_chunk_rejects_bad_counts(make_batch: Callable[..., DataProto], bad: object) -> None:
    with pytest.raises(ValueError, match=f"got {bad!r}"):
        make_batch().chunk(bad)  # type: ignore[arg-type]


def test_split_keeps_the_remainder_last(make_batch: Callable[..., DataProto]) -> None:
    parts = make_batch(length=10).split(4)
    assert [len(p) for p in parts] == [4, 4, 2]


def test_concat_merges_metrics_into_lists() -> None:
    parts = [
        DataProto.from_dict({"a": torch.zeros(1)}, meta_info={"metrics": {"loss": 1.0}, "step": 2}),
        DataProto.from_dict(
            {"a": torch.ones(2)}, meta_info={"metrics": {"loss": [2.0, 3.0], "kl": 0.1}, "step": 2}
        ),
    ]
    merged = DataProto.concat(parts)
    assert merged.meta_info == {"metrics": {"loss": [1.0, 2.0, 3.0], "kl": [0.1]}, "step": 2}
    assert merged.batch["a"].tolist() == [0.0, 1.0, 1.0]  # type: ignore[index]


def test_concat_rejects_different_keys_and_conflicting_meta(
    make_batch: Callable[..., DataProto],
) -> None:
    a, b = make_batch(length=2), make_batch(length=2)
    b.pop(non_tensor_batch_keys=["tags"])
    with pytest.raises(ValueError, match=r"part 1 has non_tensor_batch keys \['score', 'uid'\]"):
        DataProto.concat([a, b])
    c = make_batch(length=2)
    c.meta_info["temperature"] = 1.0
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] differs between parts"):
        DataProto.concat([a, c])
    with pytest.raises(ValueError, match="empty list"):
        DataProto.concat([])
    no_batch = DataProto.from_dict(non_tensors={k: v for k, v in a.non_tensor_batch.items()})
    with pytest.raises(ValueError, match="tensor batch"):
        DataProto.concat([a, no_batch])


def test_repeat_interleaved_and_tiled(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=3)
    interleaved = data.repeat(2, interleave=True)
    assert interleaved.non_tensor_batch["score"].tolist() == [0, 0, 1, 1, 2, 2]
    tiled = data.repeat(2, interleave=False)
    assert tiled.non_tensor_batch["score"].tolist() == [0, 1, 2, 0, 1, 2]
    assert torch.equal(tiled.batch["input_ids"][3:], data.batch["input_ids"])  # type: ignore[index]
    with pytest.raises(ValueError, match="repeat_times"):
        data.repeat(0)


def test_sample_level_repeat_uses_per_row_counts(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=3)
    out = data.sample_level_repeat(torch.tensor([2, 0, 1]))
    assert out.non_tensor_batch["score"].tolist() == [0, 0, 2]
    with pytest.raises(ValueError, match="one integer count per row"):
        data.sample_level_repeat([1, 2])
    with pytest.raises(ValueError, match=">= 0"):
        data.sample_level_repeat([1, -1, 1])


def test_reorder_is_in_place(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=4)
    ids = data.batch["input_ids"].clone()  # type: ignore[index]
    data.reorder(torch.tensor([3, 2, 1, 0]))
    assert torch.equal(data.batch["input_ids"], ids.flip(0))  # type: ignore[index]
    assert data.non_tensor_batch["score"].tolist() == [3, 2, 1, 0]


def test_make_iterator_covers_every_row_each_epoch(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=10)
    batches = list(data.make_iterator(4, epochs=2, seed=1, dataloader_kwargs={"shuffle": True}))
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    for epoch in (batches[:3], batches[3:]):
        rows = np.concatenate([b.non_tensor_batch["score"] for b in epoch])
        assert sorted(rows.tolist()) == list(range(10))
    first = np.concatenate([b.non_tensor_batch["score"] for b in batches[:3]])
    again = list(data.make_iterator(4, epochs=1, seed=1, dataloader_kwargs={"shuffle": True}))
    assert np.concatenate([b.non_tensor_batch["score"] for b in again]).tolist() == first.tolist()
    assert all(b.meta_info == data.meta_info for b in batches)


def test_make_iterator_in_order_and_drop_last(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=10)
    plain = list(data.make_iterator(4, epochs=1))
    assert plain[0].non_tensor_batch["score"].tolist() == [0, 1, 2, 3]
    dropped = list(data.make_iterator(4, epochs=1, dataloader_kwargs={"drop_last": True}))
    assert [len(b) for b in dropped] == [4, 4]
    with pytest.raises(ValueError, match="num_workers"):
        data.make_iterator(4, epochs=1, dataloader_kwargs={"num_workers": 2})
    with pytest.raises(ValueError, match="epochs"):
        data.make_iterator(4, epochs=0)
    with pytest.raises(ValueError, match="split_size"):
        data.make_iterator(0, epochs=1)


def test_fold_and_unfold_batch_dim(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=6)
    folded = data.fold_batch_dim(2)
    assert len(folded) == 2
    assert folded.batch["input_ids"].shape == (2, 3, 4)  # type: ignore[index]
    assert folded.non_tensor_batch["uid"].shape == (2, 3)
    assert_dataproto_equal(folded.unfold_batch_dim(), data)
    with pytest.raises(
        ValueError, match="new_batch_size=4 must be positive and divide the length 6"
    ):
        data.fold_batch_dim(4)


def test_concat_gathers_metrics_given_as_lists_of_per_worker_dicts() -> None:
    parts = [
        DataProto.from_dict({"a": torch.zeros(1)}, meta_info={"step": 2}),
        DataProto.from_dict(
            {"a": torch.ones(1)}, meta_info={"metrics": [{"loss": 0.5}, {"loss": 0.7}]}
        ),
        DataProto.from_dict({"a": torch.ones(1)}, meta_info={"metrics": {"loss": 0.6, "kl": 1}}),
        DataProto.from_dict({"a": torch.ones(1)}, meta_info={"metrics": None}),
    ]
    merged = DataProto.concat(parts)
    assert merged.meta_info == {"step": 2, "metrics": {"loss": [0.5, 0.7, 0.6], "kl": [1]}}
    bad = DataProto.from_dict({"a": torch.ones(1)}, meta_info={"metrics": [{"loss": 1.0}, 3]})
    with pytest.raises(TypeError, match="list of such dicts"):
        DataProto.concat([parts[0], bad])
