"""Supervised fine-tuning data: prompt + target response rows in the engines' batch layout.

The prompt is left-padded and the response right-padded, so the engine's ``log_probs`` are
exactly the target tokens' log-probabilities. With ``loss_mask="all"`` the prompt is trained
on too: the whole text becomes the response, after its first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from transformers import PreTrainedTokenizerBase

from hf_algos.data.checks import check_prompt, check_text, require_field
from hf_algos.data.files import read_located_rows
from hf_algos.data.prompts import encode_prompt, resolve_chat_template
from hf_protocol import DataProto, build_prompt_response_batch

if TYPE_CHECKING:  # only the type: the config package need not load with the data package
    from hf_algos.config.trainers import SFTConfig


class SFTDataset:
    """Prompt + response rows tokenized up front (``prompt_key`` / ``response_key``)."""

    def __init__(
        self, files: Sequence[str], tokenizer: PreTrainedTokenizerBase, config: SFTConfig
    ) -> None:
        self.pad_token_id = int(tokenizer.pad_token_id)
        use_template = resolve_chat_template(tokenizer, None)
        self.items: list[tuple[list[int], list[int]]] = []
        key = config.data.prompt_key
        for source, row in read_located_rows(list(files)):
            fix = f"give every row a {key!r} prompt and a {config.response_key!r} target text"
            prompt_value = require_field(source, row, key, fix)
            check_prompt(source, key, prompt_value)
            text = check_text(source, config.response_key, row, fix)
            prompt = encode_prompt(tokenizer, prompt_value, use_template)
            response = tokenizer(text, add_special_tokens=False)["input_ids"]
            response = [*response, int(tokenizer.eos_token_id)][: config.max_response_length]
            if config.loss_mask == "all":
                prompt, response = prompt[:1], [*prompt[1:], *response]
            self.items.append((list(prompt), list(response)))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        return self.items[index]

    def collate(self, rows: Sequence[tuple[list[int], list[int]]]) -> DataProto:
        """The engine's layout (:func:`hf_protocol.build_prompt_response_batch`): ``prompts``
        ``(B, P)`` left-padded, ``responses`` / ``response_mask`` ``(B, R)`` right-padded,
        joined ``input_ids`` / ``attention_mask`` / ``position_ids`` ``(B, P + R)``."""
        prompt_ids, response_ids = [p for p, _ in rows], [r for _, r in rows]
        return build_prompt_response_batch(prompt_ids, response_ids, self.pad_token_id)
