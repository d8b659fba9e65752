"""A character-level tokenizer built locally (no model hub), with an optional chat template.

Tests and the CPU quickstart need a real ``transformers`` tokenizer without downloading one:
this one maps every printable ASCII character (plus newline) to its own id and has a few
special tokens, so its vocabulary (about 110 ids) fits the tiny models of
``hf_engines.testing`` (vocab 128).
"""

from __future__ import annotations

import os
import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<unk>",
    "<bos>",
    "<eos>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
)
"""Special tokens of :func:`build_char_tokenizer`, in id order (``<pad>`` is id 0)."""

CHAR_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}{% if message['role'] == 'assistant' %}"
    "<eos>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""Chat template of :func:`build_char_tokenizer`: ``<|role|>content`` per message (assistant
turns end with ``<eos>``), then ``<|assistant|>`` when a generation prompt is asked for."""


def build_char_tokenizer(
    directory: str | os.PathLike[str] | None = None,
    chat_template: str | None = CHAR_CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer: one id per printable ASCII character.

    ``chat_template=None`` builds one without a chat template (prompts are then used as raw
    text). When ``directory`` is given the tokenizer is also saved there, so
    ``AutoTokenizer.from_pretrained(directory)`` loads it (e.g. next to a tiny model).
    Ids: special tokens first (``<pad>`` = 0, ``<eos>`` = 3), then ``"\\n"`` and
    ``string.printable``'s visible characters and space.
    """
    characters = ["\n", " "] + [c for c in string.printable if c not in string.whitespace]
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *characters])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Split(".") leaves newlines alone (the regex dot skips them), and they are whole
    # tokens anyway; Fuse joins decoded characters without inserting spaces.
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        additional_special_tokens=list(SPECIAL_TOKENS[4:]),
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(directory)
    return tokenizer
