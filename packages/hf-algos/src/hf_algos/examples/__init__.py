"""Small self-contained tasks that the packaged configs train on, and their resolvers.

A packaged config (``hybridflow grpo --config-name quickstart``) cannot point at files that
ship nowhere, so it names what it needs through OmegaConf resolvers that make it on first
use and return its path (an existing one is reused):

* ``${reverse_letters.model:DIR}``: a random-weight tiny Qwen2 and a character tokenizer
  saved to ``DIR``;
* ``${reverse_letters.data:DIR}``: ``train.jsonl``, ``val.jsonl`` and ``sft.jsonl`` of the
  reverse-six-letters task in ``DIR``;
* ``${reverse_letters.reward_file:}``: the path of
  :mod:`hf_algos.examples.reverse_letters_reward` (torch-free, so the reward's scoring
  processes start in a fraction of a second), whose ``compute_reverse_letters_score`` is the
  task's reward.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

__all__ = ["register_resolvers"]


def _model(directory: str) -> str:
    from hf_algos.examples.reverse_letters import ModelShape, build_model_dir

    path = Path(directory)
    if not (path / "config.json").is_file():
        build_model_dir(path, ModelShape(), seed=0)
    return str(path)


def _data(directory: str) -> str:
    from hf_algos.examples.reverse_letters import TaskConfig, write_task_files

    path = Path(directory)
    if not all((path / f"{name}.jsonl").is_file() for name in ("train", "val", "sft")):
        write_task_files(path, TaskConfig())
    return str(path)


def _reward_file() -> str:
    from hf_algos.examples import reverse_letters_reward

    return str(Path(reverse_letters_reward.__file__).resolve())


def register_resolvers() -> None:
    """Register the ``reverse_letters.*`` resolvers with OmegaConf (idempotent)."""
    for name, function in (
        ("reverse_letters.model", _model),
        ("reverse_letters.data", _data),
        ("reverse_letters.reward_file", _reward_file),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_resolver(name, function)
