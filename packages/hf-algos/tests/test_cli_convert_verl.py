"""``hybridflow convert-verl``: a verl config written once in our key paths, loading the same."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from hf_algos.cli.main import COMMANDS, build_parser, compose_command_config, main
from hf_algos.config import resolve_config
from hf_algos.config.aliases import VERL_ROOTS

VERL_GRPO = """\
data:
  train_files: [data/train.parquet]
  val_files: data/test.parquet
  train_batch_size: 32
  max_prompt_length: 512
  max_response_length: 1024
  filter_overlong_prompts: true
  truncation: error
  return_raw_chat: true
actor_rollout_ref:
  model:
    path: /models/qwen
    use_remove_padding: true
    enable_gradient_checkpointing: true
  actor:
    strategy: fsdp2
    optim: {lr: 1.0e-6, optimizer: AdamW, weight_decay: 0.01}
    ppo_mini_batch_size: 8
    ppo_micro_batch_size_per_gpu: 4
    use_kl_loss: true
    kl_loss_coef: 0.001
    kl_loss_type: low_var_kl
    clip_ratio: 0.2
    entropy_coeff: 0
    fsdp_config: {param_offload: false, optimizer_offload: false}
  ref:
    strategy: fsdp
    log_prob_micro_batch_size_per_gpu: 8
  rollout:
    name: vllm
    n: 4
    temperature: 1.0
    log_prob_micro_batch_size_per_gpu: 8
algorithm:
  adv_estimator: grpo
  use_kl_in_reward: false
custom_reward_function: {path: my_reward.py, name: compute_score}
trainer:
  logger: [console, wandb]
  n_gpus_per_node: 8
  nnodes: 1
  project_name: verl_grpo
  experiment_name: qwen_grpo
  total_epochs: 15
  save_freq: 20
  test_freq: 5
  critic_warmup: 0
  default_local_dir: checkpoints/qwen_grpo
"""
"""A verl GRPO config as verl's examples write one (performance knobs included)."""

VERL_CPU = """\
data:
  train_files: [train.jsonl]
  train_batch_size: 4
  max_prompt_length: 4
  max_response_length: 4
actor_rollout_ref:
  model: {path: model}
  actor:
    optim: {lr: 1.0e-2}
    ppo_micro_batch_size_per_gpu: 8
  rollout: {name: hf, n: 4, temperature: 1.0}
algorithm: {adv_estimator: grpo}
custom_reward_function: {path: my_reward.py, name: compute_score}
trainer:
  logger: [jsonl]
  total_training_steps: 2
  n_gpus_per_node: 1
  device: cpu
  nnodes: 1
  default_local_dir: ckpt
  project_name: verl_style
"""
"""test_cli.py's verl-style config, which trains on CPU (test_verl_style_config_runs)."""

OVERRIDES = [
    "actor_rollout_ref.rollout.n=8",
    "trainer.total_epochs=3",
    "actor.engine.optim.grad_clip=0.5",
    "data.val_files=a.parquet,b.parquet",
]
"""verl-style overrides, as a verl launch line gives them (ours mixed in)."""


