"""The RL prompt dataset: rows through ``datasets``, tokenized and length-filtered."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from hf_algos.data.checks import check_prompt, check_reward_fields, require_field
from hf_algos.data.collate import collate_to_dataproto
from hf_algos.data.encoding import UNLOCATED, encode_parts, list_lengths
from hf_algos.data.few_shot import FewShotExamples, draw_examples
from hf_algos.data.files import DataError, PathsLike, RowSource
from hf_algos.data.loader import StatefulDataLoader
from hf_algos.data.prompts import PromptFormat, prompt_options, prompt_text, resolve_chat_template
from hf_algos.data.sources import load_parts, row_count
from hf_protocol import DataProto, fields

if TYPE_CHECKING:
    import datasets

    from hf_algos.config.data import DataSection

logger = logging.getLogger(__name__)


OVERLONG_POLICIES = ("error", "drop")
"""What a dataset does with a prompt longer than ``max_prompt_length`` tokens."""


@dataclass
class RLDatasetConfig:
    """How :class:`RLDataset` turns rows into prompts."""

    max_prompt_length: int = 512
    """Longest prompt in tokens (after the chat template); see ``overlong_prompts``."""
    prompt_key: str = "prompt"
    """Row field holding the prompt: a string or a list of chat messages."""
    use_chat_template: bool | None = None
    """``None``: use the tokenizer's chat template when it has one; ``True``: use it (a
    tokenizer without one is refused); ``False``: raw text (or few-shot text)."""
    raw_suffix: str = ""
    """Appended to each raw-text prompt (e.g. ``"\\nAnswer:"``)."""
    few_shot: FewShotExamples | None = None
    """Solved examples before each question, with ``use_chat_template=False``."""
    held_out: tuple[tuple[int, int], ...] = ()
    """``(file number, row)`` of rows that are not prompts (few-shot examples drawn from
    these rows)."""
    overlong_prompts: str = "error"
    """``"error"``: a longer prompt raises, naming its file, row and length; ``"drop"``:
    longer prompts are left out (the count is logged; all of them left out is an error)."""
    require_reward_fields: bool = True
    """Rows must carry ``data_source`` and ``reward_model.ground_truth`` (rule-based scoring
    by data_source reads them); ``False`` for a reward-model run or one reward function for
    every row (``reward.function_path``), which check them only where given."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of ``apply_chat_template`` (e.g. ``enable_thinking``)."""
    system_prompt: str | None = None
    """Prepended to each prompt as a system message (unless it starts with its own)."""
    num_proc: int = 1
    """Processes tokenizing the rows (``datasets.Dataset.map``)."""

    def __post_init__(self) -> None:
        if self.max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {self.max_prompt_length}")
        check_overlong_policy("overlong_prompts", self.overlong_prompts)
        if self.few_shot is not None and self.use_chat_template is not False:
            raise ValueError("few_shot examples need use_chat_template=False (raw text)")


def check_overlong_policy(name: str, value: str) -> None:
    """Raise naming ``name`` unless ``value`` is one of :data:`OVERLONG_POLICIES`."""
    if value not in OVERLONG_POLICIES:
        hint = " ('filter' is now called 'drop')" if value == "filter" else ""
        raise ValueError(f"{name} must be one of {OVERLONG_POLICIES}, got {value!r}{hint}")


def overlong_error(source: RowSource, length: int, limit: int, key: str) -> DataError:
    """The error for one prompt of ``length`` tokens over ``limit`` under
    ``overlong_prompts='error'``."""
    return DataError(
        source,
        key,
        f"is {length} tokens long, more than max_prompt_length={limit}",
        "raise data.max_prompt_length, shorten the prompt, or set data.overlong_prompts=drop "
        "to leave such prompts out",
    )


def all_dropped_error(what: str, lengths: Sequence[int], limit: int) -> ValueError:
    """The error when ``overlong_prompts='drop'`` left none of ``lengths`` (every one over
    ``limit``)."""
    return ValueError(
        f"every one of the {len(lengths)} {what} is longer than max_prompt_length={limit} "
        f"tokens (shortest {min(lengths)}, longest {max(lengths)}), so overlong_prompts=drop "
        f"left none; raise data.max_prompt_length to at least {min(lengths)} or shorten the "
        f"prompts"
    )


@dataclass
class _PromptEncoder:
    """Checks an RL row and names its prompt text (a :class:`RowEncoder`)."""

    tokenizer: PreTrainedTokenizerBase
    prompt_key: str
    prompt_format: PromptFormat
    require_reward_fields: bool

    def prepare(self, row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[str, bool]]]:
        """Check ``row``; its prompt text goes to ``input_ids``."""
        key = self.prompt_key
        fix = f"give every row a {key!r} (data.prompt_key)"
        prompt = require_field(UNLOCATED, row, key, fix)
        check_prompt(UNLOCATED, key, prompt)
        check_reward_fields(UNLOCATED, row, required=self.require_reward_fields)
        text = prompt_text(self.tokenizer, prompt, self.prompt_format)
        return {}, {fields.INPUT_IDS: (text, not self.prompt_format.use_chat_template)}

    def finish(self, item: dict[str, Any]) -> dict[str, Any]:
        """Nothing to add to the token ids."""
        return item


