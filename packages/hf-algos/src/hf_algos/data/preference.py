"""Preference pairs for DPO: (prompt, chosen, rejected) rows collated as adjacent rows."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from hf_algos.data.checks import check_prompt, check_text, require_field
from hf_algos.data.encoding import UNLOCATED, EncodedPart, encode_parts, list_lengths
from hf_algos.data.files import DataError, PathsLike
from hf_algos.data.prompts import PromptFormat, prompt_text, resolve_chat_template
from hf_algos.data.rl_dataset import check_overlong_policy
from hf_algos.data.sources import load_parts, row_count
from hf_protocol import DataProto, build_prompt_response_batch, fields

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)


@dataclass
class PreferenceDatasetConfig:
    """How :class:`PreferenceDataset` tokenizes pairs."""

    max_prompt_length: int = 512
    """Longest prompt in tokens (after the chat template); see ``overlong_prompts``."""
    max_response_length: int = 512
    """Longest chosen / rejected response in tokens (EOS included); see ``overlong_prompts``."""
    use_chat_template: bool | None = None
    """``None``: use the tokenizer's chat template when it has one; ``True``: use it (a
    tokenizer without one is refused); ``False``: raw text."""
    raw_suffix: str = ""
    """Appended to each raw-text prompt (e.g. ``"\\nAnswer:"``)."""
    append_eos: bool = True
    """End each response with the tokenizer's EOS token, as a generated answer would."""
    overlong_prompts: str = "error"
    """``"error"``: a pair over either limit raises, naming its file, row, field and length;
    ``"drop"``: such pairs are left out (the count is logged; all left out is an error)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of ``apply_chat_template``."""
    system_prompt: str | None = None
    """Prepended to each prompt as a system message (unless it starts with its own)."""
    num_proc: int = 1
    """Processes tokenizing the rows (``datasets.Dataset.map``)."""

    def __post_init__(self) -> None:
        check_overlong_policy("overlong_prompts", self.overlong_prompts)
        if self.max_prompt_length < 1 or self.max_response_length < 1:
            raise ValueError(
                f"max_prompt_length and max_response_length must be >= 1, got "
                f"{self.max_prompt_length} and {self.max_response_length}"
            )


@dataclass
class _PairEncoder:
    """Checks a preference row and names its three texts (a :class:`RowEncoder`)."""

    tokenizer: PreTrainedTokenizerBase
    prompt_format: PromptFormat
    append_eos: bool

    def prepare(self, row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[str, bool]]]:
        """Check ``row``; texts go to ``prompt_ids``, ``chosen_ids`` and ``rejected_ids``."""
        fix = "give every pair a 'prompt', a 'chosen' and a 'rejected' response"
        prompt = require_field(UNLOCATED, row, "prompt", fix)
        check_prompt(UNLOCATED, "prompt", prompt)
        chosen = check_text(UNLOCATED, "chosen", row, fix)
        rejected = check_text(UNLOCATED, "rejected", row, fix)
        text = prompt_text(self.tokenizer, prompt, self.prompt_format)
        return {}, {
            "prompt_ids": (text, not self.prompt_format.use_chat_template),
            "chosen_ids": (chosen, False),
            "rejected_ids": (rejected, False),
        }

    def finish(self, item: dict[str, Any]) -> dict[str, Any]:
        """The responses end with EOS (``append_eos``)."""
        if self.append_eos:
            eos = int(self.tokenizer.eos_token_id)
            for key in ("chosen_ids", "rejected_ids"):
                item[key] = [*item[key], eos]
        return item


class PreferenceDataset:
    """DPO pairs: rows of ``prompt``, ``chosen``, ``rejected`` (files, saved dataset
    directories, a ``datasets.Dataset`` or a list of dicts, as :class:`RLDataset`).

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
        data: PathsLike | list[dict[str, Any]] | datasets.Dataset,
        tokenizer: PreTrainedTokenizerBase,
        config: PreferenceDatasetConfig | None = None,
    ) -> None:
        self.config = config = config or PreferenceDatasetConfig()
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token")
        if config.append_eos and tokenizer.eos_token_id is None:
            raise ValueError("append_eos=True but the tokenizer has no eos token")
        self.tokenizer = tokenizer
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.use_chat_template = resolve_chat_template(tokenizer, config.use_chat_template)
        prompt_format = PromptFormat(
            self.use_chat_template,
            dict(config.chat_template_kwargs),
            config.system_prompt,
            config.raw_suffix,
        )
        encoder = _PairEncoder(tokenizer, prompt_format, config.append_eos)
        self.parts = encode_parts(load_parts(data), encoder, config.num_proc)
        self._index: list[tuple[int, int]] = []
        prompt_lengths = []
        for number, encoded in enumerate(self.parts):
            keep = self._within_limits(encoded)
            prompt_lengths.extend(list_lengths(encoded.rows, "prompt_ids").tolist())
            self._index.extend((number, int(row)) for row in np.flatnonzero(keep))
        total = row_count([p.part for p in self.parts])
        self.num_filtered = total - len(self._index)
        if total and not self._index:
            raise ValueError(
                f"every one of the {total} pairs is over max_prompt_length="
                f"{config.max_prompt_length} or max_response_length="
                f"{config.max_response_length} tokens (prompts {min(prompt_lengths)} to "
                f"{max(prompt_lengths)} tokens), so overlong_prompts=drop left none; raise "
                f"the limits or shorten the rows"
            )
        if self.num_filtered:
            logger.warning(
                "PreferenceDataset: dropped %d of %d pairs over max_prompt_length=%d or "
                "max_response_length=%d tokens",
                self.num_filtered,
                total,
                config.max_prompt_length,
                config.max_response_length,
            )

    def _within_limits(self, encoded: EncodedPart) -> np.ndarray:
        """Which rows of ``encoded`` fit the limits, shape ``(N,)`` bool; under
        ``overlong_prompts='error'`` the first row over one raises, naming its field."""
        limits = {
            "prompt": self.config.max_prompt_length,
            "chosen": self.config.max_response_length,
            "rejected": self.config.max_response_length,
        }
        lengths = {key: list_lengths(encoded.rows, f"{key}_ids") for key in limits}
        over = np.stack([lengths[key] > limit for key, limit in limits.items()])
        if self.config.overlong_prompts == "error" and over.any():
            row = int(np.flatnonzero(over.any(axis=0))[0])
            key = list(limits)[int(np.flatnonzero(over[:, row])[0])]
            raise DataError(
                encoded.part.source(row),
                key,
                f"is {int(lengths[key][row])} tokens long, more than the limit of {limits[key]}",
                "raise data.max_prompt_length / max_response_length, shorten the row, or "
                "set data.overlong_prompts=drop to leave such pairs out",
            )
        keep: np.ndarray = np.logical_not(over.any(axis=0))
        return keep

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict[str, Any]:
        part, row = self._index[index]
        item = self.parts[part].rows[row]
        return {
            "raw_prompt": item["prompt"],
            **{key: list(item[key]) for key in ("prompt_ids", "chosen_ids", "rejected_ids")},
        }

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