@pytest.fixture(autouse=True)
def _keep_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` sets the Hugging Face progress-bar variable when unset: not for later tests."""
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def resolved(command: str, path: Path, overrides: list[str]) -> tuple[dict[str, Any], list[str]]:
    """What ``hybridflow COMMAND --config PATH --cfg OVERRIDES`` prints, as plain data, and
    the warnings of the load (verl keys that have no effect)."""
    args = build_parser().parse_args([command, "--config", str(path), *overrides])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = resolve_config(compose_command_config(COMMANDS[command], args))
    plain = OmegaConf.to_container(tree, resolve=True)
    assert isinstance(plain, dict)
    return plain, [str(warning.message) for warning in caught]


def convert(tmp_path: Path, text: str, *args: str) -> tuple[int, Path]:
    """``hybridflow convert-verl verl.yaml -o native.yaml ARGS``: exit code, native file."""
    verl, native = tmp_path / "verl.yaml", tmp_path / "native.yaml"
    verl.write_text(text)
    return main(["convert-verl", str(verl), "-o", str(native), *args]), native


@pytest.mark.parametrize(
    ("text", "command", "overrides"),
    [
        (VERL_GRPO, "grpo", []),
        (VERL_GRPO, "grpo", OVERRIDES),
        (VERL_GRPO, "ppo", ["algorithm.adv_estimator=gae"]),
        (VERL_CPU, "grpo", ["actor.ppo_mini_batch_size=16"]),
    ],
    ids=["grpo", "grpo-overrides", "ppo", "test-cli-cpu"],
)
def test_the_native_file_loads_as_the_verl_file(
    tmp_path: Path, text: str, command: str, overrides: list[str]
) -> None:
    code, native = convert(tmp_path, text, "--for", command, *overrides)
    assert code == 0
    from_native, native_warnings = resolved(command, native, [])
    from_verl, verl_warnings = resolved(command, tmp_path / "verl.yaml", overrides)
    assert from_native == from_verl
    assert not native_warnings  # no verl key left to translate at each load
    assert all("has no effect here" in warning for warning in verl_warnings)
    written = yaml.safe_load(native.read_text())
    assert not set(written) & set(VERL_ROOTS), written.keys()
    assert "logger" not in written["trainer"] and "n_gpus_per_node" not in written["trainer"]


def test_only_the_keys_set_are_written_under_our_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, native = convert(tmp_path, VERL_GRPO, *OVERRIDES)
    assert code == 0
    written = yaml.safe_load(native.read_text())
    assert written["actor"]["engine"]["optim"] == {
        "lr": 1.0e-6,
        "name": "adamw",
        "weight_decay": 0.01,
        "grad_clip": 0.5,
    }
    assert written["actor"]["clip_low"] == written["actor"]["clip_high"] == 0.2
    assert written["actor"]["ppo_mini_batch_size"] == 64  # 8 prompts x rollout.n=8 (override)
    assert written["rollout"] == {
        "max_new_tokens": 1024,
        "backend": "vllm",
        "n": 8,
        "temperature": 1.0,
    }
    assert written["data"]["val_files"] == ["a.parquet", "b.parquet"]
    assert written["data"]["overlong_prompts"] == "drop"
    assert written["trainer"]["n_workers"] == 8 and written["trainer"]["use_gpu"] is True
    assert written["trainer"]["checkpoint_dir"] == "checkpoints/qwen_grpo"
    assert written["reward"] == {"function_path": "my_reward.py", "function_name": "compute_score"}
    assert "critic" not in written and "critic_warmup" not in written["trainer"]  # no defaults
    notes = capsys.readouterr().err
    for ignored in (
        "data.truncation",
        "data.return_raw_chat",
        "use_remove_padding",
        "log_prob_micro_batch_size_per_gpu",
    ):
        assert f"verl key {ignored}" in notes or f".{ignored} has no effect" in notes, ignored
    assert "offload" not in written["actor"]["engine"]  # verl's offload switches false: unset
    assert "actor_rollout_ref.ref.strategy='fsdp' is not written: actor.engine.backend" in notes
    assert "ppo_mini_batch_size=8 (prompts) is written as actor.ppo_mini_batch_size=64" in notes
    assert "trainer.n_gpus_per_node=8 (with trainer.nnodes=1) is written as" in notes
    assert f"check it with `hybridflow grpo --config {native} --cfg`" in notes


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "actor_rollout_ref.actor.ppo_micro_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size (from the command line) is not "
            "supported by hybridflow: use actor.engine.micro_batch.micro_batch_size",
        ),
        ("async_training.staleness_threshold=0.5", "set trainer.max_staleness"),
        ("trainer.critic_warmup=2", "verl key trainer.critic_warmup"),
        ("actor_rollout_ref.actor.optim.optimizer=SGD", "use one of ['AdamW', 'Muon']"),
        ("actor_rollout_ref.ref.strategy=megatron", "set actor_rollout_ref.actor.strategy="),
        ("actor_rollout_ref.rollout.nn=2", "did you mean actor_rollout_ref.rollout.n?"),
        ("trainer.total_epoch=2", "Did you mean: 'total_epochs'?"),
    ],
)
def test_keys_without_an_equivalent_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    code, native = convert(tmp_path, VERL_GRPO, override)
    assert code == 2 and not native.exists()
    error = capsys.readouterr().err
    assert "hybridflow convert-verl: configuration error:" in error and message in error


def test_refused_keys_in_the_file_and_the_output_over_the_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = convert(tmp_path, VERL_GRPO + "  default_hdfs_dir: hdfs://x\n")
    assert code == 2
    assert "trainer.default_hdfs_dir (from" in capsys.readouterr().err
    verl = tmp_path / "verl.yaml"
    assert main(["convert-verl", str(verl), "-o", str(verl)]) == 2
    assert "is the verl config itself" in capsys.readouterr().err
    assert verl.read_text().startswith("data:")


def test_stdout_mode_as_a_user_runs_it_imports_no_torch(tmp_path: Path) -> None:
    """The command as a process: the YAML on stdout, the notes on stderr, no torch."""
    (tmp_path / "verl.yaml").write_text(VERL_CPU)
    code = (
        "import sys\n"
        "from hf_algos.cli.main import main\n"
        "code = main(['convert-verl', 'verl.yaml', 'trainer.total_training_steps=5'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'tensordict') if m in sys.modules]\n"
        "print('heavy:', heavy, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "heavy: []" in run.stderr
    written = yaml.safe_load(run.stdout)
    assert run.stdout.startswith("# converted from the verl config verl.yaml")
    assert written["rollout"]["backend"] == "native"  # verl's rollout.name=hf
    assert written["trainer"]["total_training_steps"] == 5
    assert written["trainer"]["use_gpu"] is False and written["trainer"]["n_workers"] == 1
    assert "written as trainer.n_workers=1:" in run.stderr  # trainer.device=cpu decides
    assert not list(tmp_path.glob("*.yaml"))[1:], "stdout mode wrote a file"
