"""Shared output building: padding helpers, prompt reading, stop masks, the joined output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_protocol import DataProto, left_pad
from hf_rollout import (
    build_output_from_samples,
    build_rollout_output,
    check_prompt_lengths,
    mask_through_first_stop,
    read_prompts,
    stop_ids_for,
)
from hf_rollout.backends.vllm import fit_max_model_len, pad_id_for_dir
from hf_rollout.config import SamplingConfig


def test_read_prompts_accepts_raw_token_lists() -> None:
    raw = DataProto.from_dict(non_tensors={"raw_prompt_ids": [[5, 6], [7, 8, 9]]})
    ids, mask, pos = read_prompts(raw, pad_token_id=1)
    assert ids.tolist() == [[1, 5, 6], [7, 8, 9]]
    assert mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert pos.tolist() == [[0, 0, 1], [0, 1, 2]]


def test_read_prompts_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match=r"need tensor 'input_ids'.*got tensors \['foo'\]"):
        read_prompts(DataProto.from_dict({"foo": torch.zeros(2, 3)}), pad_token_id=0)


def test_prompt_length_errors_name_the_limit() -> None:
    _, mask, _ = left_pad([[3] * 4, [3] * 8], pad_id=0)
    assert check_prompt_lengths(mask, max_model_len=9) == 8
    with pytest.raises(ValueError, match=r"row 1 has 8 tokens, but max_model_len=8"):
        check_prompt_lengths(mask, max_model_len=8)
    with pytest.raises(ValueError, match=r"prompt rows \[0\] have no tokens"):
        check_prompt_lengths(torch.tensor([[0, 0], [1, 1]]), max_model_len=8)


def test_stop_ids_use_model_eos_only_when_unset() -> None:
    assert stop_ids_for(SamplingConfig(stop_token_ids=(7,)), model_eos=[2]) == [2, 7]
    assert stop_ids_for(SamplingConfig(stop_token_ids=(7,), eos_token_id=4), [2]) == [4, 7]


def test_mask_through_first_stop_keeps_the_stop_token() -> None:
    tokens = torch.tensor([[5, 2, 6, 2], [5, 6, 7, 8], [2, 5, 5, 5]])
    assert mask_through_first_stop(tokens, [2]).tolist() == [
        [1, 1, 0, 0],
        [1, 1, 1, 1],
        [1, 0, 0, 0],
    ]


def test_build_rollout_output_joins_and_repeats() -> None:
    prompt_tensors = left_pad([[5, 6], [7]], pad_id=0)
    prompts = DataProto.from_dict(
        tensors=dict(
            zip(("input_ids", "attention_mask", "position_ids"), prompt_tensors, strict=True)
        ),
        non_tensors={"uid": ["a", "b"]},
        meta_info={"step": 3},
    )
    responses = torch.tensor([[10, 11, 99], [12, 99, 99], [13, 14, 15], [16, 17, 99]])
    mask = (responses != 99).long()
    log_probs = torch.full((4, 3), -0.5)
    out = build_rollout_output(prompts, prompt_tensors, responses, mask, log_probs, 2, 0.7, 0)
    assert len(out) == 4
    assert out.batch["prompts"].tolist() == [[5, 6], [5, 6], [0, 7], [0, 7]]
    assert out.batch["responses"][1].tolist() == [12, 0, 0]  # pads become the pad id
    assert out.batch["rollout_log_probs"][1].tolist() == [-0.5, 0.0, 0.0]
    assert out.batch["input_ids"][2].tolist() == [0, 7, 13, 14, 15]
    assert out.batch["attention_mask"][3].tolist() == [0, 1, 1, 1, 0]
    assert out.batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4]
    assert out.batch["position_ids"][2].tolist() == [0, 0, 1, 2, 3]
    assert out.non_tensor_batch["uid"].tolist() == ["a", "a", "b", "b"]
    assert out.meta_info == {"step": 3, "temperature": 0.7}


def test_build_rollout_output_of_no_prompts() -> None:
    prompts = DataProto.from_dict(non_tensors={"uid": np.array([], dtype=object)})
    empty = torch.zeros((0, 0), dtype=torch.long)
    out = build_rollout_output(
        prompts, (empty, empty, empty), empty, empty, empty.float(), 3, 1.0, 0
    )
    assert len(out) == 0 and out.batch["responses"].shape == (0, 0)


def test_build_output_from_samples_pads_ragged_lists() -> None:
    prompt_tensors = left_pad([[5, 6], [7]], pad_id=0)
    prompts = DataProto.from_dict(
        tensors=dict(
            zip(("input_ids", "attention_mask", "position_ids"), prompt_tensors, strict=True)
        )
    )
    samples = [[10, 11], [12], [13, 14, 15], []]
    log_probs = [[-0.1, -0.2], [-0.3], [-0.4, -0.5, -0.6], []]
    sampling = SamplingConfig(n=2, temperature=0.5)
    out = build_output_from_samples(prompts, prompt_tensors, samples, log_probs, sampling, 0)
    assert out.batch["responses"].tolist() == [[10, 11, 0], [12, 0, 0], [13, 14, 15], [0, 0, 0]]
    assert out.batch["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert out.batch["rollout_log_probs"][1].tolist() == pytest.approx([-0.3, 0.0, 0.0])
    assert out.meta_info["temperature"] == 0.5
    empty = build_output_from_samples(
        prompts[:0], tuple(t[:0] for t in prompt_tensors), [], [], sampling, 0
    )
    assert len(empty) == 0 and empty.batch["responses"].shape == (0, 0)


def test_pad_id_for_dir_prefers_config_then_model_then_eos(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"pad_token_id": 7}))
    assert pad_id_for_dir(3, tmp_path, [2]) == 3
    assert pad_id_for_dir(None, tmp_path, [2]) == 7
    (tmp_path / "config.json").write_text(json.dumps({}))
    assert pad_id_for_dir(None, tmp_path, [2, 5]) == 2
    assert pad_id_for_dir(None, tmp_path, []) == 0


def test_fit_max_model_len_caps_at_the_models_positions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    with caplog.at_level("WARNING"):
        assert fit_max_model_len(2048, tmp_path) == 64
    assert "max_model_len=2048" in caplog.text and "max_position_embeddings=64" in caplog.text
    assert fit_max_model_len(32, tmp_path) == 32
    nested = {"text_config": {"max_position_embeddings": 128}}
    (tmp_path / "config.json").write_text(json.dumps(nested))
    assert fit_max_model_len(2048, tmp_path) == 128
    assert fit_max_model_len(2048, tmp_path / "missing") == 2048
