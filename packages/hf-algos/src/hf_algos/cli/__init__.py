"""The ``hybridflow`` command: ``grpo``, ``ppo``, ``dpo``, ``sft`` and ``export``."""

from hf_algos.cli.main import COMMANDS, Command, build_parser, main

__all__ = ["COMMANDS", "Command", "build_parser", "main"]
