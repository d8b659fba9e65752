"""Whether a tokenizer has a chat template, read from its directory's files (no tokenizer
load: the config checks use it, before anything starts), and the refusal of
``data.prompt_format=chat`` on a tokenizer without one."""

from __future__ import annotations

import json
from pathlib import Path

from hf_controller import ConfigurationError

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
"""Files that hold a chat template beside ``tokenizer_config.json`` (transformers >= 4.43
writes ``chat_template.jinja``; processors, ``chat_template.json``)."""


def no_chat_template_error(name: str) -> ConfigurationError:
    """The refusal of ``data.prompt_format=chat`` for tokenizer ``name``, which has no chat
    template (a base model's)."""
    return ConfigurationError(
        f"data.prompt_format=chat, but the tokenizer {name} has no chat template (a base "
        "model's tokenizer); set data.prompt_format=raw (the question as is, optionally "
        "with data.raw_suffix) or data.prompt_format=few_shot with data.few_shot=<k>, or "
        "data.tokenizer_path to a tokenizer that has one"
    )


def directory_has_chat_template(directory: str | Path) -> bool | None:
    """Whether the tokenizer saved in ``directory`` has a chat template; ``None`` when the
    files cannot tell (no ``tokenizer_config.json``, e.g. a GGUF file or a directory not
    there yet): the tokenizer, once loaded, decides."""
    path = Path(directory)
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    if any((path / name).is_file() for name in TEMPLATE_FILES):
        return True
    if (path / "additional_chat_templates").is_dir():
        return True
    try:
        values = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return isinstance(values, dict) and bool(values.get("chat_template"))
