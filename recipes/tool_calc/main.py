"""tool_calc: a tiny model learns to multiply 3-digit numbers by calling a calculator.

What it really is, for each of two arms with the same budget:

1. make a tiny random Qwen2 (0.53M parameters), a character tokenizer whose tool tags
   (``<calc>``, ``<result>``, ...) are single tokens, and generated ``a*b=`` prompts with a
   held-out split (nothing downloaded);
2. a short supervised warm-up: the **tool** arm on demonstrations of the episode
   ``a*b=<calc>a*b</calc><eos>`` [calculator: ``<result>P</result>``] ``P<eos>`` (the model's
   turns only are trained on), the **no_tool** arm on as many rows ``a*b=P<eos>``;
3. GRPO, 16 prompts x 8 samples a step, reward 1 for the exact product as the final answer
   else 0. The tool arm's rollouts are multi-turn episodes (``rollout.multi_turn``, the
   ``calculator`` environment): the model's call ends its turn, the environment's reply is
   appended as tokens the policy did not produce (``response_mask`` 0, no loss on them),
   and the model answers in its next turn. The no_tool arm answers in one turn;
4. held-out greedy exact-match accuracy every 10 steps; ``curves.png`` holds both arms'
   curves and the tool arm's tool-call rate.

Run from the repository root (a few minutes on 2 idle CPU cores)::

    python -m recipes.tool_calc.main
    python -m recipes.tool_calc.main arms=[tool] grpo.trainer.total_training_steps=30
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_algos.config import RLConfig, SFTConfig, load_config
from hf_algos.examples.reverse_letters import ModelShape, build_model_dir, read_metrics
from hf_algos.trainers import PPOTrainer
from hf_controller import ConfigurationError
from recipes.cli import parse_recipe_args
from recipes.quickstart.main import load_recipe_config, run_metrics_path, run_sft, stage_config
from recipes.tool_calc.plots import TOOL_CALL_RATE, plot_arms
from recipes.tool_calc.task import TaskConfig, build_tokenizer, write_task_files

CONFIG_PATH = Path(__file__).with_name("config.yaml")
REWARD_PATH = Path(__file__).with_name("reward.py")
ARMS = ("tool", "no_tool")
SFT_FILES = {"tool": "sft_tool", "no_tool": "sft_direct"}


@dataclass(frozen=True)
class ArmResult:
    """What one arm achieved."""

    steps: list[float]
    """GRPO steps at which held-out accuracy was measured (0: after the warm-up)."""
    accuracy: list[float]
    """Held-out greedy exact-match accuracy at each of ``steps``."""
    tool_call_rate: list[float]
    """Share of training episodes with a tool call, per GRPO step (empty without a tool)."""
    seconds: float
    """Wall time of the arm's warm-up and GRPO."""


@dataclass(frozen=True)
class ToolCalcResult:
    """Both arms' results, the figure and the total wall time."""

    arms: dict[str, ArmResult]
    """Arm name (``tool``, ``no_tool``) -> its result."""
    plot: Path
    """PNG of the accuracy curves and the tool-call rate."""
    seconds: float
    """Wall time of the whole run, set-up included."""


def arm_configs(
    raw: dict[str, Any],
    arm: str,
    workdir: Path,
    model_dir: Path,
    files: dict[str, Path],
    grpo_model: Path | None = None,
) -> tuple[SFTConfig, RLConfig]:
    """The warm-up and GRPO configs of ``arm``: the shared ``sft`` / ``grpo`` sections, the
    arm's ``rollout`` keys (YAML section named after the arm) and the recipe's paths. GRPO
    starts from ``grpo_model`` (the warmed-up model; ``model_dir`` until it exists)."""
    if arm not in ARMS:
        raise ConfigurationError(f"unknown arm {arm!r} in arms; choose from {list(ARMS)}")
    logs, checkpoints = workdir / "logs", workdir / "checkpoints"
    sft = stage_config(
        SFTConfig,
        raw["sft"],
        {
            "actor.engine.model.path": model_dir,
            "data.train_files": f"[{files[SFT_FILES[arm]]}]",
            "trainer.log_dir": logs,
            "trainer.checkpoint_dir": checkpoints / f"sft_{arm}",
            "trainer.experiment_name": f"sft_{arm}",
        },
    )
    section = copy.deepcopy(raw["grpo"])
    section["rollout"] = {**section.get("rollout", {}), **raw.get(arm, {})}
    grpo = stage_config(
        RLConfig,
        section,
        {
            "actor.engine.model.path": grpo_model or model_dir,
            "data.train_files": f"[{files['train']}]",
            "data.val_files": f"[{files['val']}]",
            "reward.function_path": REWARD_PATH,
            "trainer.log_dir": logs,
            "trainer.checkpoint_dir": checkpoints / f"grpo_{arm}",
            "trainer.experiment_name": f"grpo_{arm}",
        },
    )
    return sft, grpo


