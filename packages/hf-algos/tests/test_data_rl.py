"""RLDataset, collation and the stateful loader, with a real locally built tokenizer."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from hf_algos.data import (
    RLDataset,
    RLDatasetConfig,
    StatefulDataLoader,
    build_char_tokenizer,
    collate_to_dataproto,
    read_rows,
    write_rows,
)
from hf_controller import ConfigurationError
from hf_protocol import DataProto

from .toy_task import make_sort_digits_rows


@pytest.fixture(scope="module")
def chat_tokenizer():  # type: ignore[no-untyped-def]
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def plain_tokenizer():  # type: ignore[no-untyped-def]
    return build_char_tokenizer(chat_template=None)


def _rows() -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": "1+2="}],
            "data_source": "gsm8k",
            "reward_model": {"ground_truth": "3"},
            "extra_info": {"index": 0},
        },
        {
            "prompt": "312=",
            "data_source": "sort_digits",
            "reward_model": {"ground_truth": "123"},
            "extra_info": {"index": 1},
        },
        {
            "prompt": "x" * 40,
            "data_source": "sort_digits",
            "reward_model": {"ground_truth": "long"},
            "extra_info": {"index": 2},
        },
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rows_round_trip_through_files(tmp_path: Path, suffix: str) -> None:
    rows = make_sort_digits_rows(4, length=5, seed=1)
    rows[1]["prompt"] = [
        {"role": "system", "content": "sort"},
        {"role": "user", "content": "x="},
    ]
    if suffix == ".parquet":  # a parquet column holds one type: all prompts as messages
        for row in rows:
            if isinstance(row["prompt"], str):
                row["prompt"] = [{"role": "user", "content": row["prompt"]}]
    path = write_rows(rows, tmp_path / f"data{suffix}")
    assert read_rows(path) == rows
    assert read_rows([path, path]) == rows + rows


def test_read_rows_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.jsonl"):
        read_rows(tmp_path / "x.csv")
    with pytest.raises(ValueError, match=r"write mixed rows as \.jsonl"):
        write_rows(_rows(), tmp_path / "mixed.parquet")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: is not valid JSON"):
        read_rows(bad)


def test_chat_template_applied_and_overlong_filtered(
    tmp_path: Path, chat_tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_rows(_rows(), tmp_path / "data.jsonl")
    with caplog.at_level(logging.WARNING, logger="hf_algos.data.rl_dataset"):
        dataset = RLDataset(
            path, chat_tokenizer, RLDatasetConfig(max_prompt_length=16, overlong_prompts="drop")
        )
    assert len(dataset) == 2 and dataset.num_filtered == 1
    assert "dropped 1 of 3 prompts" in caplog.text
    expected = chat_tokenizer.apply_chat_template(
        [{"role": "user", "content": "312="}], tokenize=False, add_generation_prompt=True
    )
    assert chat_tokenizer.decode(dataset[1]["input_ids"]) == expected
    assert expected.endswith("<|assistant|>")
    assert dataset[1]["raw_prompt"] == "312="


def test_raw_text_without_template_and_error_mode(chat_tokenizer, plain_tokenizer) -> None:
    dataset = RLDataset(_rows()[:2], plain_tokenizer, RLDatasetConfig(max_prompt_length=8))
    assert plain_tokenizer.decode(dataset[0]["input_ids"]) == "1+2="
    forced_raw = RLDataset(_rows()[:2], chat_tokenizer, RLDatasetConfig(use_chat_template=False))
    assert chat_tokenizer.decode(forced_raw[1]["input_ids"]) == "312="
    with pytest.raises(ValueError, match="has no chat template"):
        RLDataset(_rows(), plain_tokenizer, RLDatasetConfig(use_chat_template=True))
    with pytest.raises(ValueError, match="row 2 of the given rows: field 'prompt' is 40 tokens"):
        RLDataset(_rows(), plain_tokenizer, RLDatasetConfig(max_prompt_length=16))


def test_collate_left_pads_with_non_tensors(plain_tokenizer) -> None:
    dataset = RLDataset(_rows()[:2], plain_tokenizer, RLDatasetConfig(max_prompt_length=6))
    batch = dataset.collate([dataset[0], dataset[1]])
    pad = plain_tokenizer.pad_token_id
    assert batch.batch["input_ids"].shape == (2, 6)
    assert batch.batch["input_ids"][0].tolist() == [pad, pad] + plain_tokenizer("1+2=")["input_ids"]
    assert batch.batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1]] * 2
    assert batch.batch["position_ids"][0].tolist() == [0, 0, 0, 1, 2, 3]
    assert list(batch.non_tensor_batch["data_source"]) == ["gsm8k", "sort_digits"]
    assert batch.non_tensor_batch["reward_model"][1] == {"ground_truth": "123"}
    assert batch.non_tensor_batch["raw_prompt"][0] == [{"role": "user", "content": "1+2="}]
    assert batch.non_tensor_batch["extra_info"][1] == {"index": 1}
    uids = batch.non_tensor_batch["uid"]
    assert len(set(uids)) == 2
    repeated = batch.repeat(3, interleave=True)
    assert list(repeated.non_tensor_batch["uid"]) == [uids[0]] * 3 + [uids[1]] * 3
    with pytest.raises(ValueError, match="more than the padded length 3"):
        collate_to_dataproto([dataset[0]], pad, max_prompt_length=3)


def _loader(tokenizer, seed: int = 7) -> StatefulDataLoader:  # type: ignore[no-untyped-def]
    rows = make_sort_digits_rows(10, length=4, seed=0)
    dataset = RLDataset(rows, tokenizer, RLDatasetConfig(max_prompt_length=8))
    return StatefulDataLoader(dataset, batch_size=3, shuffle=True, seed=seed, drop_last=True)


def _ids(batch) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return batch.batch["input_ids"].tolist()


def test_loader_shuffles_per_epoch_and_drops_last(plain_tokenizer) -> None:
    loader = _loader(plain_tokenizer)
    assert len(loader) == 3
    epoch0 = [_ids(b) for b in loader]
    epoch1 = [_ids(b) for b in loader]
    assert len(epoch0) == len(epoch1) == 3
    assert all(len(b) == 3 for b in epoch0)
    assert epoch0 != epoch1
    assert loader.state_dict()["epoch"] == 2
    # The same seed replays the same epochs; rows within an epoch never repeat.
    again = _loader(plain_tokenizer)
    assert [_ids(b) for b in again] == epoch0
    rows = [tuple(r) for b in epoch0 for r in b]
    assert len(set(rows)) == 9


def test_loader_resumes_at_exact_next_batch(plain_tokenizer) -> None:
    reference = _loader(plain_tokenizer)
    expected = [_ids(b) for _ in range(3) for b in reference]
    for stop_after in (1, 3, 5):  # mid-epoch, at an epoch boundary, mid second epoch
        loader = _loader(plain_tokenizer)
        seen: list = []
        state = None
        for _epoch in range(3):
            for batch in loader:
                seen.append(_ids(batch))
                if len(seen) == stop_after:
                    state = json.loads(json.dumps(loader.state_dict()))
                    break
            if state is not None:
                break
        resumed = _loader(plain_tokenizer)
        resumed.load_state_dict(state)
        rest = []
        while len(seen) + len(rest) < len(expected):
            rest.extend(_ids(b) for b in resumed)
        assert seen + rest == expected, f"resume after {stop_after} batches"


def test_loader_next_batch_draws_one_at_a_time_across_epochs(plain_tokenizer) -> None:
    reference = _loader(plain_tokenizer)
    expected = [_ids(b) for _ in range(2) for b in reference]
    loader = _loader(plain_tokenizer)
    drawn = [_ids(loader.next_batch()) for _ in range(4)]  # 3 per epoch: crosses into epoch 1
    assert drawn == expected[:4]
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch_in_epoch"] == 1
    assert [_ids(b) for b in loader] == expected[4:]  # iteration continues after the draws


def test_loader_rejects_mismatched_state(plain_tokenizer) -> None:
    state = _loader(plain_tokenizer).state_dict()
    with pytest.raises(ValueError, match="seed"):
        _loader(plain_tokenizer, seed=8).load_state_dict(state)


def test_loader_resumes_from_a_state_written_before_torchdata(plain_tokenizer) -> None:
    """A checkpoint of hf-algos <= 0.13 holds the position only, without torchdata's state:
    it continues with the same next batch, and is translated into torchdata's own state."""
    reference = _loader(plain_tokenizer)
    expected = [_ids(b) for _ in range(3) for b in reference]
    num_rows = len(reference.dataset)
    for drawn in (1, 3, 5):  # mid-epoch, at an epoch boundary, mid second epoch
        epoch, batch_in_epoch = divmod(drawn, 3)
        old_state = {
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "seed": 7,
            "num_rows": num_rows,
            "batch_size": 3,
        }
        resumed = _loader(plain_tokenizer)
        resumed.load_state_dict(old_state)
        same_place = _loader(plain_tokenizer)
        for _ in range(drawn):
            same_place.next_batch()
        assert resumed.state_dict() == same_place.state_dict(), f"after {drawn} batches"
        rest = [_ids(resumed.next_batch()) for _ in range(len(expected) - drawn)]
        assert rest == expected[drawn:], f"resume after {drawn} batches"


