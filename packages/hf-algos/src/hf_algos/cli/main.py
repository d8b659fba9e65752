"""``hybridflow``: run a training job from YAML plus ``key=value`` overrides, or export one.

    hybridflow grpo --config my.yaml actor.engine.optim.lr=1e-6 trainer.n_workers=2
    hybridflow grpo --config-name quickstart          # a config shipped in the package
    hybridflow ppo  --config my.yaml --cfg            # print the resolved config and exit
    hybridflow generate --prompts p.jsonl --output out.jsonl --config-name quickstart
    hybridflow export outputs/hybridflow/run/checkpoints/global_step_100 outputs/model
    hybridflow convert-verl verl.yaml -o grpo.yaml    # a verl config as a native one

Exit codes: 0 done, 2 a configuration error (one message, no traceback), 130 Ctrl-C (SIGINT),
143 SIGTERM (one line each, after the workers stopped: :mod:`hf_algos.cli.signals`),
1 anything else.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

import hf_algos
from hf_algos.cli.convert_verl import add_convert_verl_parser, write_native_config
from hf_algos.cli.early_checks import check_data_early
from hf_algos.cli.help import describe_sections, packaged_configs
from hf_algos.cli.signals import (
    exit_code,
    interruption_message,
    restore_handlers,
    stop_on_signals,
    stop_signal,
    where_stopped,
)
from hf_algos.config import (
    DPOConfig,
    RLConfig,
    SFTConfig,
    VerlKeysNoEffect,
    compose_config,
    instantiate_config,
    merge_config,
    resolve_config,
)
from hf_algos.run_dirs import (
    CHECKPOINT_KEY,
    NOTHING_SAVED,
    check_writable,
    output_directories,
    saves_nothing,
)
from hf_algos.run_lock import RunLock, lock_run_directory
from hf_algos.serve.config import ServeConfig
from hf_algos.trainers.roles.placement import PoolLayout, start_workers_early
from hf_controller import ConfigurationError, start_ray_in_background

CONFIG_DIR = Path(__file__).with_name("configs")
"""The YAML configs shipped in the package (``--config-name NAME`` finds them)."""

EXIT_OK, EXIT_ERROR, EXIT_CONFIG = 0, 1, 2


@dataclass(frozen=True)
class Command:
    """One training subcommand: its root config, its defaults and its trainer."""

    summary: str
    """One line for ``hybridflow --help``."""
    config: type
    """The root config class the YAML is checked against."""
    trainer: str
    """Trainer class name in :mod:`hf_algos.trainers`."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """Values this command sets before the YAML (the YAML and overrides win)."""
    prepare: Callable[[DictConfig], DictConfig] | None = None
    """Fills what the command derives from the merged config (ppo: the critic)."""


def _default_critic(tree: DictConfig) -> DictConfig:
    """PPO without a critic section: a critic built from the actor's model (value head)."""
    if tree.critic is not None or OmegaConf.is_missing(tree, "actor"):
        return tree
    model = OmegaConf.to_container(tree.actor.engine.model, resolve=False)
    return merge_config(tree, {"critic": {"engine": {"model": model}}}, "ppo's default critic")


COMMANDS: dict[str, Command] = {
    "grpo": Command(
        "GRPO (and the critic-free estimators: rloo, reinforce_plus_plus, remax)",
        RLConfig,
        "PPOTrainer",
        {"algorithm": {"adv_estimator": "grpo"}},
    ),
    "ppo": Command(
        "PPO with GAE and a critic (built from the actor's model unless configured)",
        RLConfig,
        "PPOTrainer",
        {"algorithm": {"adv_estimator": "gae"}},
        _default_critic,
    ),
    "dpo": Command(
        "DPO on preference pairs (or online DPO: dpo.online=true)", DPOConfig, "DPOTrainer"
    ),
    "sft": Command("supervised fine-tuning on prompt + response rows", SFTConfig, "SFTTrainer"),
    "eval": Command(
        "evaluate a model or checkpoint on data.val_files: greedy accuracy and, with "
        "trainer.val_samples=k, mean@k, pass@k and maj@k (no training)",
        RLConfig,
        "PPOTrainer",
        {"algorithm": {"adv_estimator": "grpo"}, "trainer": {"val_only": True}},
    ),
}
"""The training subcommands, by name."""

