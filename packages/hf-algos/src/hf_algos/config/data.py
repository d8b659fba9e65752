"""``data``: where prompts come from, how they are cut and how many a step uses.

Each section checks its own values in ``__post_init__``; checks that need several
sections are in :mod:`hf_algos.config.cross_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hf_algos.config.values import require_positive
from hf_controller import ConfigurationError
from hf_engines.config import is_planned
from hf_engines.hub import resolve_model_path


def _expand_user(path: str) -> str:
    """``path`` with a leading ``~`` expanded (data specs such as ``reasoning_gym:`` kept)."""
    return str(Path(path).expanduser()) if path.startswith("~") else path


def check_data_paths(name: str, paths: tuple[str, ...]) -> None:
    """Refuse ``paths`` (the files of config key ``name``) that do not exist and are not
    planned (a packaged example's files), and reasoning-gym specs that cannot be used."""
    specs = [p for p in paths if p.startswith("reasoning_gym:")]
    missing = [p for p in paths if p not in specs and not Path(p).exists() and not is_planned(p)]
    if missing:
        raise ConfigurationError(
            f"{name} lists files that do not exist: {missing}; give paths to local .jsonl, "
            ".json, .parquet or .arrow files or saved dataset directories (relative paths "
            "are taken from the working directory "
            f"{str(Path.cwd())!r}), or 'reasoning_gym:<task>?size=...' specs"
        )
    if specs:  # reasoning_gym is imported only here: it takes seconds
        from hf_algos.data.reasoning_gym import check_reasoning_gym_spec

        for spec in specs:
            try:
                check_reasoning_gym_spec(spec)
            except (ValueError, ImportError) as error:
                raise ConfigurationError(
                    f"{name} lists the reasoning-gym spec {spec!r}, which cannot be used: "
                    f"{error}. Fix the spec (docs/data.md, 'Tasks from reasoning-gym')"
                ) from error


@dataclass(frozen=True)
class DataSection:
    """Where prompts come from and how many a step uses."""

    train_files: tuple[str, ...] = ()
    """Training files (.jsonl / .json / .parquet / .arrow, or a directory written by
    ``datasets.Dataset.save_to_disk``), rows as in docs/data.md, or
    ``reasoning_gym:<task>?size=...`` specs of generated tasks."""
    val_files: tuple[str, ...] = ()
    """Held-out prompt files for validation (greedy decoding); empty disables validation."""
    tokenizer_path: str | None = None
    """A local Hugging Face tokenizer directory or a model id in the local Hugging Face
    cache; ``None`` uses the actor model's."""
    prompt_key: str = "prompt"
    """Column holding the prompt text (or chat messages)."""
    max_prompt_length: int = 64
    """Prompts are left-padded to this many tokens (after the chat template); a longer one
    follows ``overlong_prompts``."""
    overlong_prompts: Literal["error", "drop"] = "error"
    """A prompt longer than ``max_prompt_length`` (DPO: a pair over its limits): ``error``
    stops before training, naming the file, row and length; ``drop`` leaves it out and logs
    how many were dropped (all of them dropped is an error naming the shortest and longest)."""
    train_batch_size: int = 8
    """Prompts per training step (each sampled ``rollout.n`` times)."""
    val_batch_size: int | None = None
    """Prompts per validation batch; ``None`` takes the whole validation set at once."""
    shuffle: bool = True
    """Shuffle the training prompts every epoch (reproducibly, from ``seed``)."""
    seed: int = 0
    """Seed of the shuffling order (and of the choice of few-shot examples)."""
    prompt_format: Literal["auto", "chat", "raw", "few_shot"] = "auto"
    """How a prompt becomes the text the model sees: ``chat``, the tokenizer's chat template
    with a generation prompt (refused before training when the tokenizer has none);
    ``raw``, the prompt's text (chat messages' contents joined by newlines) and
    ``raw_suffix``; ``few_shot``, ``few_shot`` solved examples, then the question (for a base
    model; RL prompts only); ``auto``, ``chat`` when the tokenizer has a chat template, else
    ``raw``. The start of a run says, in one line, which one the prompts take and why."""
    apply_chat_template: bool = True
    """verl's key: ``false`` makes ``prompt_format: auto`` raw text (``prompt_format: chat``
    with ``false`` is refused as a contradiction); ``true`` leaves ``prompt_format`` to
    decide."""
    raw_suffix: str = ""
    """Appended to every raw-text prompt (``raw``, or ``auto`` on a tokenizer without a
    chat template), e.g. ``"\\nAnswer:"``: a cue that a base model answers after."""
    few_shot: int = 0
    """Solved examples before each question under ``prompt_format: few_shot`` (required
    there, >= 1; refused under another format)."""
    few_shot_files: tuple[str, ...] = ()
    """Rows (files or ``reasoning_gym:`` specs, as ``train_files``) the few-shot examples are
    drawn from, seeded by ``seed``; empty: ``few_shot + 1`` rows of ``train_files``, set
    aside (they are never training prompts). A prompt never gets itself as an example.
    The answer of an example row is its ``reward_model.ground_truth``."""
    few_shot_template: str = "Q: {question}\nA: {answer}"
    """One solved example (``{question}`` and ``{answer}``; write a literal brace twice);
    examples are separated by a blank line, and the question asked ends the prompt with an
    empty ``{answer}`` and no trailing whitespace (``Q: ...\\nA:``)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of ``apply_chat_template`` (e.g. ``enable_thinking: false``)."""
    system_prompt: str | None = None
    """Prepended to every prompt as a system message (a row that starts with its own system
    message keeps that one)."""
    num_proc: int = 1
    """Processes that tokenize the dataset (``datasets.Dataset.map(num_proc=...)``)."""

    def __post_init__(self) -> None:
        require_positive("data.num_proc", self.num_proc)
        for name in ("train_files", "val_files"):  # ~/data.jsonl, as a shell would expand it
            paths = tuple(_expand_user(p) for p in getattr(self, name))
            object.__setattr__(self, name, paths)
        check_data_paths("data.train_files", self.train_files)
        check_data_paths("data.val_files", self.val_files)
        if self.tokenizer_path is not None:  # a directory, or an id in the HF cache
            resolve_model_path(self.tokenizer_path, option="data.tokenizer_path")
        require_positive("data.max_prompt_length", self.max_prompt_length)
        require_positive("data.train_batch_size", self.train_batch_size)
        if self.val_batch_size is not None:
            require_positive("data.val_batch_size", self.val_batch_size)
        paths = tuple(_expand_user(p) for p in self.few_shot_files)
        object.__setattr__(self, "few_shot_files", paths)
        check_prompt_format(self)

    @property
    def resolved_prompt_format(self) -> str:
        """``prompt_format`` with verl's ``apply_chat_template: false`` folded in (``auto``
        then means ``raw``); ``auto`` is decided against the tokenizer when data loads."""
        if self.prompt_format == "auto" and not self.apply_chat_template:
            return "raw"
        return self.prompt_format

    @property
    def may_use_chat_template(self) -> bool:
        """Whether prompts can go through the chat template (``chat``, or ``auto`` with
        ``apply_chat_template`` on)."""
        return self.resolved_prompt_format in ("auto", "chat")


def check_prompt_format(data: DataSection) -> None:
    """Refuse ``data``'s prompt-format settings that contradict each other, naming the fix."""
    fmt = data.prompt_format
    if fmt == "chat" and not data.apply_chat_template:
        raise ConfigurationError(
            "data.prompt_format=chat and data.apply_chat_template=false contradict each "
            "other; set data.prompt_format=raw (or few_shot), or drop "
            "data.apply_chat_template=false"
        )
    if fmt == "few_shot" and data.few_shot < 1:
        raise ConfigurationError(
            f"data.prompt_format=few_shot needs data.few_shot >= 1 solved examples per "
            f"prompt (got {data.few_shot}); e.g. data.few_shot=3"
        )
    if fmt != "few_shot" and (data.few_shot or data.few_shot_files):
        raise ConfigurationError(
            f"data.few_shot / data.few_shot_files give examples only under "
            f"data.prompt_format=few_shot (it is {fmt}); set data.prompt_format=few_shot "
            "or leave them out"
        )
    if data.raw_suffix and fmt in ("chat", "few_shot"):
        raise ConfigurationError(
            f"data.raw_suffix is added to raw-text prompts, which data.prompt_format={fmt} "
            "does not make (few_shot ends with data.few_shot_template's cue); leave it out "
            "or set data.prompt_format=raw"
        )
    if fmt == "few_shot":
        check_few_shot_template(data.few_shot_template)
        if not (data.few_shot_files or data.train_files):
            raise ConfigurationError(
                "data.prompt_format=few_shot draws its examples from data.few_shot_files, "
                "else data.train_files, and both are empty; give data.few_shot_files"
            )
        check_data_paths("data.few_shot_files", data.few_shot_files)


def check_few_shot_template(template: str) -> None:
    """Refuse a ``data.few_shot_template`` that does not format with exactly ``{question}``
    and ``{answer}``."""
    import string

    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        template.format(question="", answer="")
    except (ValueError, KeyError, IndexError, AttributeError) as error:
        names = {f"<{type(error).__name__}: {error}>"}
    if names != {"question", "answer"}:
        raise ConfigurationError(
            f"data.few_shot_template={template!r} must hold {{question}} and {{answer}} "
            f"and no other field (found {sorted(names)}); write a literal brace twice, e.g. "
            "'Q: {question}\\nA: {answer}'"
        )
