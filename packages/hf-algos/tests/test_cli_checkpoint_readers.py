"""``hybridflow eval`` and ``hybridflow generate`` on a trained checkpoint, as a user runs
them after training: they read the checkpoint, answer from its actor, and write only their
own outputs (a new run directory for eval, the ``--output`` file for generate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_cli import FAST, _task, hybridflow

pytestmark = pytest.mark.timeout(600)

TASK = [
    "data.train_batch_size=4",
    "data.max_prompt_length=4",
    "rollout.n=4",
    "rollout.max_new_tokens=4",
    "actor.ppo_mini_batch_size=16",
    "trainer.loggers=[jsonl]",
    "trainer.log_dir=logs",
    "trainer.checkpoint_dir=ckpt",
    *FAST,
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A directory with a 2-step GRPO run (checkpoint ``ckpt/global_step_2``, export
    ``final``) and the overrides naming its model, data and reward."""
    root = tmp_path_factory.mktemp("trained")
    model, data, reward = _task(root)
    named = [
        f"actor.engine.model.path={model}",
        f"data.train_files=[{data}]",
        f"data.val_files=[{data}]",
        f"reward.function_path={reward}",
    ]
    run = hybridflow(
        "grpo",
        *named,
        *TASK,
        "actor.engine.optim.lr=1e-2",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "trainer.export_dir=final",
        cwd=root,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (root / "ckpt" / "global_step_2").is_dir() and (root / "final").is_dir()
    return root, named


def _files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def test_eval_of_a_checkpoint_leaves_the_training_run_untouched(
    trained: tuple[Path, list[str]],
) -> None:
    root, named = trained
    (training_run,) = (root / "logs").glob("*/*/*")
    logs_before, checkpoints_before = _files(training_run), _files(root / "ckpt")
    run = hybridflow(
        "eval",
        *named,
        *TASK,
        "trainer.resume_mode=path",
        "trainer.resume_from=ckpt/global_step_2",
        cwd=root,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert _files(training_run) == logs_before  # config.yaml and metrics.jsonl byte-identical
    assert _files(root / "ckpt") == checkpoints_before
    eval_dir = root / run.stdout.rsplit("every greedy generation in ", 1)[1].strip()
    assert eval_dir != training_run and eval_dir.parent == training_run.parent
    assert eval_dir.name.endswith("-eval")
    (record,) = [json.loads(line) for line in (eval_dir / "metrics.jsonl").open()]
    assert "val/accuracy" in record
    assert "val_only: true" in (eval_dir / "config.yaml").read_text()


def _generate(root: Path, named: list[str], *overrides: str) -> list[str]:
    """The greedy completions of the training prompts, with ``overrides``."""
    output = root / "answers.jsonl"
    output.unlink(missing_ok=True)
    data = next(o.split("[", 1)[1].rstrip("]") for o in named if o.startswith("data.train"))
    run = hybridflow(
        "generate", "--prompts", data, "--output", str(output), *named, *TASK, *overrides,
        "rollout.max_new_tokens=8", cwd=root,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads(line)["completion"] for line in output.read_text().splitlines()]


def test_generate_answers_with_the_checkpoint_it_is_given(
    trained: tuple[Path, list[str]],
) -> None:
    root, named = trained
    checkpoints_before = _files(root / "ckpt")
    base = _generate(root, named, "trainer.resume_mode=disable")
    from_checkpoint = _generate(
        root, named, "trainer.resume_mode=path", "trainer.resume_from=ckpt/global_step_2"
    )
    model = next(o for o in named if o.startswith("actor.engine.model.path="))
    named_final = [o for o in named if o != model] + [f"actor.engine.model.path={root / 'final'}"]
    from_export = _generate(root, named_final, "trainer.resume_mode=disable")
    assert from_checkpoint == from_export  # the checkpoint's actor, as exported
    assert from_checkpoint != base, "two GRPO steps at lr 1e-2 changed no greedy answer"
    assert _files(root / "ckpt") == checkpoints_before
