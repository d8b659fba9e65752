"""Preference pairs for DPO: (prompt, chosen, rejected) rows collated as adjacent rows."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from hf_algos.data.checks import check_prompt, check_text, require_field
from hf_algos.data.files import DataError, PathsLike, RowSource, load_located_rows
from hf_algos.data.prompts import encode_prompt, resolve_chat_template
from hf_algos.data.rl_dataset import check_overlong_policy
from hf_protocol import DataProto, build_prompt_response_batch, fields

logger = logging.getLogger(__name__)


@dataclass
class PreferenceDatasetConfig:
    """How :class:`PreferenceDataset` tokenizes pairs."""

    max_prompt_length: int = 512
    """Longest prompt in tokens (after the chat template); see ``overlong``."""
    max_response_length: int = 512
    """Longest chosen / rejected response in tokens (EOS included); see ``overlong``."""
    use_chat_template: bool | None = None
    """``None``: use the tokenizer's chat template when it has one; ``False``: raw text."""
    append_eos: bool = True
    """End each response with the tokenizer's EOS token, as a generated answer would."""
    overlong: str = "error"
    """``"error"``: a pair over either limit raises, naming its file, row, field and length;
    ``"drop"``: such pairs are left out (the count is logged; all left out is an error)."""

    def __post_init__(self) -> None:
        check_overlong_policy("overlong", self.overlong)
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
        rows = load_located_rows(data)
        self.pairs: list[dict[str, Any]] = []
        self.num_filtered = 0
        prompt_lengths = []
        for source, row in rows:
            pair = self._encode(source, row)
            prompt_lengths.append(len(pair["prompt_ids"]))
            too_long = self._overlong(pair)
            if too_long is None:
                self.pairs.append(pair)
            elif self.config.overlong == "error":
                key, length, limit = too_long
                raise DataError(
                    source,
                    key,
                    f"is {length} tokens long, more than the limit of {limit}",
                    "raise data.max_prompt_length / max_response_length, shorten the row, or "
                    "set data.overlong_prompts=drop to leave such pairs out",
                )
            else:
                self.num_filtered += 1
        if rows and not self.pairs:
            raise ValueError(
                f"every one of the {len(rows)} pairs is over max_prompt_length="
                f"{self.config.max_prompt_length} or max_response_length="
                f"{self.config.max_response_length} tokens (prompts {min(prompt_lengths)} to "
                f"{max(prompt_lengths)} tokens), so overlong_prompts=drop left none; raise "
                f"the limits or shorten the rows"
            )
        if self.num_filtered:
            logger.warning(
                "PreferenceDataset: dropped %d of %d pairs over max_prompt_length=%d or "
                "max_response_length=%d tokens",
                self.num_filtered,
                len(rows),
                self.config.max_prompt_length,
                self.config.max_response_length,
            )

    def _encode(self, source: RowSource, row: dict[str, Any]) -> dict[str, Any]:
        fix = "give every pair a 'prompt', a 'chosen' and a 'rejected' response"
        prompt = require_field(source, row, "prompt", fix)
        check_prompt(source, "prompt", prompt)
        return {
            "raw_prompt": prompt,
            "prompt_ids": encode_prompt(self.tokenizer, prompt, self.use_chat_template),
            "chosen_ids": self._encode_response(check_text(source, "chosen", row, fix)),
            "rejected_ids": self._encode_response(check_text(source, "rejected", row, fix)),
        }

    def _encode_response(self, text: str) -> list[int]:
        ids = [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        if self.config.append_eos:
            ids.append(int(self.tokenizer.eos_token_id))
        return ids

    def _overlong(self, pair: dict[str, Any]) -> tuple[str, int, int] | None:
        """The first field over its limit: ``(field, length, limit)``, or ``None``."""
        limits = {
            "prompt": (pair["prompt_ids"], self.config.max_prompt_length),
            "chosen": (pair["chosen_ids"], self.config.max_response_length),
            "rejected": (pair["rejected_ids"], self.config.max_response_length),
        }
        for key, (ids, limit) in limits.items():
            if len(ids) > limit:
                return key, len(ids), limit
        return None

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
