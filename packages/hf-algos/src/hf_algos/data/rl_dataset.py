"""The RL prompt dataset: local jsonl/parquet rows, tokenized and length-filtered."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from hf_algos.data.checks import check_prompt, check_reward_fields, require_field
from hf_algos.data.collate import collate_to_dataproto
from hf_algos.data.files import DataError, PathsLike, RowSource, load_located_rows
from hf_algos.data.prompts import encode_prompt, resolve_chat_template
from hf_protocol import DataProto, fields

logger = logging.getLogger(__name__)


OVERLONG_POLICIES = ("error", "drop")
"""What a dataset does with a prompt longer than ``max_prompt_length`` tokens."""


@dataclass
class RLDatasetConfig:
    """How :class:`RLDataset` turns rows into prompts."""

    max_prompt_length: int = 512
    """Longest prompt in tokens (after the chat template); see ``overlong``."""
    prompt_key: str = "prompt"
    """Row field holding the prompt: a string or a list of chat messages."""
    use_chat_template: bool | None = None
    """``None``: use the tokenizer's chat template when it has one; ``False``: raw text."""
    overlong: str = "error"
    """``"error"``: a longer prompt raises, naming its file, row and length; ``"drop"``:
    longer prompts are left out (the count is logged; all of them left out is an error)."""
    require_reward_fields: bool = True
    """Rows must carry ``data_source`` and ``reward_model.ground_truth`` (rule-based
    scoring reads them); ``False`` for a reward-model run, which checks them only if given."""

    def __post_init__(self) -> None:
        if self.max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {self.max_prompt_length}")
        check_overlong_policy("overlong", self.overlong)


def check_overlong_policy(name: str, value: str) -> None:
    """Raise naming ``name`` unless ``value`` is one of :data:`OVERLONG_POLICIES`."""
    if value not in OVERLONG_POLICIES:
        hint = " ('filter' is now called 'drop')" if value == "filter" else ""
        raise ValueError(f"{name} must be one of {OVERLONG_POLICIES}, got {value!r}{hint}")


def overlong_error(source: RowSource, length: int, limit: int, key: str) -> DataError:
    """The error for one prompt of ``length`` tokens over ``limit`` under ``overlong='error'``."""
    return DataError(
        source,
        key,
        f"is {length} tokens long, more than max_prompt_length={limit}",
        "raise data.max_prompt_length, shorten the prompt, or set data.overlong_prompts=drop "
        "to leave such prompts out",
    )


def all_dropped_error(what: str, lengths: Sequence[int], limit: int) -> ValueError:
    """The error when ``overlong='drop'`` left none of ``lengths`` (every one over ``limit``)."""
    return ValueError(
        f"every one of the {len(lengths)} {what} is longer than max_prompt_length={limit} "
        f"tokens (shortest {min(lengths)}, longest {max(lengths)}), so overlong_prompts=drop "
        f"left none; raise data.max_prompt_length to at least {min(lengths)} or shorten the "
        f"prompts"
    )


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
        rows = load_located_rows(data)
        self.rows: list[dict[str, Any]] = []
        self.num_filtered = 0
        limit, lengths = self.config.max_prompt_length, []
        for source, row in rows:
            item = self._encode(source, row)
            lengths.append(len(item[fields.INPUT_IDS]))
            if lengths[-1] <= limit:
                self.rows.append(item)
            elif self.config.overlong == "error":
                raise overlong_error(source, lengths[-1], limit, self.config.prompt_key)
            else:
                self.num_filtered += 1
        if rows and not self.rows:
            raise all_dropped_error("prompts", lengths, limit)
        if self.num_filtered:
            logger.warning(
                "RLDataset: dropped %d of %d prompts longer than max_prompt_length=%d tokens",
                self.num_filtered,
                len(rows),
                limit,
            )

    def _encode(self, source: RowSource, row: dict[str, Any]) -> dict[str, Any]:
        key = self.config.prompt_key
        prompt = require_field(source, row, key, f"give every row a {key!r} (data.prompt_key)")
        check_prompt(source, key, prompt)
        if self.config.require_reward_fields or fields.REWARD_MODEL in row:
            check_reward_fields(source, row)
        item = {k: v for k, v in row.items() if k != key}
        item[fields.RAW_PROMPT] = prompt
        item[fields.INPUT_IDS] = encode_prompt(self.tokenizer, prompt, self.use_chat_template)
        item.setdefault(fields.EXTRA_INFO, {})
        return item

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]

    def collate(self, rows: Sequence[dict[str, Any]]) -> DataProto:
        """A left-padded prompt DataProto of ``rows`` (see :func:`collate_to_dataproto`)."""
        return collate_to_dataproto(rows, self.pad_token_id, self.config.max_prompt_length)
