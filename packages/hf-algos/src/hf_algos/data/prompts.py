"""Prompt text from a dataset row: chat template, raw text or few-shot text, then token ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from hf_algos.data.few_shot import FewShotExamples, question_text, system_text
from hf_algos.data.template_check import no_chat_template_error

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
    raw_suffix: str = ""
    """Appended to a raw-text prompt (``data.raw_suffix``)."""
    few_shot: FewShotExamples | None = None
    """Without the chat template: solved examples before the question (``few_shot``)."""


def with_system_prompt(messages: Messages, system_prompt: str | None) -> Messages:
    """``messages`` with ``system_prompt`` as a leading system message (kept as they are
    when there is none, or when they start with their own system message)."""
    if system_prompt is None or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether ``tokenizer`` has a chat template."""
    return getattr(tokenizer, "chat_template", None) is not None


def resolve_chat_template(
    tokenizer: PreTrainedTokenizerBase, use_chat_template: bool | None
) -> bool:
    """Whether prompts go through the chat template: ``None`` means "if the tokenizer has
    one"; ``True`` on a tokenizer without one raises :func:`no_chat_template_error`."""
    has_template = has_chat_template(tokenizer)
    if use_chat_template is None:
        return has_template
    if use_chat_template and not has_template:
        raise no_chat_template_error(str(getattr(tokenizer, "name_or_path", "") or "given"))
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
    if fmt.few_shot is not None:
        return fmt.few_shot.render(question_text(prompt), system_text(prompt, fmt.system_prompt))
    return as_raw_text(prompt if fmt.system_prompt is None else messages) + fmt.raw_suffix


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


USE_CHAT_TEMPLATE = {"auto": None, "chat": True, "raw": False, "few_shot": False}
"""``data.prompt_format`` (resolved: :attr:`DataSection.resolved_prompt_format`) as the
datasets' ``use_chat_template``: ``None`` is "the tokenizer's template when it has one"."""


def prompt_options(data: DataSection) -> dict[str, Any]:
    """The prompt-formatting options of the ``data`` section as the datasets' config fields
    (few-shot examples are drawn by :func:`hf_algos.data.rl_dataset.rl_dataset`)."""
    return {
        "use_chat_template": USE_CHAT_TEMPLATE[data.resolved_prompt_format],
        "chat_template_kwargs": dict(data.chat_template_kwargs),
        "system_prompt": data.system_prompt,
        "raw_suffix": data.raw_suffix,
        "num_proc": data.num_proc,
    }


def prompt_format_line(data: DataSection, tokenizer: PreTrainedTokenizerBase) -> str:
    """The one log line saying which format the run's prompts take and why; raises
    :func:`no_chat_template_error` for ``data.prompt_format=chat`` on a tokenizer without
    a chat template."""
    name = str(getattr(tokenizer, "name_or_path", "") or data.tokenizer_path or "given")
    fmt, has_template = data.resolved_prompt_format, has_chat_template(tokenizer)
    setting = f"data.prompt_format={data.prompt_format}"
    if fmt == "raw" and data.prompt_format == "auto":
        setting += ", data.apply_chat_template=false"
    suffix = f" + data.raw_suffix {data.raw_suffix!r}" if data.raw_suffix else ""
    if fmt == "chat" and not has_template:
        raise no_chat_template_error(name)
    if fmt in ("chat", "auto") and has_template:
        what, why = "chat-templated", f"tokenizer {name} has a chat template"
        why += "; data.raw_suffix is not used" if suffix else ""
    elif fmt == "auto":
        what, why = f"raw text{suffix}", f"tokenizer {name} has no chat template"
    elif fmt == "raw":
        what, why = f"raw text{suffix}", "asked for"
    else:
        source = ", ".join(data.few_shot_files or data.train_files)
        what = f"few-shot: {data.few_shot} solved examples, then the question"
        why = f"examples drawn from {source} (seed {data.seed})"
    return f"data: prompts are {what}: {why} ({setting})"


def announce_prompt_format(data: DataSection, tokenizer: PreTrainedTokenizerBase) -> str:
    """Print (and return) :func:`prompt_format_line` at the start of a run: before any
    data loads, so ``data.prompt_format=chat`` on a tokenizer without a chat template
    stops the run within seconds."""
    line = prompt_format_line(data, tokenizer)
    print(line, flush=True)
    return line
