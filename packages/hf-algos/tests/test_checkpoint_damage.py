"""Damaged checkpoints: the manifest finds the damage, resume refuses or falls back, nothing
good is deleted, and the ``hybridflow`` command says it in one line (exit 2).

The manager's cases run on a real model + optimizer role in seconds; the command's cases
train a tiny model for two steps (``trainer.backend=local``, a checkpoint each step) and
damage a copy of that run's checkpoints the way the issue found them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from hf_algos.checkpoint import (
    LATEST_FILE,
    STATE_FILE,
    CheckpointError,
    CheckpointManager,
    DamagedCheckpointError,
)
from hf_algos.checkpoint_manifest import MANIFEST_FILE
from hf_controller import ConfigurationError

from .test_checkpoint import LinearRole
from .test_cli import FAST, TINY, _task, hybridflow


def _three_checkpoints(root: Path, max_checkpoints: int | None = None) -> CheckpointManager:
    manager = CheckpointManager(root, max_checkpoints)
    role = LinearRole(seed=0)
    for step in (1, 2, 3):
        role.train_step()
        manager.save(step, {"loader": {"index": step}}, {"actor": role})
    return manager


def test_every_save_has_a_manifest_and_load_names_the_damaged_file(tmp_path: Path) -> None:
    manager = _three_checkpoints(tmp_path)
    step_3 = tmp_path / "global_step_3"
    listed = json.loads((step_3 / MANIFEST_FILE).read_text())["files"]
    assert set(listed) == {"actor/state.pt", STATE_FILE, "trainer_state.json"}
    state_pt = step_3 / "actor" / "state.pt"
    size = state_pt.stat().st_size
    cases = {  # damage -> what the one line says about it
        "truncated": rf"actor/state\.pt has 100 bytes, the manifest says {size}",
        "changed": r"actor/state\.pt has CRC-32 [0-9a-f]{8}, the manifest says [0-9a-f]{8}",
        "missing": rf"actor/state\.pt is missing \(the manifest lists {size} bytes\)",
    }
    original = state_pt.read_bytes()
    for damage, message in cases.items():
        if damage == "truncated":
            state_pt.write_bytes(original[:100])
        elif damage == "changed":  # same size, one byte flipped
            state_pt.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
        else:
            state_pt.unlink()
        fresh = LinearRole(seed=1)
        before = fresh.model.weight.detach().clone()
        with pytest.raises(DamagedCheckpointError, match=rf"'{step_3}' is damaged: {message}"):
            CheckpointManager(tmp_path).load(step_3, {"actor": fresh})
        assert torch.equal(fresh.model.weight, before)  # no state touched
    state_pt.write_bytes(original)
    assert manager.load(step_3)["loader"] == {"index": 3}
    assert issubclass(DamagedCheckpointError, ConfigurationError)  # the CLI: one line, exit 2


def test_a_checkpoint_without_manifest_loads_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _three_checkpoints(tmp_path)
    (tmp_path / "global_step_3" / MANIFEST_FILE).unlink()  # as saved before manifests
    with caplog.at_level(logging.WARNING, logger="hf_algos.checkpoint"):
        assert manager.load(tmp_path / "global_step_3")["loader"] == {"index": 3}
    assert [r.getMessage() for r in caplog.records] == [
        f"checkpoint {tmp_path / 'global_step_3'} has no manifest.json (saved by an older "
        "version): its files are not verified"
    ]
    # a truncated driver file there is named as damaged, not blamed as pickled code
    state = tmp_path / "global_step_3" / STATE_FILE
    state.write_bytes(state.read_bytes()[:300])
    with pytest.raises(CheckpointError, match=r"trainer_state\.pt' \(300 bytes\) is truncated"):
        CheckpointManager(tmp_path).load(tmp_path / "global_step_3")


def test_resume_refuses_a_damaged_latest_or_takes_the_previous_good_one(tmp_path: Path) -> None:
    manager = _three_checkpoints(tmp_path, max_checkpoints=2)
    step_2, step_3 = tmp_path / "global_step_2", tmp_path / "global_step_3"
    (step_3 / STATE_FILE).write_bytes(b"cut")
    with pytest.raises(DamagedCheckpointError) as refused:
        manager.resumable(step_3, "refuse")
    assert str(refused.value) == (
        f"checkpoint '{step_3}' is damaged: {STATE_FILE} has 3 bytes, the manifest says "
        f"{json.loads((step_3 / MANIFEST_FILE).read_text())['files'][STATE_FILE]['size']} "
        f"(truncated?); the newest earlier good one is '{step_2}': set "
        "trainer.resume_fallback=previous to resume from it (nothing is deleted)"
    )
    assert step_3.is_dir() and manager.latest() == step_3  # refusing moves nothing

    assert manager.resumable(step_3, "previous") == step_2
    assert (tmp_path / "damaged-global_step_3" / STATE_FILE).read_bytes() == b"cut"
    assert (tmp_path / LATEST_FILE).read_text() == "2" and manager.latest() == step_2
    # the run goes on from step 2: its saves and max_checkpoints=2 keep the good ones and
    # never touch the damaged one
    for step in (3, 4):
        manager.save(step, {"loader": {"index": step}}, {"actor": LinearRole(0)})
        manager.remove_stale()
    assert [p.name for p in manager.checkpoints()] == ["global_step_3", "global_step_4"]
    assert (tmp_path / "damaged-global_step_3" / STATE_FILE).read_bytes() == b"cut"


def test_fallback_skips_every_damaged_checkpoint_and_refuses_without_a_good_one(
    tmp_path: Path,
) -> None:
    manager = _three_checkpoints(tmp_path)
    for step in (2, 3):
        (tmp_path / f"global_step_{step}" / "actor" / "state.pt").write_bytes(b"")
    assert manager.resumable(tmp_path / "global_step_3", "previous") == tmp_path / "global_step_1"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "damaged-global_step_2",
        "damaged-global_step_3",
        "global_step_1",
    ]
    (tmp_path / "global_step_1" / "trainer_state.json").write_text("{}")
    with pytest.raises(DamagedCheckpointError, match="no earlier good checkpoint: set trainer"):
        CheckpointManager(tmp_path).resumable(tmp_path / "global_step_1", "previous")
    assert (tmp_path / "global_step_1").is_dir()


# ------------------------------------------------------------------ the hybridflow command


def _overrides(model: Path, data: Path, reward: Path, steps: int) -> list[str]:
    """The run's overrides: ``steps`` steps, a checkpoint each step into ``ckpt``."""
    return [
        f"actor.engine.model.path={model}",
        f"data.train_files=[{data}]",
        f"reward.function_path={reward}",
        "data.train_batch_size=4",
        "data.max_prompt_length=16",
        "rollout.n=2",
        "rollout.max_new_tokens=4",
        "actor.ppo_mini_batch_size=8",
        f"trainer.total_training_steps={steps}",
        "trainer.loggers=[]",
        "trainer.checkpoint_dir=ckpt",
        "trainer.save_freq=1",
        *FAST,
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A directory with a tiny model, its task and ``ckpt/global_step_{1,2}`` of 2 steps."""
    root = tmp_path_factory.mktemp("trained")
    model, data, reward = _task(root)
    run = hybridflow("grpo", *_overrides(model, data, reward, 2), cwd=root)
    assert run.returncode == 0, run.stderr[-3000:]
    return root, _overrides(model, data, reward, 3)


def _copy(trained: tuple[Path, list[str]], tmp_path: Path) -> tuple[Path, list[str]]:
    root, overrides = trained
    shutil.copytree(root / "ckpt", tmp_path / "ckpt")
    return tmp_path, overrides


def _one_line(run: subprocess.CompletedProcess[str], *parts: str) -> str:
    """The run's error line, checked: exit 2, no traceback, naming each of ``parts``."""
    stderr = run.stderr
    assert run.returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr and "references Python code" not in stderr, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("hybridflow grpo: configuration error: checkpoint"), line
    for part in parts:
        assert part in line, line
    return line


def test_command_refuses_a_damaged_latest_then_falls_back_with_the_key(
    trained: tuple[Path, list[str]], tmp_path: Path
) -> None:
    cwd, overrides = _copy(trained, tmp_path)
    distcp = cwd / "ckpt" / "global_step_2" / "actor" / "dcp" / "__0_0.distcp"
    distcp.write_bytes(distcp.read_bytes()[:1000])
    refused = hybridflow("grpo", *overrides, cwd=cwd)
    _one_line(
        refused,
        f"checkpoint '{cwd / 'ckpt' / 'global_step_2'}' is damaged: actor/dcp/__0_0.distcp has "
        "1000 bytes",
        f"the newest earlier good one is '{cwd / 'ckpt' / 'global_step_1'}'",
        "trainer.resume_fallback=previous",
    )
    (cwd / "final").mkdir()  # an earlier export there: replaced whole at the end
    (cwd / "final" / "chat_template.jinja").write_text("{{ messages }}")
    resumed = hybridflow(
        "grpo", *overrides, "trainer.resume_fallback=previous", "trainer.export_dir=final", cwd=cwd
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(resumed at step 1)" in resumed.stdout
    assert "model.safetensors" in _modes(cwd / "final")
    assert not (cwd / "final" / "chat_template.jinja").exists()
    assert (cwd / "ckpt" / "damaged-global_step_2" / "actor" / "dcp" / "__0_0.distcp").is_file()
    names = sorted(p.name for p in (cwd / "ckpt").iterdir() if p.name.startswith("global"))
    assert names == ["global_step_1", "global_step_2", "global_step_3"]


def test_command_names_a_truncated_file_of_a_checkpoint_without_manifest(
    trained: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """The engine's own check, raised in the worker group and said in one line (the other
    truncated files: hf-engines' test_checkpointing and the manager's tests above)."""
    cwd, overrides = _copy(trained, tmp_path)
    step_2 = cwd / "ckpt" / "global_step_2"
    (step_2 / MANIFEST_FILE).unlink()  # as saved before manifests: the engine finds it
    distcp = step_2 / "actor" / "dcp" / "__0_0.distcp"
    distcp.write_bytes(distcp.read_bytes()[:1000])
    run = hybridflow("grpo", *overrides, cwd=cwd)
    _one_line(run, "__0_0.distcp' has 1000 bytes, but the checkpoint's .metadata needs")


def test_command_names_both_models_on_a_checkpoint_of_another_model(
    trained: tuple[Path, list[str]], tmp_path: Path
) -> None:
    from hf_algos.examples.reverse_letters import build_model_dir

    cwd, overrides = _copy(trained, tmp_path)
    root = trained[0]
    wider = dataclasses.replace(TINY, hidden_size=64)
    other = build_model_dir(cwd / "other", wider, seed=0)
    # the run's identity check refuses it first (test_run_dirs); forced past it, the engine's
    # own check still names both models in one line instead of a size-mismatch traceback
    forced = ("trainer.resume_force=true", f"actor.engine.model.path={other}")
    run = hybridflow("grpo", *overrides, *forced, cwd=cwd)
    _one_line(
        run,
        f"holds another model ('{root / 'model'}'",
        f"than this run's ('{other}'",
        "model.embed_tokens.weight is [128, 64] here, shape [128, 32] in the checkpoint",
    )


def test_export_dir_may_not_hold_the_checkpoints() -> None:
    from hf_algos.config.trainer import TrainerSection

    with pytest.raises(ConfigurationError, match=r"export_dir='out' holds trainer\.checkpoint_dir"):
        TrainerSection(export_dir="out", checkpoint_dir="out/ckpt")
    TrainerSection(export_dir="out/model", checkpoint_dir="out/ckpt")


def _modes(directory: Path) -> dict[str, int]:
    """Every file's permission bits, checked to be one mode (what the umask gives)."""
    modes = {p.name: p.stat().st_mode & 0o777 for p in directory.iterdir()}
    assert set(modes.values()) == {0o666 & ~_umask()}, modes
    assert not [p for p in directory.parent.iterdir() if p.name.startswith(".tmp-")]
    return modes


def _umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _with_chat_template(trained: tuple[Path, list[str]], tmp_path: Path) -> Path:
    """Model A: the run's checkpoint with a tokenizer that has a chat template (as
    SmolLM2's has), its manifest written again as a save would."""
    from hf_algos.checkpoint_manifest import write_manifest
    from hf_algos.data import build_char_tokenizer

    root = tmp_path / "model_a"
    shutil.copytree(trained[0] / "ckpt", root)
    step = root / "global_step_2"
    shutil.rmtree(step / "tokenizer")
    build_char_tokenizer(step / "tokenizer")
    assert (step / "tokenizer" / "chat_template.jinja").is_file()
    (step / MANIFEST_FILE).unlink()
    write_manifest(step)
    return root


def test_export_is_atomic_refuses_a_used_target_and_overwrite_replaces_it_whole(
    trained: tuple[Path, list[str]], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    model_a = _with_chat_template(trained, tmp_path)
    model_b = trained[0] / "ckpt"
    first = hybridflow("export", str(model_a), "out", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "hybridflow: exported global_step 2 (" in first.stdout
    assert "chat_template.jinja" in _modes(tmp_path / "out")

    refused = hybridflow("export", str(model_b), "out", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "exists and is not empty (chat_template.jinja, config.json" in refused.stderr
    assert "--overwrite" in refused.stderr
    assert (tmp_path / "out" / "chat_template.jinja").is_file()  # untouched

    replaced = hybridflow("export", str(model_b), "out", "--overwrite", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert "exported global_step 2" in replaced.stdout
    assert "chat_template.jinja" not in _modes(tmp_path / "out")
    assert AutoTokenizer.from_pretrained(str(tmp_path / "out")).chat_template is None


def test_export_of_a_damaged_checkpoint_or_into_an_unwritable_place_is_one_line(
    trained: tuple[Path, list[str]], tmp_path: Path
) -> None:
    import os

    cwd, _ = _copy(trained, tmp_path)
    blocked = cwd / "blocked"
    blocked.mkdir()
    blocked.chmod(0o555)
    if os.access(blocked, os.W_OK):  # root writes anywhere: a file where a directory goes
        blocked = cwd / "a_file"
        blocked.write_text("")
    unwritable = hybridflow("export", "ckpt", str(blocked / "out"), cwd=cwd)
    assert unwritable.returncode == 2 and "Traceback" not in unwritable.stderr
    assert f"cannot write the export to '{blocked / 'out'}'" in unwritable.stderr

    metadata = cwd / "ckpt" / "global_step_2" / "actor" / "dcp" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:1000])
    damaged = hybridflow("export", "ckpt", "out", cwd=cwd)
    assert damaged.returncode == 2 and "Traceback" not in damaged.stderr
    assert "checkpoint 'ckpt/global_step_2' is damaged: actor/dcp/.metadata has 1000" in (
        damaged.stderr
    )
    assert not (cwd / "out").exists()
