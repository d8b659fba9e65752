"""Preference pairs for DPO: (prompt, chosen, rejected) rows collated as adjacent rows."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from hf_algos.data.files import PathsLike, load_rows
from hf_algos.data.prompts import encode_prompt, resolve_chat_template
from hf_protocol import DataProto, build_prompt_response_batch, fields

logger = logging.getLogger(__name__)


@dataclass
class PreferenceDatasetConfig:
    """How :class:`PreferenceDataset` tokenizes pairs."""

    max_prompt_length: int = 512
    """Pairs whose prompt has more tokens are dropped (the count is logged)."""
    max_response_length: int = 512
    """Pairs whose chosen or rejected response has more tokens (EOS included) are dropped."""
    use_chat_template: bool | None = None
    """``None``: use the tokenizer's chat template when it has one; ``False``: raw text."""
    append_eos: bool = True
    """End each response with the tokenizer's EOS token, as a generated answer would."""

    def __post_init__(self) -> None:
        if self.max_prompt_length < 1 or self.max_response_length < 1:
            raise ValueError(
                f"max_prompt_length and max_response_length must be >= 1, got "
                f"{self.max_prompt_length} and {self.max_response_length}"
            )


class PreferenceDataset:
    """DPO pairs: local ``.jsonl`` / ``.parquet`` rows of ``prompt``, ``chosen``, ``rejected``.

    ``prompt`` is a string or chat messages (templated with a generation prompt, as in
    :class:`~hf_algos.data.RLDataset`); ``chosen`` and ``rejected`` are response strings.
    :meth:`collate` gives ``2 * B`` rows, pair ``i`` at rows ``2i`` (chosen) and ``2i + 1``
    (rejected), in the engine's batch layout: ``prompts`` (left-padded), ``responses`` and
    ``response_mask`` (right-padded), and ``input_ids`` / ``attention_mask`` /
    ``position_ids`` of prompt + response. Non-tensors: ``uid`` (shared by the two rows of a
    pair), ``is_chosen`` (bool) and ``raw_prompt``.
    """

    def __init__(
        self,
        data: PathsLike | list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        config: PreferenceDatasetConfig | None = None,
    ) -> None:
        self.config = config or PreferenceDatasetConfig()
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token")
        if self.config.append_eos and tokenizer.eos_token_id is None:
            raise ValueError("append_eos=True but the tokenizer has no eos token")
        self.tokenizer = tokenizer
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.use_chat_template = resolve_chat_template(tokenizer, self.config.use_chat_template)
        rows = load_rows(data)
        self.pairs: list[dict[str, Any]] = []
        self.num_filtered = 0
        for index, row in enumerate(rows):
            pair = self._encode(index, row)
            if self._fits(pair):
                self.pairs.append(pair)
            else:
                self.num_filtered += 1
        if self.num_filtered:
            logger.warning(
                "PreferenceDataset: filtered %d of %d pairs over max_prompt_length=%d or "
                "max_response_length=%d tokens",
                self.num_filtered,
                len(rows),
                self.config.max_prompt_length,
                self.config.max_response_length,
            )

    def _encode(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        missing = [key for key in ("prompt", "chosen", "rejected") if key not in row]
        if missing:
            raise KeyError(f"preference row {index} lacks {missing} (fields: {sorted(row)})")
        return {
            "raw_prompt": row["prompt"],
            "prompt_ids": encode_prompt(self.tokenizer, row["prompt"], self.use_chat_template),
            "chosen_ids": self._encode_response(index, "chosen", row["chosen"]),
            "rejected_ids": self._encode_response(index, "rejected", row["rejected"]),
        }

    def _encode_response(self, index: int, key: str, text: Any) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"preference row {index}: {key!r} must be a string, got {text!r:.80}")
        ids = [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        if self.config.append_eos:
            ids.append(int(self.tokenizer.eos_token_id))
        if not ids:
            raise ValueError(f"preference row {index}: {key!r} is empty; a response needs tokens")
        return ids

    def _fits(self, pair: dict[str, Any]) -> bool:
        longest = max(len(pair["chosen_ids"]), len(pair["rejected_ids"]))
        return (
            len(pair["prompt_ids"]) <= self.config.max_prompt_length
            and longest <= self.config.max_response_length
        )

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.pairs[index]

    def collate(self, pairs: Sequence[dict[str, Any]]) -> DataProto:
        """Pairs as ``2 * len(pairs)`` rows, chosen then rejected (see the class docstring)."""
        return collate_preference_pairs(pairs, self.pad_token_id)


def collate_preference_pairs(pairs: Sequence[dict[str, Any]], pad_token_id: int) -> DataProto:
    """Encoded pairs (``prompt_ids``, ``chosen_ids``, ``rejected_ids``) as adjacent rows.

    Prompts are left-padded to the batch's longest prompt and responses right-padded to its
    longest response, so ``input_ids`` has shape ``(2 * B, P + R)``.
    """
    if not pairs:
        raise ValueError("collate_preference_pairs got no pairs")
    prompt_ids = [pair["prompt_ids"] for pair in pairs for _ in range(2)]
    response_ids = [pair[key] for pair in pairs for key in ("chosen_ids", "rejected_ids")]
    uids = [str(uuid.uuid4()) for _ in pairs]
    return build_prompt_response_batch(
        prompt_ids,
        response_ids,
        pad_token_id,
        non_tensors={
            fields.UID: [uid for uid in uids for _ in range(2)],
            fields.IS_CHOSEN: [True, False] * len(pairs),
            fields.RAW_PROMPT: [pair["raw_prompt"] for pair in pairs for _ in range(2)],
        },
        meta_info={fields.TEMPERATURE: 1.0},
    )
