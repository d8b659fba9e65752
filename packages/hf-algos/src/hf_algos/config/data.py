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
    """Seed of the shuffling order."""
    apply_chat_template: bool = True
    """Prompts go through the tokenizer's chat template (with a generation prompt), as verl
    does; a tokenizer without a template gets the raw text (logged). ``false``: raw text
    always (chat messages' contents joined by newlines)."""
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