def run_arm(
    raw: dict[str, Any], arm: str, workdir: Path, model_dir: Path, files: dict[str, Path]
) -> list[dict[str, Any]]:
    """Warm up, then GRPO, for one arm; return the GRPO metric records."""
    sft, _ = arm_configs(raw, arm, workdir, model_dir, files)
    warm = run_sft(sft, workdir / f"model_sft_{arm}")
    _, grpo = arm_configs(raw, arm, workdir, model_dir, files, grpo_model=warm)
    with PPOTrainer(grpo) as trainer:
        trainer.fit()
        trainer.roles.actor.export_hf(str(workdir / f"model_grpo_{arm}"))
    return read_metrics(run_metrics_path(grpo))


def run_tool_calc(overrides: Sequence[str] = (), config_path: Path = CONFIG_PATH) -> ToolCalcResult:
    """Run the recipe's arms in turn and return their results (also printed)."""
    started = time.perf_counter()
    raw = load_recipe_config(config_path, overrides)
    workdir = Path(raw["workdir"]).resolve()
    task = load_config(TaskConfig, base=raw.get("task", {}))
    shape = load_config(ModelShape, base=raw.get("model", {}))
    print(f"tool_calc: writing model, tokenizer and task data to {workdir}")
    model_dir = build_model_dir(workdir / "model_init", shape, task.seed, build_tokenizer())
    files = write_task_files(workdir / "data", task)
    # every arm's configs are checked before anything trains: a bad key fails in seconds
    for arm in raw["arms"]:
        arm_configs(raw, arm, workdir, model_dir, files)

    records: dict[str, list[dict[str, Any]]] = {}
    results: dict[str, ArmResult] = {}
    for arm in raw["arms"]:
        print(f"arm {arm}: supervised warm-up, then GRPO")
        arm_started = time.perf_counter()
        records[arm] = run_arm(raw, arm, workdir, model_dir, files)
        rows = records[arm]
        results[arm] = ArmResult(
            steps=[float(r["step"]) for r in rows if "val/accuracy" in r],
            accuracy=[float(r["val/accuracy"]) for r in rows if "val/accuracy" in r],
            tool_call_rate=[float(r[TOOL_CALL_RATE]) for r in rows if TOOL_CALL_RATE in r],
            seconds=time.perf_counter() - arm_started,
        )
        print(f"arm {arm}: held-out accuracy {[round(a, 2) for a in results[arm].accuracy]}")
    plot = plot_arms(records, workdir / "curves.png", "tool_calc: 3-digit products, GRPO")
    result = ToolCalcResult(results, plot, time.perf_counter() - started)
    for arm, arm_result in result.arms.items():
        rate = arm_result.tool_call_rate
        print(
            f"{arm}: accuracy {arm_result.accuracy[0]:.2f} -> {arm_result.accuracy[-1]:.2f}"
            + (f", tool-call rate {rate[0]:.2f} -> {rate[-1]:.2f}" if rate else "")
            + f" ({arm_result.seconds:.0f}s)"
        )
    print(f"curves: {plot} ({result.seconds:.0f}s in total)")
    return result


if __name__ == "__main__":
    args = parse_recipe_args(__doc__, CONFIG_PATH)
    run_tool_calc(args.overrides, args.config)
