"""``RewardModelWorker``: a learned reward model's score of each response.

The reward model is a value-head model (``model.head='value'``) read at the last valid
response token, i.e. after it has seen the whole prompt and response. The score is placed
on that token of ``rm_scores`` (``(B, R)``, zeros elsewhere), like ``token_level_scores``.
"""

from __future__ import annotations

import torch

from hf_controller import Dispatch, register
from hf_engines.config import EngineConfig
from hf_engines.workers.base import EngineWorker, check_head
from hf_protocol import DataProto

_FIELDS = ("input_ids", "attention_mask", "position_ids", "responses")


def with_one_more_position(tensors: dict[str, torch.Tensor]) -> DataProto:
    """The batch with one masked-out position appended to the sequence and the response.

    An engine's per-token outputs are read at the positions *predicting* each response
    token (one to the left). With one padding position appended, output ``t + 1`` of the
    longer response is the output *at* response token ``t``. The new position is masked
    out, so it changes no other output (causal attention).

    Shape: ``(B, T)`` / ``(B, R)`` fields -> ``(B, T + 1)`` / ``(B, R + 1)``.
    """

    def padded(tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor, tensor.new_zeros((tensor.shape[0], 1))], dim=1)

    positions = tensors["position_ids"]
    attention_mask = padded(tensors["attention_mask"])
    responses = padded(tensors["responses"])
    return DataProto.from_dict(
        tensors={
            "input_ids": padded(tensors["input_ids"]),
            "attention_mask": attention_mask,
            "position_ids": torch.cat([positions, positions[:, -1:] + 1], dim=1),
            "responses": responses,
            "response_mask": attention_mask[:, -responses.shape[1] :],
        }
    )


def place_on_last_token(token_values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Zeros except, in each row, ``token_values`` at the last position where the mask is 1.

    Rows without any response token stay all zero.

    Shape: ``(B, R)``, ``(B, R)`` -> ``(B, R)`` float32.
    """
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values
    scores = torch.zeros(mask.shape, dtype=torch.float32)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    scores[rows, last[rows]] = token_values[rows, last[rows]].float()
    return scores


class RewardModelWorker(EngineWorker):
    """A value-head engine that never trains; it scores whole responses."""

    def __init__(self, config: EngineConfig) -> None:
        check_head("RewardModelWorker", config, "value")
        super().__init__(config)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` ``(B, R)``: the model's score on the last valid response token."""
        if data.batch is None or any(key not in data.batch for key in _FIELDS):
            raise KeyError(f"compute_rm_score needs the batch fields {_FIELDS}")
        tensors = {key: data.batch[key] for key in _FIELDS}
        response_length = tensors["responses"].shape[1]
        values = self.engine.compute_values(with_one_more_position(tensors))[:, 1:]
        response_mask = tensors["attention_mask"][:, -response_length:]
        return DataProto.from_dict(
            tensors={"rm_scores": place_on_last_token(values, response_mask)}
        )
