"""``hybridflow convert-verl OLD.yaml [-o NEW.yaml] [overrides]``: a verl config, once, as ours.

    hybridflow convert-verl verl.yaml -o grpo.yaml trainer.total_epochs=3
    hybridflow grpo --config grpo.yaml --cfg      # the same config as loading verl.yaml

The native file is written to ``-o`` (default: stdout); the notes (verl keys ignored, covered
by one of ours, or computed from several) go to stderr. Torch-free: the config is composed
and its keys checked (:mod:`hf_algos.config.convert_verl`), not built.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_algos.config.convert_verl import convert_verl
from hf_controller import ConfigurationError

NAME = "convert-verl"
"""The subcommand's name."""


def add_convert_verl_parser(commands: Any, targets: Sequence[str]) -> None:
    """Add the ``convert-verl`` subparser to ``commands`` (argparse's subparsers action);
    ``targets``: the commands whose config the file may be for (``--for``)."""
    sub = commands.add_parser(
        NAME,
        help="rewrite a verl YAML config (and verl-style overrides) as a native one",
        description="hybridflow convert-verl: read a config in verl's key paths "
        "(actor_rollout_ref.actor.optim.lr, trainer.logger, ...) plus key=value overrides, "
        "translate the keys once (docs/from-verl.md) and write the keys you set under our "
        "names. Notes on what did not carry over go to stderr; a verl key with no "
        "equivalent is an error naming the key and the fix.",
    )
    sub.add_argument("verl_config", type=Path, help="the verl YAML file")
    sub.add_argument(
        "-o", "--output", type=Path, help="the native YAML file to write (default: stdout)"
    )
    sub.add_argument(
        "--for",
        dest="target",
        choices=targets,
        default="grpo",
        help="the command the config is for, whose schema checks it (default: grpo)",
    )
    sub.add_argument("overrides", nargs="*", help="key=value (verl's or our keys), ~key")


def write_native_config(args: argparse.Namespace, config: type) -> None:
    """Convert ``args.verl_config`` for root config class ``config``; write the YAML to
    ``args.output`` (or stdout) and the notes to stderr."""
    source: Path = args.verl_config
    output: Path | None = args.output
    if output is not None and output.resolve() == source.resolve():
        raise ConfigurationError(
            f"-o {str(output)!r} is the verl config itself; write the native config to "
            "another file (e.g. -o native.yaml)"
        )
    conversion = convert_verl(config, source, args.overrides)
    for note in conversion.notes:
        print(f"hybridflow {NAME}: note: {note}", file=sys.stderr)
    text = conversion.to_yaml(str(source))
    if output is None:
        sys.stdout.write(text)
        return
    output.write_text(text, encoding="utf-8")
    print(
        f"hybridflow {NAME}: wrote {output}; check it with "
        f"`hybridflow {args.target} --config {output} --cfg`",
        file=sys.stderr,
    )