class RLDataset:
    """Prompts for RL: rows from local files or a saved dataset, tokenized up front.

    ``data`` is one or more ``.jsonl`` / ``.json`` / ``.parquet`` / ``.arrow`` files or
    ``save_to_disk`` directories, a ``datasets.Dataset``, or a list of row dicts. Each row
    holds ``prompt`` (string or chat messages), ``data_source``, ``reward_model``
    (``{"ground_truth": ...}``) and optionally ``extra_info`` (verl's parquet schema).
    Tokenizing runs in ``datasets.Dataset.map`` (``config.num_proc`` processes, cached for
    files). ``dataset[i]`` is a dict with ``input_ids`` (unpadded token list),
    ``raw_prompt`` (the row's prompt) and the row's other fields; :meth:`collate` turns a
    list of them into a DataProto.
    """

    def __init__(
        self,
        data: PathsLike | list[dict[str, Any]] | datasets.Dataset,
        tokenizer: PreTrainedTokenizerBase,
        config: RLDatasetConfig | None = None,
    ) -> None:
        self.config = config = config or RLDatasetConfig()
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has no pad token; set tokenizer.pad_token (e.g. to its eos token)"
            )
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.use_chat_template = resolve_chat_template(tokenizer, config.use_chat_template)
        prompt_format = PromptFormat(
            self.use_chat_template,
            dict(config.chat_template_kwargs),
            config.system_prompt,
            config.raw_suffix,
            config.few_shot,
        )
        encoder = _PromptEncoder(
            tokenizer, config.prompt_key, prompt_format, config.require_reward_fields
        )
        self.parts = encode_parts(load_parts(data), encoder, config.num_proc)
        limit, total = config.max_prompt_length, row_count([p.part for p in self.parts])
        self._index: list[tuple[int, int]] = []
        self.num_filtered = 0
        held_out, all_lengths = set(config.held_out), []
        for number, encoded in enumerate(self.parts):
            lengths = list_lengths(encoded.rows, fields.INPUT_IDS)
            all_lengths.append(lengths)
            over = [i for i in np.flatnonzero(lengths > limit) if (number, int(i)) not in held_out]
            if over and config.overlong_prompts == "error":  # set-aside rows are no prompts
                source = encoded.part.source(int(over[0]))
                raise overlong_error(source, int(lengths[over[0]]), limit, config.prompt_key)
            keep = np.flatnonzero(lengths <= limit)
            self.num_filtered += len(over)
            rows = ((number, int(row)) for row in keep)
            self._index.extend(row for row in rows if row not in held_out)
        if total and not self._index:
            raise all_dropped_error("prompts", np.concatenate(all_lengths).tolist(), limit)
        if self.num_filtered:
            logger.warning(
                "RLDataset: dropped %d of %d prompts longer than max_prompt_length=%d tokens",
                self.num_filtered,
                total - len(held_out),
                limit,
            )

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict[str, Any]:
        part, row = self._index[index]
        item = dict(self.parts[part].rows[row])
        item[fields.RAW_PROMPT] = item.pop(self.config.prompt_key)
        if item.get(fields.EXTRA_INFO) is None:
            item[fields.EXTRA_INFO] = {}
        return item

    def collate(self, rows: Sequence[dict[str, Any]]) -> DataProto:
        """A left-padded prompt DataProto of ``rows`` (see :func:`collate_to_dataproto`)."""
        return collate_to_dataproto(rows, self.pad_token_id, self.config.max_prompt_length)


def rl_dataset(
    data: DataSection,
    files: Sequence[str],
    tokenizer: PreTrainedTokenizerBase,
    require_reward_fields: bool = True,
) -> RLDataset:
    """Tokenized, checked prompts of ``files`` as the ``data`` section says (bad rows raise
    naming file, row and field).

    ``require_reward_fields``: rows must carry ``data_source`` and
    ``reward_model.ground_truth`` (rule-based scoring); ``False`` for a reward-model run.
    """
    few_shot, held_out = few_shot_examples(data, files)
    config = RLDatasetConfig(
        max_prompt_length=data.max_prompt_length,
        prompt_key=data.prompt_key,
        overlong_prompts=data.overlong_prompts,
        require_reward_fields=require_reward_fields,
        few_shot=few_shot,
        held_out=held_out,
        **prompt_options(data),
    )
    return RLDataset(list(files), tokenizer, config)


def few_shot_examples(
    data: DataSection, files: Sequence[str]
) -> tuple[FewShotExamples | None, tuple[tuple[int, int], ...]]:
    """The few-shot examples of ``data`` (``None`` unless ``data.prompt_format=few_shot``)
    and the rows of ``files`` they take out of the prompts: those examples themselves when
    they are drawn from ``files`` (the training rows), else none."""
    if data.prompt_format != "few_shot":
        return None, ()
    source = data.few_shot_files or data.train_files
    same = tuple(files) == tuple(data.train_files) and not data.few_shot_files
    parts = load_parts(list(source))
    examples = draw_examples(
        parts, data.few_shot, data.seed, data.prompt_key, data.few_shot_template, same
    )
    return examples, examples.rows if same else ()


def rl_loader(
    data: DataSection, tokenizer: PreTrainedTokenizerBase, require_reward_fields: bool = True
) -> StatefulDataLoader:
    """The training prompts (``data.train_files``): shuffled per epoch, full batches,
    resumable. (``data.curriculum``'s generated prompts:
    :func:`hf_algos.data.curriculum_loader.curriculum_loader`.)"""
    dataset = rl_dataset(data, data.train_files, tokenizer, require_reward_fields)
    return StatefulDataLoader(dataset, data.train_batch_size, data.shuffle, data.seed)


def val_dataset(
    data: DataSection, tokenizer: PreTrainedTokenizerBase, require_reward_fields: bool = True
) -> tuple[RLDataset, int]:
    """The validation prompts (``data.val_files``) and the batch size to score them in."""
    dataset = rl_dataset(data, data.val_files, tokenizer, require_reward_fields)
    return dataset, data.val_batch_size or len(dataset)
