"""``RewardModelWorker``: a learned reward model's score of each response.

The reward model is a value-head model (``model.head='value'``) read at the last valid
response token, i.e. after it has seen the whole prompt and response. The score is placed
on that token of ``rm_scores`` (``(B, R)``, zeros elsewhere), like ``token_level_scores``.
"""

from __future__ import annotations

import torch

from hf_controller import register
from hf_engines.config import EngineConfig
from hf_engines.workers.base import ENGINE_DISPATCH, EngineWorker, check_head
from hf_protocol import DataProto, fields

_FIELDS = (fields.INPUT_IDS, fields.ATTENTION_MASK, fields.POSITION_IDS, fields.RESPONSES)


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """Per row, the last position where ``mask`` is 1, or -1 for a row without any.

    Shape: ``(B, R)`` -> ``(B,)`` int64.
    """
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(dim=1).values


def with_score_position(tensors: dict[str, torch.Tensor]) -> DataProto:
    """The batch with one more token after each row's last response token.

    An engine's per-token outputs are read at the positions *predicting* each response
    token, and only where that token is real. A real extra token (pad id, the next
    position id) after the last response token makes output ``t + 1`` of the longer
    response the output *at* token ``t``, in particular at the last one. Causal
    attention keeps the extra token from changing any earlier output. One column is
    appended so that a full-length response has room for it.

    Shape: ``(B, T)`` / ``(B, R)`` fields -> ``(B, T + 1)`` / ``(B, R + 1)``.
    """

    def padded(tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor, tensor.new_zeros((tensor.shape[0], 1))], dim=1)

    response_length = tensors[fields.RESPONSES].shape[1]
    attention_mask = padded(tensors[fields.ATTENTION_MASK])
    position_ids = padded(tensors[fields.POSITION_IDS])
    extra = last_valid_index(tensors[fields.ATTENTION_MASK][:, -response_length:]) + 1
    columns = attention_mask.shape[1] - response_length - 1 + extra
    rows = torch.arange(attention_mask.shape[0])
    attention_mask[rows, columns] = 1
    position_ids[rows, columns] = position_ids[rows, columns - 1] + 1
    responses = padded(tensors[fields.RESPONSES])
    return DataProto.from_dict(
        tensors={
            fields.INPUT_IDS: padded(tensors[fields.INPUT_IDS]),
            fields.ATTENTION_MASK: attention_mask,
            fields.POSITION_IDS: position_ids,
            fields.RESPONSES: responses,
            fields.RESPONSE_MASK: attention_mask[:, -responses.shape[1] :],
        }
    )


def place_on_last_token(token_values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Zeros except, in each row, ``token_values`` at the last position where the mask is 1.

    Rows without any response token stay all zero.

    Shape: ``(B, R)``, ``(B, R)`` -> ``(B, R)`` float32.
    """
    last = last_valid_index(response_mask)
    scores = torch.zeros(response_mask.shape, dtype=torch.float32)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    scores[rows, last[rows]] = token_values[rows, last[rows]].float()
    return scores


class RewardModelWorker(EngineWorker):
    """A value-head engine that never trains; it scores whole responses."""

    def __init__(self, config: EngineConfig) -> None:
        check_head("RewardModelWorker", config, "value")
        super().__init__(config)

    @register(ENGINE_DISPATCH)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` ``(B, R)``: the model's score on the last valid response token."""
        if data.batch is None or any(key not in data.batch for key in _FIELDS):
            raise KeyError(f"compute_rm_score needs the batch fields {_FIELDS}")
        tensors = {key: data.batch[key] for key in _FIELDS}
        response_length = tensors[fields.RESPONSES].shape[1]
        values = self.engine.compute_values(with_score_position(tensors))[:, 1:]
        response_mask = tensors[fields.ATTENTION_MASK][:, -response_length:]
        return DataProto.from_dict(
            tensors={"rm_scores": place_on_last_token(values, response_mask)}
        )
