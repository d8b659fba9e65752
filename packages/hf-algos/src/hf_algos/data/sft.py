"""Supervised fine-tuning data: prompt + target response rows in the engines' batch layout.

The prompt is left-padded and the response right-padded, so the engine's ``log_probs`` are
exactly the target tokens' log-probabilities. With ``loss_mask="all"`` the prompt is trained
on too: the whole text becomes the response, after its first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from hf_algos.data.checks import check_prompt, check_text, require_field
from hf_algos.data.encoding import UNLOCATED, encode_parts
from hf_algos.data.prompts import (
    USE_CHAT_TEMPLATE,
    PromptFormat,
    prompt_text,
    resolve_chat_template,
)
from hf_algos.data.sources import load_parts
from hf_protocol import DataProto, build_prompt_response_batch

if TYPE_CHECKING:  # only types: the config package need not load with the data package
    import datasets

    from hf_algos.config.root import SFTConfig


@dataclass
class _SFTEncoder:
    """Checks an SFT row and names its prompt and target texts (a :class:`RowEncoder`)."""

    tokenizer: PreTrainedTokenizerBase
    prompt_key: str
    response_key: str
    prompt_format: PromptFormat
    max_response_length: int
    loss_on_prompt: bool

    def prepare(self, row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[str, bool]]]:
        """Check ``row``; the prompt goes to ``prompt_ids``, the target to ``response_ids``."""
        key, target = self.prompt_key, self.response_key
        fix = f"give every row a {key!r} prompt and a {target!r} target text"
        prompt = require_field(UNLOCATED, row, key, fix)
        check_prompt(UNLOCATED, key, prompt)
        text = check_text(UNLOCATED, target, row, fix)
        templated = self.prompt_format.use_chat_template
        prompt_str = prompt_text(self.tokenizer, prompt, self.prompt_format)
        return {}, {"prompt_ids": (prompt_str, not templated), "response_ids": (text, False)}

    def finish(self, item: dict[str, Any]) -> dict[str, Any]:
        """EOS after the target, cut to ``max_response_length``; with ``loss_mask="all"``
        the prompt (after its first token) joins the response."""
        prompt = item["prompt_ids"]
        eos = int(self.tokenizer.eos_token_id)
        response = [*item["response_ids"], eos][: self.max_response_length]
        if self.loss_on_prompt:
            prompt, response = prompt[:1], [*prompt[1:], *response]
        return {"prompt_ids": prompt, "response_ids": response}


class SFTDataset:
    """Prompt + response rows tokenized up front (``prompt_key`` / ``response_key``), from
    files, saved dataset directories or a ``datasets.Dataset`` (see :class:`RLDataset`)."""

    def __init__(
        self,
        files: Sequence[str] | datasets.Dataset,
        tokenizer: PreTrainedTokenizerBase,
        config: SFTConfig,
    ) -> None:
        self.pad_token_id = int(tokenizer.pad_token_id)
        data = config.data
        if data.resolved_prompt_format == "few_shot":  # the config refuses it first
            raise ValueError("SFT rows take data.prompt_format auto, chat or raw, not few_shot")
        wanted = USE_CHAT_TEMPLATE[data.resolved_prompt_format]
        prompt_format = PromptFormat(
            resolve_chat_template(tokenizer, wanted),
            dict(data.chat_template_kwargs),
            data.system_prompt,
            data.raw_suffix,
        )
        encoder = _SFTEncoder(
            tokenizer,
            data.prompt_key,
            config.response_key,
            prompt_format,
            config.max_response_length,
            config.loss_mask == "all",
        )
        source = list(files) if isinstance(files, list | tuple) else files
        self.parts = encode_parts(load_parts(source), encoder, data.num_proc)
        self._index = [(p, r) for p, part in enumerate(self.parts) for r in range(len(part.rows))]

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        part, row = self._index[index]
        item = self.parts[part].rows[row]
        return list(item["prompt_ids"]), list(item["response_ids"])

    def collate(self, rows: Sequence[tuple[list[int], list[int]]]) -> DataProto:
        """The engine's layout (:func:`hf_protocol.build_prompt_response_batch`): ``prompts``
        ``(B, P)`` left-padded, ``responses`` / ``response_mask`` ``(B, R)`` right-padded,
        joined ``input_ids`` / ``attention_mask`` / ``position_ids`` ``(B, P + R)``."""
        prompt_ids, response_ids = [p for p, _ in rows], [r for _, r in rows]
        return build_prompt_response_batch(prompt_ids, response_ids, self.pad_token_id)
