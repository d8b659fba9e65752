"""``actor.engine.fsdp.param_dtype: auto`` and ``rollout.dtype: auto`` are resolved once in
the driver, for the run's device and the actor's model, and said in one line; explicit
dtypes are kept and the master weights stay in ``model.dtype``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers.roles.workers import announce, engine_on_device, rollout_dtype
from hf_engines.precision import resolve_auto_dtype

MODEL = [
    "+actor.engine.model.hf_config.model_type=llama",
    f"data.tokenizer_path={Path(__file__).parent}",
]
BASE = [*MODEL, "rollout.n=4", "data.train_batch_size=4", "actor.ppo_mini_batch_size=16"]


def load(*overrides: str) -> RLConfig:
    return load_config(RLConfig, overrides=[*BASE, *overrides])


def test_auto_resolves_in_the_driver_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    announce.cache_clear()
    config = load("actor.engine.fsdp.param_dtype=auto")
    expected = resolve_auto_dtype("cpu", config.actor.engine.model.hf_config)
    engine = engine_on_device(config.actor.engine, config.trainer, "actor.engine")
    assert engine.fsdp.param_dtype == expected.dtype
    assert engine.model.dtype == "float32"  # fp32 master weights and optimizer state
    assert engine.fsdp.reduce_dtype == "float32"
    # the rollout follows the actor's compute dtype; the reference says nothing new
    assert rollout_dtype(config.rollout, config.actor, config.trainer) == expected.dtype
    engine_on_device(config.actor.engine, config.trainer, "actor.engine")
    assert capsys.readouterr().out == expected.line() + "\n"


def test_explicit_dtypes_win_and_say_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    announce.cache_clear()
    config = load("actor.engine.fsdp.param_dtype=bfloat16", "rollout.dtype=float32")
    engine = engine_on_device(config.actor.engine, config.trainer, "actor.engine")
    assert engine.fsdp.param_dtype == "bfloat16"
    assert rollout_dtype(config.rollout, config.actor, config.trainer) == "float32"
    plain = load()  # unset rollout.dtype, explicit actor: the actor's model.dtype as before
    assert rollout_dtype(plain.rollout, plain.actor, plain.trainer) == "float32"
    assert capsys.readouterr().out == ""


def test_rollout_auto_alone(capsys: pytest.CaptureFixture[str]) -> None:
    announce.cache_clear()
    config = load("rollout.dtype=auto")
    expected = resolve_auto_dtype("cpu", None)
    assert rollout_dtype(config.rollout, config.actor, config.trainer) == expected.dtype
    assert capsys.readouterr().out == expected.line() + "\n"


def test_megatron_keeps_its_model_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    announce.cache_clear()
    config = load("actor.engine.fsdp.param_dtype=auto", "actor.engine.backend=megatron")
    engine = engine_on_device(config.actor.engine, config.trainer, "actor.engine")
    assert engine.megatron.device == "cpu" and engine.model.dtype == "float32"
    assert rollout_dtype(config.rollout, config.actor, config.trainer) == "float32"
    assert capsys.readouterr().out == ""  # no line: nothing was resolved
