"""Prompt text from a dataset row: chat template or raw text, then token ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:
    from hf_algos.config.data import DataSection

Messages = list[dict[str, str]]


def as_messages(prompt: str | Sequence[Mapping[str, Any]]) -> Messages:
    """A prompt as chat messages: a string becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages = []
    for index, message in enumerate(prompt):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise ValueError(
                f"prompt message {index} is {message!r:.80}; a chat prompt is a list of "
                f'{{"role": ..., "content": ...}} dicts (or give the prompt as a string)'
            )
        messages.append({"role": str(message["role"]), "content": str(message["content"])})
    return messages


def as_raw_text(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """A prompt as plain text: a string as is, messages' contents joined by newlines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(message["content"] for message in as_messages(prompt))


@dataclass(frozen=True)
class PromptFormat:
    """How a prompt becomes the text the model sees (``data.apply_chat_template``, ...)."""

    use_chat_template: bool = True
    """Render chat messages with the tokenizer's chat template (resolved: the tokenizer has
    one), with a generation prompt; ``False``: raw text."""
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of ``apply_chat_template`` (e.g. ``enable_thinking``)."""
    system_prompt: str | None = None
    """Prepended as a system message unless the prompt starts with one."""


def with_system_prompt(messages: Messages, system_prompt: str | None) -> Messages:
    """``messages`` with ``system_prompt`` as a leading system message (kept as they are
    when there is none, or when they start with their own system message)."""
    if system_prompt is None or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def resolve_chat_template(
    tokenizer: PreTrainedTokenizerBase, use_chat_template: bool | None
) -> bool:
    """Whether prompts go through the chat template: ``None`` means "if the tokenizer has one"."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if use_chat_template is None:
        return has_template
    if use_chat_template and not has_template:
        raise ValueError(
            "use_chat_template=True but the tokenizer has no chat_template; set one on the "
            "tokenizer, or use use_chat_template=None/False for raw-text prompts."
        )
    return use_chat_template


def prompt_text(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str | Sequence[Mapping[str, Any]],
    use_chat_template: bool | PromptFormat,
) -> str:
    """The text the model sees for ``prompt``, ending with the generation prompt if templated."""
    fmt = (
        use_chat_template
        if isinstance(use_chat_template, PromptFormat)
        else PromptFormat(use_chat_template)
    )
    messages = with_system_prompt(as_messages(prompt), fmt.system_prompt)
    if fmt.use_chat_template:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **fmt.chat_template_kwargs
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, not text")
        return text
    return as_raw_text(prompt if fmt.system_prompt is None else messages)


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str | Sequence[Mapping[str, Any]],
    use_chat_template: bool | PromptFormat,
) -> list[int]:
    """Token ids of :func:`prompt_text`.

    A templated text already holds the template's special tokens, so none are added; raw
    text gets the tokenizer's usual ones (e.g. a BOS).
    """
    text = prompt_text(tokenizer, prompt, use_chat_template)
    templated = (
        use_chat_template.use_chat_template
        if isinstance(use_chat_template, PromptFormat)
        else use_chat_template
    )
    ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
    return [int(token) for token in ids]


def prompt_options(data: DataSection) -> dict[str, Any]:
    """The prompt-formatting options of the ``data`` section as the datasets' config fields
    (``data.apply_chat_template=true`` is ``use_chat_template=None``: the tokenizer's
    template when it has one)."""
    return {
        "use_chat_template": None if data.apply_chat_template else False,
        "chat_template_kwargs": dict(data.chat_template_kwargs),
        "system_prompt": data.system_prompt,
        "num_proc": data.num_proc,
    }