def test_loader_epoch_order_is_the_permutation_seeded_with_seed_plus_epoch(
    plain_tokenizer,  # type: ignore[no-untyped-def]
) -> None:
    """The order every hf-algos version served, so a position saved by any resumes on the
    same rows."""
    loader = _loader(plain_tokenizer, seed=7)
    dataset = loader.dataset
    for epoch in range(2):
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(7 + epoch))
        assert loader.epoch_order(epoch) == order.tolist()
        chunks = [order[b * 3 : (b + 1) * 3].tolist() for b in range(3)]
        expected = [_ids(dataset.collate([dataset[i] for i in chunk])) for chunk in chunks]
        assert [_ids(b) for b in loader] == expected


class _NoRows(list):  # type: ignore[type-arg]
    """A dataset of no rows (a CollatingDataset)."""

    def collate(self, rows: list) -> DataProto:  # type: ignore[type-arg]
        raise AssertionError(f"no batch of an empty dataset should be collated, got {rows}")


def test_loader_refuses_a_batch_size_that_drop_last_leaves_empty(plain_tokenizer) -> None:
    rows = make_sort_digits_rows(2, length=4, seed=0)
    dataset = RLDataset(rows, plain_tokenizer, RLDatasetConfig(max_prompt_length=8))
    with pytest.raises(ConfigurationError, match=r"fewer than batch_size=3.*lower the batch"):
        StatefulDataLoader(dataset, batch_size=3, drop_last=True)
    # (an RLDataset of no rows fails in datasets' map: its error column is never added)
    loader = StatefulDataLoader(_NoRows(), batch_size=3, drop_last=False)
    assert list(loader) == [] and loader.state_dict()["epoch"] == 0
    with pytest.raises(ValueError, match=r"empty.*add data"):
        loader.next_batch()


