"""The RL prompt dataset: local jsonl/parquet rows, tokenized and length-filtered."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from hf_algos.data.collate import collate_to_dataproto
from hf_algos.data.files import PathsLike, load_rows
from hf_algos.data.prompts import encode_prompt, resolve_chat_template
from hf_protocol import DataProto, fields

logger = logging.getLogger(__name__)


@dataclass
class RLDatasetConfig:
    """How :class:`RLDataset` turns rows into prompts."""

    max_prompt_length: int = 512
    """Prompts with more tokens (after the chat template) are dropped, or raise (``overlong``)."""
    prompt_key: str = "prompt"
    """Row field holding the prompt: a string or a list of chat messages."""
    use_chat_template: bool | None = None
    """``None``: use the tokenizer's chat template when it has one; ``False``: raw text."""
    overlong: str = "filter"
    """``"filter"`` drops over-long prompts (the count is logged); ``"error"`` raises."""

    def __post_init__(self) -> None:
        if self.max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {self.max_prompt_length}")
        if self.overlong not in ("filter", "error"):
            raise ValueError(f"overlong must be 'filter' or 'error', got {self.overlong!r}")


class RLDataset:
    """Prompts for RL: rows from local ``.jsonl`` / ``.parquet`` files, tokenized up front.

    Each row holds ``prompt`` (string or chat messages), ``data_source``, ``reward_model``
    (``{"ground_truth": ...}``) and optionally ``extra_info``. ``dataset[i]`` is a dict with
    ``input_ids`` (unpadded token list), ``raw_prompt`` (the row's prompt) and the row's
    other fields; :meth:`collate` turns a list of them into a DataProto.
    """

    def __init__(
        self,
        data: PathsLike | list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        config: RLDatasetConfig | None = None,
    ) -> None:
        self.config = config or RLDatasetConfig()
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has no pad token; set tokenizer.pad_token (e.g. to its eos token)"
            )
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.use_chat_template = resolve_chat_template(tokenizer, self.config.use_chat_template)
        rows = load_rows(data)
        self.rows: list[dict[str, Any]] = []
        self.num_filtered = 0
        for index, row in enumerate(rows):
            item = self._encode(index, row)
            if len(item[fields.INPUT_IDS]) <= self.config.max_prompt_length:
                self.rows.append(item)
            elif self.config.overlong == "error":
                raise ValueError(
                    f"row {index} has a {len(item[fields.INPUT_IDS])}-token prompt, more than "
                    f"max_prompt_length={self.config.max_prompt_length}; raise the limit or "
                    f"use overlong='filter'"
                )
            else:
                self.num_filtered += 1
        if self.num_filtered:
            logger.warning(
                "RLDataset: filtered %d of %d prompts longer than max_prompt_length=%d tokens",
                self.num_filtered,
                len(rows),
                self.config.max_prompt_length,
            )

    def _encode(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        key = self.config.prompt_key
        if key not in row:
            raise KeyError(f"row {index} has no {key!r} field (fields: {sorted(row)})")
        item = {k: v for k, v in row.items() if k != key}
        item[fields.RAW_PROMPT] = row[key]
        item[fields.INPUT_IDS] = encode_prompt(self.tokenizer, row[key], self.use_chat_template)
        item.setdefault(fields.EXTRA_INFO, {})
        return item

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]

    def collate(self, rows: Sequence[dict[str, Any]]) -> DataProto:
        """A left-padded prompt DataProto of ``rows`` (see :func:`collate_to_dataproto`)."""
        return collate_to_dataproto(rows, self.pad_token_id, self.config.max_prompt_length)