GENERATE = Command(
    "write completions for a file of prompts with a model (greedy, or --samples k)",
    RLConfig,
    "",
    {"algorithm": {"adv_estimator": "grpo"}},
)
"""``hybridflow generate``: a training config's model, prompt format and rollout, no training."""

SERVE = Command(
    "serve the Tinker training API (forward_backward, optim_step, sample, ...) over worker "
    "groups, for the official tinker SDK and tinker-cookbook (docs/serve.md)",
    ServeConfig,
    "",
)
"""``hybridflow serve``: a Tinker-compatible HTTP server (:mod:`hf_algos.serve`)."""

_GRAMMAR = """overrides (after the options, any number; docs/cli.md "Override grammar"):
  key.sub=value      set a key (1e-6, true, null, [a,b], {k: v}, 'quoted text')
  +key.sub=value     add a key inside a free mapping (rollout.engine_kwargs, vars, ...)
  ++key.sub=value    set a key, adding it inside a free mapping if it is not there
  ~key.sub           drop a key: back to its default (removed from a free mapping)
  vars.name=value    a user variable, used as ${vars.name} anywhere in the config
  verl's key paths (actor_rollout_ref.actor.optim.lr, trainer.logger, ...) are accepted
  where they mean the same thing (docs/from-verl.md)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``hybridflow`` argument parser with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="hybridflow",
        description="HybridFlow RL post-training: run a job from YAML + key=value overrides.",
        epilog="`hybridflow <command> --help` lists the config sections of a command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"hybridflow (hf-algos) {hf_algos.__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    for name, command in COMMANDS.items():
        sub = commands.add_parser(
            name,
            help=command.summary,
            description=f"hybridflow {name}: {command.summary}.",
            epilog=(
                f"config sections ({command.config.__name__}, every key: "
                f"docs/configuration.md):\n{describe_sections(command.config)}\n\n{_GRAMMAR}\n\n"
                f"packaged configs (--config-name): {', '.join(packaged_configs(CONFIG_DIR))}"
            ),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _add_config_arguments(sub)
    generate = commands.add_parser(
        "generate",
        help=GENERATE.summary,
        description=f"hybridflow generate: {GENERATE.summary}. The model, the prompt format "
        "and the sampling come from the config (any training config works); rows need only "
        "a prompt. One jsonl line per answer: index, sample, prompt, completion.",
        epilog=_GRAMMAR,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    generate.add_argument(
        "--prompts", required=True, help="a prompt file (.jsonl, .parquet, ...; data.prompt_key)"
    )
    generate.add_argument(
        "--output", required=True, type=Path, help="the jsonl file the answers go to"
    )
    generate.add_argument(
        "--samples",
        type=int,
        default=0,
        help="answers sampled per prompt at rollout.temperature (default: one greedy answer)",
    )
    _add_config_arguments(generate)
    serve = commands.add_parser(
        "serve",
        help=SERVE.summary,
        description=f"hybridflow serve: {SERVE.summary}. Binds serve.host:serve.port "
        "(127.0.0.1:8000); any other address needs the API key in serve.api_key_env.",
        epilog=f"config sections (ServeConfig):\n{describe_sections(ServeConfig)}\n\n{_GRAMMAR}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_config_arguments(serve)
    export = commands.add_parser(
        "export",
        help="turn a training checkpoint into a Hugging Face model directory",
        description="hybridflow export: a checkpoint (FSDP or Megatron) -> save_pretrained dir.",
    )
    export.add_argument("checkpoint_dir", type=Path, help="a global_step_<k> directory")
    export.add_argument("out_dir", type=Path, help="where the Hugging Face directory goes")
    export.add_argument(
        "--dtype", choices=("float32", "bfloat16", "float16"), help="dtype of the saved weights"
    )
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing non-empty out_dir whole (default: refuse it)",
    )
    add_convert_verl_parser(commands, list(COMMANDS))
    return parser


def _add_config_arguments(sub: argparse.ArgumentParser) -> None:
    """The config options and the overrides, shared by the commands that take a config."""
    sub.add_argument("--config", type=Path, help="a YAML config file")
    sub.add_argument("--config-path", type=Path, help="directory of --config-name")
    sub.add_argument("--config-name", help="NAME(.yaml) in --config-path, else a packaged config")
    sub.add_argument(
        "--cfg", action="store_true", help="print the resolved config as YAML and exit"
    )
    sub.add_argument("overrides", nargs="*", help="key=value, +key=value, ~key")


def parse_arguments(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """``argv`` parsed, with overrides allowed on either side of the options
    (``hybridflow grpo a=1 --cfg b=2``), which plain argparse refuses after an option."""
    args, extra = parser.parse_known_args(argv)
    options = [word for word in extra if word.startswith("-")]
    if options or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(options or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def find_config(args: argparse.Namespace) -> Path | None:
    """The YAML file the options name: ``--config``, or ``--config-name`` looked up in
    ``--config-path`` (default: the working directory), then among the packaged configs."""
    if args.config is not None and args.config_name is not None:
        raise ConfigurationError("give --config FILE or --config-name NAME, not both")
    if args.config is not None:
        return Path(args.config)
    if args.config_name is None:
        if args.config_path is not None:
            raise ConfigurationError("--config-path needs --config-name NAME")
        return None
    name = args.config_name if args.config_name.endswith(".yaml") else f"{args.config_name}.yaml"
    candidates = [(args.config_path or Path.cwd()) / name, CONFIG_DIR / name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    packaged = packaged_configs(CONFIG_DIR)
    close = difflib.get_close_matches(name.removesuffix(".yaml"), packaged, n=1)
    raise ConfigurationError(
        f"--config-name {args.config_name!r}: no {name} in {str(candidates[0].parent)!r} nor "
        f"among the packaged configs ({', '.join(packaged)})"
        + (f"; did you mean --config-name {close[0]}?" if close else "")
    )


def compose_command_config(command: Command, args: argparse.Namespace) -> DictConfig:
    """The typed, unresolved config tree of ``command`` (YAML, overrides, the command's
    defaults); light: OmegaConf and the schema, no torch."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", VerlKeysNoEffect)
        tree = compose_config(command.config, find_config(args), args.overrides, command.defaults)
    for warning in caught:  # verl keys with no effect: one plain line, not Python's warning
        if issubclass(warning.category, VerlKeysNoEffect):
            print(f"hybridflow {args.command}: note: {warning.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    return command.prepare(tree) if command.prepare is not None else tree


def load_command_config(
    command: Command, args: argparse.Namespace, tree: DictConfig
) -> tuple[Any, DictConfig]:
    """The validated root config of ``command`` and its resolved tree (printed for ``--cfg``
    once valid), from :func:`compose_command_config`'s ``tree``. Every check runs first,
    writing nothing (:func:`hf_engines.config.dry_checks`); then, except under ``--cfg``, the
    files a packaged example names are made (:mod:`hf_algos.examples.assets`). The checks
    import torch (the advantage registry, the losses)."""
    from hf_algos.examples import make_assets, register_resolvers, requested_assets
    from hf_engines.config import dry_checks

    register_resolvers()  # the packaged configs name their files through them
    with requested_assets() as assets:  # a packaged example's files: named, not yet made
        resolved = resolve_config(tree)
        with dry_checks(assets.paths):  # every check, in seconds, writing nothing
            config: Any = instantiate_config(command.config, tree)
    if args.cfg:
        print(OmegaConf.to_yaml(resolved), end="")
        return config, resolved
    make_assets(assets)
    # built again now that the files exist (and a GGUF model is imported into its cache)
    return instantiate_config(command.config, tree), resolved


def claim_outputs(command: Command, tree: DictConfig) -> RunLock | None:
    """Before Ray starts (:mod:`hf_algos.run_dirs`): every directory the run writes checked
    writable, the checkpoint directory locked for this run (returned; released at the
    end), and one line when nothing of the run will be saved. ``eval`` writes only logs;
    ``generate`` only its ``--output``. A tree that does not resolve yet is left to the
    config checks, which name the problem."""
    from omegaconf.errors import OmegaConfBaseException

    from hf_algos.examples import register_resolvers, requested_assets

    if command is GENERATE:
        return None
    register_resolvers()
    try:
        with requested_assets():  # a packaged example's files: named, not made
            trainer = tree.trainer
            model = OmegaConf.select(tree, "actor.engine.model.path", default=None)
            directories = output_directories(trainer, model)
            val_only, nothing_saved = bool(trainer.val_only), saves_nothing(trainer)
    except OmegaConfBaseException:
        return None
    for key, directory in directories.items():
        if not val_only or key == "trainer.log_dir":
            check_writable(key, directory)
    if val_only:
        return None
    if nothing_saved:
        print(NOTHING_SAVED, flush=True)
    return lock_run_directory(directories[CHECKPOINT_KEY], CHECKPOINT_KEY)


def start_early(tree: DictConfig) -> None:
    """When the run uses Ray: start Ray and then the training pool's worker processes in the
    background, before the config's checks and the trainers import torch, so that Ray's
    start and the workers' own imports overlap the driver's (seconds each on a small
    machine; :mod:`hf_algos.trainers.roles.placement`)."""
    if OmegaConf.select(tree, "trainer.backend") == "ray":
        start_ray_in_background(include_dashboard=bool(tree.trainer.ray_dashboard))
        if tree.trainer.prestart_workers:
            start_workers_early(PoolLayout.of(tree.trainer))


def train(command: Command, config: Any) -> None:
    """Run the trainer to the end; export the final actor where ``trainer.export_dir`` says
    (Ray, when used, is already starting: :func:`start_early`)."""
    from hf_algos import trainers
    from hf_algos.data.tokenizer import load_tokenizer
    from hf_algos.export import atomic_directory

    trainer = getattr(trainers, command.trainer)(config)  # checks; loads the tokenizer
    with trainer.start(), where_stopped(trainer):  # start-up overlapped (Trainer.start_up)
        history = trainer.fit()
        if config.trainer.val_only:
            print_evaluation(history[0], trainer.run_dir)
            return
        export_dir = config.trainer.export_dir
        if export_dir is not None:  # the run's own output: replaced whole, atomically
            with atomic_directory(export_dir, overwrite=True) as tmp:
                trainer.roles.actor.export_hf(str(tmp))
                load_tokenizer(config.data, config.actor).save_pretrained(tmp)
            print(f"hybridflow: model saved to {export_dir}")
    print(where_outputs_are(trainer.checkpoints.latest(), export_dir, trainer.run_dir))


def where_outputs_are(checkpoint: Path | None, export_dir: str | None, logs: Path | None) -> str:
    """The last line of a training run: where its checkpoint, export and logs are."""
    return (
        f"hybridflow: checkpoint: {checkpoint or 'none saved'}; "
        f"model export: {export_dir or 'none (trainer.export_dir)'}; logs: {logs}"
    )


def print_evaluation(metrics: dict[str, float], run_dir: Path | None) -> None:
    """The metrics of ``hybridflow eval`` as a table, and where the generations are."""
    width = max(map(len, metrics), default=0)
    print(f"{'metric':<{width}}  value")
    for name, value in sorted(metrics.items()):
        print(f"{name:<{width}}  {value:.4f}")
    if run_dir is not None:
        print(f"hybridflow: metrics and every greedy generation in {run_dir}")


def check_generate_arguments(args: argparse.Namespace) -> None:
    """Refuse ``generate``'s own bad arguments before anything is composed or made."""
    if args.samples < 0:
        raise ConfigurationError(f"--samples {args.samples}: give 0 (greedy) or a count >= 1")
    if not Path(args.prompts).exists():
        raise ConfigurationError(
            f"the prompt file {args.prompts!r} does not exist (relative paths are taken from "
            f"the working directory {str(Path.cwd())!r})"
        )


def write_completions(args: argparse.Namespace, config: Any) -> None:
    """``hybridflow generate``: answer the prompt file, write the jsonl, say where."""
    from hf_algos.trainers.completions import generate_completions

    lines = generate_completions(config, args.prompts, args.output, args.samples)
    print(f"hybridflow: {lines} completions written to {args.output}")


def export(args: argparse.Namespace) -> None:
    """``hybridflow export``: a checkpoint directory to a Hugging Face directory, written
    atomically (an existing non-empty ``out_dir`` only with ``--overwrite``); says which
    ``global_step`` it exported."""
    from hf_algos.export import (  # the conversion lives beside the trainers
        checkpoint_step,
        export_checkpoint,
        find_engine_checkpoint,
    )

    try:
        role_dir = find_engine_checkpoint(args.checkpoint_dir)
        out = export_checkpoint(role_dir, args.out_dir, args.dtype, overwrite=args.overwrite)
    except FileNotFoundError as error:  # the directory given is no checkpoint: a user error
        raise ConfigurationError(str(error)) from error
    step = checkpoint_step(role_dir)
    print(f"hybridflow: exported global_step {step} ({role_dir.parent}) to {out}")


def run_serve(args: argparse.Namespace) -> None:
    """``hybridflow serve``: the config checked (``--cfg`` prints it), then the server runs
    until stopped."""
    from hf_algos.serve.server import serve

    tree = compose_command_config(SERVE, args)
    config, _ = load_command_config(SERVE, args, tree)
    if not args.cfg:
        serve(config)


def hide_weight_loading_bars() -> None:
    """No "Loading weights" bar from every worker that loads a model (transformers' and
    huggingface_hub's bars, in this process and the workers, which inherit its environment)
    unless the user set ``HF_HUB_DISABLE_PROGRESS_BARS`` (``=0`` shows them)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hybridflow`` console script; returns the exit code."""
    args = parse_arguments(build_parser(), argv)
    lock: RunLock | None = None
    hide_weight_loading_bars()
    previous_handlers = stop_on_signals()
    try:
        if args.command == "export":
            export(args)
            return EXIT_OK
        if args.command == "convert-verl":
            write_native_config(args, COMMANDS[args.target].config)
            return EXIT_OK
        if args.command == "serve":
            run_serve(args)
            return EXIT_OK
        command = GENERATE if args.command == "generate" else COMMANDS[args.command]
        if command is GENERATE:
            check_generate_arguments(args)
        tree = compose_command_config(command, args)
        check_data_early(tree)  # files and their bytes, in well under a second, before Ray
        if not args.cfg:
            lock = claim_outputs(command, tree)
            start_early(tree)
        config, _ = load_command_config(command, args, tree)
        if args.cfg:
            return EXIT_OK
        if command is GENERATE:
            write_completions(args, config)
        else:
            train(command, config)
    except ConfigurationError as error:
        print(f"hybridflow {args.command}: configuration error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except (KeyboardInterrupt, Exception) as error:  # a stop: Ctrl-C or SIGTERM (signals.py)
        signum = stop_signal(error)
        if signum is None:
            traceback.print_exc()
            return EXIT_ERROR
        print(interruption_message(args.command, signum, error), file=sys.stderr)
        return exit_code(signum)
    finally:
        if lock is not None:
            lock.release()
        restore_handlers(previous_handlers)
    return EXIT_OK
