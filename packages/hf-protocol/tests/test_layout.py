"""The batch layout (padding, position ids, the prompt + response builder) and field names."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from hf_protocol import (
    build_prompt_response_batch,
    continue_position_ids,
    fields,
    left_pad,
    position_ids_from_mask,
    right_pad,
)
from hf_protocol.testing import TINY_DECODER_CONFIGS, tiny_decoder_config


def test_left_pad_builds_masks_and_positions() -> None:
    ids, mask, pos = left_pad([[5, 6, 7], [9]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert ids.dtype == mask.dtype == pos.dtype == torch.int64


def test_left_pad_to_a_width_and_its_errors() -> None:
    prompts = left_pad([[4], []], pad_id=1, width=3)
    assert prompts.input_ids.tolist() == [[1, 1, 4], [1, 1, 1]]
    assert prompts.attention_mask.tolist() == [[0, 0, 1], [0, 0, 0]]
    assert left_pad([], pad_id=0).input_ids.shape == (0, 0)
    with pytest.raises(ValueError, match=r"row 1 has 4 tokens, more than the padded length 3"):
        left_pad([[1], [1, 2, 3, 4]], pad_id=0, width=3)
    with pytest.raises(ValueError, match="width=-1 must be >= 0"):
        left_pad([[1]], pad_id=0, width=-1)


def test_right_pad_pads_values_and_masks() -> None:
    values, mask = right_pad([[0.5, -1.0], [], [2.0]], pad_value=0.0, dtype=torch.float32)
    assert values.tolist() == [[0.5, -1.0], [0.0, 0.0], [2.0, 0.0]]
    assert mask.tolist() == [[1, 1], [0, 0], [1, 0]]
    assert values.dtype == torch.float32 and mask.dtype == torch.int64
    ids, _ = right_pad([[7, 8]], 3, width=4)
    assert ids.tolist() == [[7, 8, 3, 3]] and ids.dtype == torch.int64
    with pytest.raises(ValueError, match="more than the padded length 1"):
        right_pad([[7, 8]], 0, width=1)


def test_position_ids_count_real_tokens_and_continue() -> None:
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 1, 2, 2], [0, 1, 1, 1, 1]]
    assert position_ids_from_mask(mask.bool()).dtype == torch.int64
    prompt_positions = torch.tensor([[0, 0, 1], [0, 1, 2]])
    assert continue_position_ids(prompt_positions, 2).tolist() == [[2, 3], [3, 4]]
    assert continue_position_ids(torch.zeros(2, 0, dtype=torch.long), 3).tolist() == [[0, 1, 2]] * 2


def test_prompt_response_batch_layout() -> None:
    batch = build_prompt_response_batch(
        [[5, 6], [7]],
        [[8], [9, 10, 11]],
        pad_id=0,
        non_tensors={fields.UID: ["a", "b"]},
        meta_info={fields.TEMPERATURE: 1.0},
    )
    tensors = batch.batch
    assert tensors[fields.PROMPTS].tolist() == [[5, 6], [0, 7]]
    assert tensors[fields.RESPONSES].tolist() == [[8, 0, 0], [9, 10, 11]]
    assert tensors[fields.RESPONSE_MASK].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert tensors[fields.INPUT_IDS].tolist() == [[5, 6, 8, 0, 0], [0, 7, 9, 10, 11]]
    assert tensors[fields.ATTENTION_MASK].tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    # Counted over the joined mask: response pads keep the last real position.
    assert tensors[fields.POSITION_IDS].tolist() == [[0, 1, 2, 2, 2], [0, 0, 1, 2, 3]]
    assert all(tensors[key].dtype == torch.int64 for key in tensors.keys())  # noqa: SIM118
    assert batch.non_tensor_batch[fields.UID].tolist() == ["a", "b"]
    assert batch.meta_info == {fields.TEMPERATURE: 1.0}
    wide = build_prompt_response_batch([[5]], [[8]], 0, prompt_width=3, response_width=2)
    assert wide.batch[fields.INPUT_IDS].tolist() == [[0, 0, 5, 8, 0]]


def test_prompt_response_batch_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        build_prompt_response_batch([[1], [2]], [[3]], pad_id=0)
    with pytest.raises(ValueError, match="row 0 has 3 tokens, more than the padded length 2"):
        build_prompt_response_batch([[1]], [[3, 4, 5]], pad_id=0, response_width=2)


def _field_constants() -> list[tuple[str, str, str | None]]:
    """(name, value, docstring) of every constant of hf_protocol.fields, from its source."""
    body = ast.parse(inspect.getsource(fields)).body
    found = []
    for index, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            after = body[index + 1] if index + 1 < len(body) else None
            doc = None
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                doc = str(after.value.value)
            found.append((node.target.id, getattr(fields, node.target.id), doc))
    return found


def test_every_field_is_documented_and_unique() -> None:
    constants = _field_constants()
    public = {name for name in vars(fields) if name.isupper()}
    assert {name for name, _, _ in constants} == public
    undocumented = [name for name, _, doc in constants if not doc or len(doc) < 40]
    assert not undocumented, f"fields without a docstring: {undocumented}"
    values = [value for _, value, _ in constants]
    assert len(values) == len(set(values)), "two constants name the same field"
    # verl's names: the constant is the upper-cased value.
    assert all(name == value.upper() for name, value, _ in constants)
    for name in ("INPUT_IDS", "RESPONSE_MASK", "TOKEN_LEVEL_SCORES", "UID", "METRICS"):
        assert name in public


def test_tiny_decoder_configs_are_plain_dicts() -> None:
    assert set(TINY_DECODER_CONFIGS) == {"llama", "qwen2", "qwen3", "qwen3_moe", "gemma3"}
    config = tiny_decoder_config("qwen3", head_dim=16)
    assert config["head_dim"] == 16 and TINY_DECODER_CONFIGS["qwen3"]["head_dim"] == 8
    with pytest.raises(ValueError, match="unknown tiny model family 'gpt9'"):
        tiny_decoder_config("gpt9")


def test_save_tiny_model_is_seeded_and_leaves_the_rng_alone(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="hf-protocol alone does not install it")
    from safetensors.torch import load_file

    from hf_protocol.testing import save_tiny_model

    state = torch.random.get_rng_state()
    first = save_tiny_model(tmp_path / "a", tiny_decoder_config("qwen2"), seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    second = save_tiny_model(tmp_path / "b", tiny_decoder_config("qwen2"), seed=3)
    other = save_tiny_model(tmp_path / "c", tiny_decoder_config("qwen2"), seed=4)
    weights = [load_file(path / "model.safetensors") for path in (first, second, other)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert any(not torch.equal(weights[0][k], weights[2][k]) for k in weights[0])