def test_loader_without_shuffle_keeps_last_partial_batch(plain_tokenizer) -> None:
    rows = make_sort_digits_rows(5, length=4, seed=0)
    dataset = RLDataset(rows, plain_tokenizer, RLDatasetConfig(max_prompt_length=8))
    loader = StatefulDataLoader(dataset, batch_size=2, shuffle=False, drop_last=False)
    batches = list(loader)
    assert [len(b) for b in batches] == [2, 2, 1]
    expected = torch.tensor([dataset[i]["input_ids"] for i in range(5)])
    served = torch.cat([b.batch["input_ids"] for b in batches])
    assert torch.equal(served[:, -expected.shape[1] :], expected)
    assert (served[:, : -expected.shape[1]] == plain_tokenizer.pad_token_id).all()


def test_char_tokenizer_with_its_own_alphabet_and_bos() -> None:
    tokenizer = build_char_tokenizer(
        chat_template=None,
        characters="=abc",
        special_tokens=("<pad>", "<bos>", "<eos>"),
        add_bos_token=True,
        padding_side="left",
    )
    assert len(tokenizer) == 7 and tokenizer.unk_token is None
    assert tokenizer("ab=")["input_ids"] == [1, 4, 5, 3]
    assert tokenizer(["ab=", "a="], padding=True)["input_ids"][1] == [0, 1, 4, 3]
    assert tokenizer.decode([1, 5, 4, 2], skip_special_tokens=True) == "ba"
    with pytest.raises(ValueError, match=r"lack \['<bos>'\]"):
        build_char_tokenizer(special_tokens=("<pad>", "<eos>"), add_bos_token=True)
    with pytest.raises(ValueError, match="must not repeat"):
        build_char_tokenizer(characters="aa")
