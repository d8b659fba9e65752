"""tinker-cookbook's own RL loop (``tinker_cookbook.rl.train.main``) against ``hybridflow serve``.

    python -m recipes.tinker_rl.run [--steps 40] [--config-name serve_smollm2] [serve overrides]

What runs: ``hybridflow serve --config-name serve_smollm2 serve.port=0`` starts as a
subprocess (the Tinker API on this machine for SmolLM2-135M-Instruct, full fine-tuning);
the cookbook's synchronous GRPO-style loop then trains it on reasoning-gym chain_sum
(:mod:`recipes.tinker_rl.chain_sum`) through the official ``tinker`` SDK, exactly as it
would train against the hosted service. Each step samples ``group_size`` answers for each
of ``batch_size`` problems, centres each group's rewards on its mean (the cookbook's
advantage, no std normalisation), and sends one ``forward_backward`` (loss
``importance_sampling``) and one ``optim_step`` (Adam, betas 0.9/0.95). The held-out
accuracy ``test/env/all/correct`` is measured before training, every ``eval_every`` steps
and after the last one (one answer per problem at temperature 1).

The settings mirror the packaged ``smollm2_chain_sum`` GRPO config: 8 problems x 8
answers per step, 32 new tokens, temperature 1.0, learning rate 5e-6 on every weight
(``lora_rank`` 0: the server trains the full model), no KL term, eval every 8 steps.
Metrics go to ``<log-root>/<timestamp>/metrics.jsonl`` (a fresh directory each run: the
cookbook resumes from any directory that already has a checkpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.tinker_rl.chain_sum import ChainSumDatasetBuilder

SERVER_START_TIMEOUT_S = 600.0
"""Longest wait for ``hybridflow serve`` to listen (a first GGUF import takes about a minute)."""
_URL_LINE = re.compile(r"Tinker API on (http://\S+)")


@dataclass(frozen=True)
class RLSettings:
    """The cookbook run's knobs (defaults: the packaged smollm2_chain_sum GRPO config's)."""

    steps: int = 40
    """Training steps (cookbook ``max_steps``)."""
    batch_size: int = 8
    """Problems (groups) per step."""
    group_size: int = 8
    """Answers sampled per problem."""
    max_tokens: int = 32
    """New tokens per answer (training and evaluation)."""
    temperature: float = 1.0
    """Training sampling temperature (the cookbook always evaluates at 1.0)."""
    learning_rate: float = 5e-6
    """Adam learning rate."""
    lora_rank: int = 0
    """0: full fine-tuning (hybridflow serve's reading of rank 0); > 0: a LoRA adapter."""
    loss_fn: str = "importance_sampling"
    """The server-side loss (``stable_reinforce`` needs sampler provenance it lacks)."""
    eval_every: int = 8
    """Steps between held-out evaluations (also one before training and one after)."""
    n_test: int = 64
    """Held-out problems per evaluation."""
    terms: int = 2
    """chain_sum terms per problem."""
    digits: int = 1
    """chain_sum digits per term."""


def serve_config_path(config_name: str) -> Path:
    """The YAML of ``--config-name``: a file path, or a packaged ``hybridflow`` config."""
    from hf_algos.cli.main import CONFIG_DIR

    if Path(config_name).is_file():
        return Path(config_name)
    name = config_name if config_name.endswith(".yaml") else f"{config_name}.yaml"
    path = CONFIG_DIR / name
    if not path.is_file():
        raise SystemExit(f"--config-name {config_name!r}: neither a file nor in {CONFIG_DIR}")
    return path


def served_model(config_path: Path, overrides: Sequence[str]) -> tuple[str, str]:
    """The ``base_model`` name the server answers to and its tokenizer's local directory
    (what the server reports as ``get_info().model_data.tokenizer_id``)."""
    from hf_algos.config import load_config
    from hf_algos.data.tokenizer import load_tokenizer
    from hf_algos.serve.config import ServeConfig

    config = load_config(ServeConfig, config_path, overrides)
    tokenizer = load_tokenizer(config.data, config.actor)
    return config.base_model, str(Path(tokenizer.name_or_path).resolve())


def prepare_cookbook(model_name: str, tokenizer_dir: str) -> None:
    """Make the cookbook work offline: ``model_name`` resolves to the local tokenizer, no
    pricing download, no telemetry; the SDK gets an API key (a loopback server checks none)."""
    from tinker_cookbook import tokenizer_utils
    from tinker_cookbook.utils import cost_estimation

    tokenizer_utils.register_tokenizer(
        model_name, lambda: tokenizer_utils.get_tokenizer(tokenizer_dir)
    )
    # main() fetches a price list from the hosted service's docs site; a self-hosted run
    # has no price, and offline the fetch only costs its 5 s timeout.
    cost_estimation._pricing_fetched = True
    os.environ.setdefault("TINKER_API_KEY", "tml-hybridflow-local")
    os.environ.setdefault("TINKER_TELEMETRY", "0")


def cookbook_config(
    base_url: str, model_name: str, tokenizer_dir: str, log_path: Path, settings: RLSettings
) -> Any:
    """The ``tinker_cookbook.rl.train.Config`` of this recipe (synchronous, on-policy)."""
    from tinker_cookbook.rl.train import Config

    builder = ChainSumDatasetBuilder(
        tokenizer=tokenizer_dir,
        terms=settings.terms,
        digits=settings.digits,
        batch_size=settings.batch_size,
        group_size=settings.group_size,
        n_train=max(2000, settings.steps * settings.batch_size),
        n_test=settings.n_test,
    )
    return Config(
        learning_rate=settings.learning_rate,
        dataset_builder=builder,
        model_name=model_name,
        recipe_name="hybridflow_tinker_rl_chain_sum",
        max_tokens=settings.max_tokens,
        log_path=str(log_path),
        base_url=base_url,
        renderer_name=builder.renderer_name,
        lora_rank=settings.lora_rank,
        loss_fn=settings.loss_fn,  # type: ignore[arg-type]
        temperature=settings.temperature,
        kl_penalty_coef=0.0,
        eval_every=settings.eval_every,
        save_every=0,  # no periodic checkpoints (the cookbook still saves a final one)
        num_groups_to_log=0,
        max_steps=settings.steps,
    )


def train(
    base_url: str, model_name: str, tokenizer_dir: str, log_path: Path, settings: RLSettings
) -> Path:
    """Run the cookbook's ``rl.train.main`` against ``base_url``; its metrics.jsonl path."""
    from tinker_cookbook.rl.train import main as cookbook_main

    if (log_path / "checkpoints.jsonl").exists():
        raise SystemExit(f"{log_path} has a checkpoints.jsonl: the cookbook would resume it")
    prepare_cookbook(model_name, tokenizer_dir)
    config = cookbook_config(base_url, model_name, tokenizer_dir, log_path, settings)
    asyncio.run(cookbook_main(config))
    return log_path / "metrics.jsonl"


@contextlib.contextmanager
def serve_subprocess(config_path: Path, overrides: Sequence[str], log_file: Path) -> Iterator[str]:
    """``hybridflow serve`` for ``config_path`` on a free port, its output in ``log_file``;
    yields its base URL once it listens and interrupts it (sessions ended) on exit."""
    command = [
        sys.executable, "-c", "import sys; from hf_algos.cli import main; sys.exit(main())",
        "serve", "--config", str(config_path), "serve.port=0", *overrides,
    ]  # fmt: skip
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield wait_for_url(process, log_file)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_for_url(process: subprocess.Popen[bytes], log_file: Path) -> str:
    """The base URL ``hybridflow serve`` prints once it listens."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = _URL_LINE.search(log_file.read_text())
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise SystemExit(f"hybridflow serve exited ({process.returncode}); see {log_file}")
        time.sleep(0.2)
    raise SystemExit(f"hybridflow serve did not listen within {SERVER_START_TIMEOUT_S} s")


def summarize(metrics_path: Path) -> str:
    """Held-out accuracy at each evaluation and the mean seconds per training step."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    evals = [
        f"step {row['step']}: {row['test/env/all/correct']:.3f}"
        for row in rows
        if "test/env/all/correct" in row
    ]
    step_s = [row["time/total"] for row in rows if isinstance(row.get("time/total"), float)]
    mean_s = sum(step_s) / len(step_s) if step_s else math.nan
    return (
        f"held-out accuracy (test/env/all/correct): {', '.join(evals)}; "
        f"{mean_s:.1f} s per step over {len(step_s)} steps"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """``--steps``, ``--config-name``, ``--log-root``, ``--base-url`` and serve overrides."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=RLSettings.steps, help="training steps")
    parser.add_argument(
        "--config-name", default="serve_smollm2", help="hybridflow serve config (name or file)"
    )
    parser.add_argument(
        "--log-root", type=Path, default=Path("outputs/tinker_rl"), help="runs go under it"
    )
    parser.add_argument(
        "--base-url", default=None, help="use this running server instead of starting one"
    )
    parser.add_argument("--eval-every", type=int, default=RLSettings.eval_every)
    parser.add_argument("--n-test", type=int, default=RLSettings.n_test)
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the serve config")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Path:
    """Start the server (unless ``--base-url``), run the cookbook loop, say where the
    metrics are; returns the metrics.jsonl path."""
    args = parse_args(argv)
    settings = RLSettings(steps=args.steps, eval_every=args.eval_every, n_test=args.n_test)
    config_path = serve_config_path(args.config_name)
    model_name, tokenizer_dir = served_model(config_path, args.overrides)
    log_path = args.log_root / time.strftime("%Y%m%d-%H%M%S")
    print(f"tinker_rl: cookbook run in {log_path}", flush=True)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        url = args.base_url or stack.enter_context(
            serve_subprocess(config_path, args.overrides, log_path / "serve.log")
        )
        print(f"tinker_rl: server {url} up after {time.monotonic() - started:.0f} s", flush=True)
        metrics = train(url, model_name, tokenizer_dir, log_path, settings)
    print(f"tinker_rl: {summarize(metrics)}")
    print(f"tinker_rl: metrics in {metrics}", flush=True)
    return metrics


if __name__ == "__main__":
    main()
