"""Tokenizers: a run's tokenizer from its config, and a character-level one built locally.

:func:`load_tokenizer` reads the tokenizer a run trains with (``data.tokenizer_path``, else the
actor's model directory).

:func:`build_char_tokenizer` makes one with no model hub, with an optional chat template: tests
and the CPU quickstart need a real ``transformers`` tokenizer without downloading one. By
default it maps every printable ASCII character (plus newline) to its own id and has a few
special tokens, so its vocabulary (about 110 ids) fits the tiny models of
``hf_engines.testing`` (vocab 128). A caller that wants a smaller vocabulary passes its own
characters and special tokens.
"""

from __future__ import annotations

import os
import string
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

if TYPE_CHECKING:
    from hf_algos.config.actor import ActorSection
    from hf_algos.config.data import DataSection

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

PRINTABLE_CHARACTERS: tuple[str, ...] = (
    "\n",
    " ",
    *(c for c in string.printable if c not in string.whitespace),
)
"""Characters of :func:`build_char_tokenizer` by default, in id order after the special
tokens: newline, space, then ``string.printable``'s visible characters."""

CHAR_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}{% if message['role'] == 'assistant' %}"
    "<eos>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""Chat template of :func:`build_char_tokenizer`: ``<|role|>content`` per message (assistant
turns end with ``<eos>``), then ``<|assistant|>`` when a generation prompt is asked for."""

_NAMED_TOKENS = {
    "<pad>": "pad_token",
    "<unk>": "unk_token",
    "<bos>": "bos_token",
    "<eos>": "eos_token",
}
"""Special tokens with a role in ``transformers`` (the keyword that names each)."""


def build_char_tokenizer(
    directory: str | os.PathLike[str] | None = None,
    chat_template: str | None = CHAR_CHAT_TEMPLATE,
    *,
    characters: Sequence[str] = PRINTABLE_CHARACTERS,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    add_bos_token: bool = False,
    padding_side: Literal["left", "right"] = "right",
) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer: one id per character of ``characters``.

    Ids: ``special_tokens`` first, in order (by default ``<pad>`` = 0, ``<eos>`` = 3), then
    ``characters`` (by default :data:`PRINTABLE_CHARACTERS`). ``special_tokens`` must hold
    ``<pad>`` and ``<eos>``; ``<unk>`` is optional (without it a character outside
    ``characters`` encodes as ``<pad>``). ``add_bos_token`` puts ``<bos>`` in front of every
    encoded text (when ``add_special_tokens`` is true, the default); ``padding_side="left"``
    pads batches on the left, as generation from a batch of prompts needs. ``chat_template=None``
    builds one without a chat template (prompts are then used as raw text); the default
    template needs the ``<|role|>`` special tokens. When ``directory`` is given the
    tokenizer is also saved there, so ``AutoTokenizer.from_pretrained(directory)`` loads it
    (e.g. next to a tiny model).
    """
    required = ["<pad>", "<eos>", *(["<bos>"] if add_bos_token else [])]
    missing = [token for token in required if token not in special_tokens]
    if missing:
        raise ValueError(
            f"special_tokens {tuple(special_tokens)} lack {missing}; add them (padding and "
            "end of sequence always need a token, add_bos_token=True needs <bos>)"
        )
    vocab = {token: index for index, token in enumerate([*special_tokens, *characters])}
    if len(vocab) != len(special_tokens) + len(characters):
        raise ValueError("special_tokens and characters must not repeat a token")
    unknown = "<unk>" if "<unk>" in special_tokens else "<pad>"
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unknown))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Split(".") leaves newlines alone (the regex dot skips them), and they are whole
    # tokens anyway; Fuse joins decoded characters without inserting spaces.
    backend.decoder = decoders.Fuse()
    if add_bos_token:
        backend.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        padding_side=padding_side,
        **{_NAMED_TOKENS[token]: token for token in special_tokens if token in _NAMED_TOKENS},
        additional_special_tokens=[t for t in special_tokens if t not in _NAMED_TOKENS],
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(directory)
    return tokenizer


def load_tokenizer(data: DataSection, actor: ActorSection) -> PreTrainedTokenizerBase:
    """The tokenizer from ``data.tokenizer_path``, else from the actor's model directory; one
    without a pad token pads with its eos token."""
    from transformers import AutoTokenizer

    from hf_engines.hub import resolve_model_path

    model = actor.engine.model
    if data.tokenizer_path is not None:
        path = resolve_model_path(data.tokenizer_path, option="data.tokenizer_path")
    else:
        path = Path(model.local_path() or "")
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
        str(path), local_files_only=True, trust_remote_code=model.trust_remote_code
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
