"""PreferenceDataset: pairs collated as adjacent rows in the engine's batch layout."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_algos.data import (
    DataError,
    PreferenceDataset,
    PreferenceDatasetConfig,
    StatefulDataLoader,
    build_char_tokenizer,
    write_rows,
)
from hf_engines.logprob import response_log_probs, response_positions
from hf_engines.testing import build_tiny_model


def _pairs() -> list[dict]:
    return [
        {"prompt": "abc=", "chosen": "cba", "rejected": "abc"},
        {"prompt": [{"role": "user", "content": "hello="}], "chosen": "olleh", "rejected": "x"},
        {"prompt": "q=", "chosen": "y" * 30, "rejected": "n"},
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_pairs_collate_as_adjacent_rows(
    tmp_path: Path, suffix: str, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = build_char_tokenizer()
    rows = _pairs()
    if suffix == ".parquet":  # one type per parquet column
        rows = [
            {
                **r,
                "prompt": r["prompt"]
                if isinstance(r["prompt"], list)
                else [{"role": "user", "content": r["prompt"]}],
            }
            for r in rows
        ]
    path = write_rows(rows, tmp_path / f"pairs{suffix}")
    config = PreferenceDatasetConfig(max_prompt_length=32, max_response_length=10)
    where = r"pairs\.jsonl, line 3" if suffix == ".jsonl" else r"pairs\.parquet, row 2 \(0-based\)"
    with pytest.raises(ValueError, match=where + r": field 'chosen' is 31 tokens long"):
        PreferenceDataset(path, tokenizer, config)  # overlong_prompts="error" is the default
    config = PreferenceDatasetConfig(
        max_prompt_length=32, max_response_length=10, overlong_prompts="drop"
    )
    with caplog.at_level(logging.WARNING, logger="hf_algos.data.preference"):
        dataset = PreferenceDataset(path, tokenizer, config)
    assert len(dataset) == 2 and dataset.num_filtered == 1
    assert "dropped 1 of 3 pairs" in caplog.text
    tight = PreferenceDatasetConfig(max_prompt_length=2, overlong_prompts="drop")
    with pytest.raises(ValueError, match=r"every one of the 3 pairs .* left none"):
        PreferenceDataset(path, tokenizer, tight)

    batch = dataset.collate([dataset[0], dataset[1]])
    assert len(batch) == 4
    t = batch.batch
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    texts = [tokenizer.decode(t["responses"][i][t["response_mask"][i].bool()]) for i in range(4)]
    assert texts == ["cba<eos>", "abc<eos>", "olleh<eos>", "x<eos>"]
    assert t["responses"].shape == (4, 6) and t["responses"][3, 2:].eq(pad).all()
    assert int(t["responses"][0, 3]) == eos
    prompt = tokenizer.decode(
        t["prompts"][0][t["attention_mask"][0, : t["prompts"].shape[1]].bool()]
    )
    assert prompt == "<|user|>abc=<|assistant|>"
    assert torch.equal(t["prompts"][0], t["prompts"][1])
    assert torch.equal(t["input_ids"], torch.cat([t["prompts"], t["responses"]], dim=1))
    assert torch.equal(t["attention_mask"][:, t["prompts"].shape[1] :], t["response_mask"])
    positions = t["position_ids"][2][t["attention_mask"][2].bool()]
    assert positions.tolist() == list(range(len(positions)))
    uids = batch.non_tensor_batch["uid"]
    assert uids[0] == uids[1] != uids[2] == uids[3]
    assert batch.non_tensor_batch["is_chosen"].tolist() == [True, False, True, False]


def test_pair_batch_runs_through_a_real_model(tmp_path: Path) -> None:
    """The collated layout gives per-token log-probs of the responses from a tiny Llama."""
    tokenizer = build_char_tokenizer()
    model_dir = build_tiny_model(tmp_path / "llama", "llama")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    dataset = PreferenceDataset(_pairs()[:2], tokenizer)
    loader = StatefulDataLoader(dataset, batch_size=2, shuffle=False)
    batch = next(iter(loader))
    t = batch.batch
    with torch.no_grad():
        logits = model(
            input_ids=t["input_ids"],
            attention_mask=t["attention_mask"],
            position_ids=t["position_ids"],
        ).logits
    response_len = t["responses"].shape[1]
    log_probs, _ = response_log_probs(response_positions(logits, response_len), t["responses"])
    summed = (log_probs * t["response_mask"]).sum(-1)
    assert summed.shape == (4,) and torch.isfinite(summed).all() and (summed < 0).all()
    # Padding must not change the answer: each row alone, unpadded, gives the same log-prob.
    for row in range(4):
        real = t["input_ids"][row][t["attention_mask"][row].bool()].unsqueeze(0)
        n_response = int(t["response_mask"][row].sum())
        with torch.no_grad():
            alone = model(input_ids=real).logits
        alone_lp, _ = response_log_probs(
            response_positions(alone, n_response), real[:, -n_response:]
        )
        torch.testing.assert_close(alone_lp.sum(), summed[row], atol=1e-4, rtol=1e-4)


def test_bad_rows_are_named() -> None:
    tokenizer = build_char_tokenizer()
    with pytest.raises(DataError, match="row 0 of the given rows: field 'rejected' is missing"):
        PreferenceDataset([{"prompt": "a", "chosen": "b"}], tokenizer)
    with pytest.raises(DataError, match="field 'chosen' has type int"):
        PreferenceDataset([{"prompt": "a", "chosen": 3, "rejected": "b"}], tokenizer)
    with pytest.raises(DataError, match="row 1 of the given rows: field 'prompt' is an empty"):
        PreferenceDataset([_pairs()[0], {"prompt": " ", "chosen": "b", "rejected": "c"}], tokenizer)
