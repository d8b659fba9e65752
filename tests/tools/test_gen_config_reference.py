"""Tests for tools/gen_config_reference.py against the real config dataclasses."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import gen_config_reference as gen
import pytest

from hf_algos.config import RLConfig, load_config
from hf_controller import ConfigurationError
from hf_engines import ActorConfig


def test_committed_reference_is_up_to_date() -> None:
    text, _ = gen.render()

    committed = gen.OUTPUT.read_text(encoding="utf-8")

    assert committed == text, (
        "docs/configuration.md is stale; run `python tools/gen_config_reference.py` and commit it"
    )


def test_every_config_field_has_a_docstring() -> None:
    _, missing = gen.render()

    assert missing == [], f"fields without an attribute docstring: {missing}"


def test_check_mode_fails_on_a_stale_file_and_passes_after_regenerating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "configuration.md"
    output.write_text("# an old reference\n", encoding="utf-8")

    stale = gen.main(["--check", "--output", str(output)])
    assert "is stale" in capsys.readouterr().err
    written = gen.main(["--output", str(output)])
    fresh = gen.main(["--check", "--output", str(output)])

    assert (stale, written, fresh) == (1, 0, 0)


def test_inherited_field_docstrings_are_read_from_the_base_class_source() -> None:
    docs = gen.attribute_docstrings(ActorConfig)

    # ActorConfig declares no fields itself; they come from hf_engines' UpdateConfig.
    assert docs["ppo_mini_batch_size"].startswith("Rows per mini-batch")
    assert set(docs) >= {"engine", "ppo_mini_batch_size", "ppo_epochs", "shuffle", "seed"}


def test_every_field_of_the_rl_config_tree_is_rendered_with_type_and_default() -> None:
    text, _ = gen.render()

    assert "- **`lr`** `float` = `1e-05` — Peak learning rate." in text
    assert '- **`type`** `"fixed" | "adaptive"` = `"fixed"`' in text
    assert "- **`actor`** `ActorSection` (*required*)" in text
    assert "- `actor.engine.optim`: [`OptimConfig`](#optimconfig)" in text


def test_docstring_markup_becomes_markdown_with_markup_characters_escaped() -> None:
    text = gen.rst_to_markdown(
        "See :class:`~hf_engines.EngineConfig` and ``a_b``;\n  costs N**2 for <k> [x]."
    )

    assert text == "See `EngineConfig` and `a_b`; costs N\\*\\*2 for &lt;k> \\[x\\]."


def _fenced(text: str, language: str) -> str:
    match = re.search(rf"```{language}\n(.*?)```", text, re.DOTALL)
    assert match is not None, f"no ```{language} block in the reference"
    return match.group(1)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with what the documented example names: a model and data files."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "data").mkdir()
    for name in ("train.parquet", "val.parquet"):
        (tmp_path / "data" / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_documented_yaml_and_command_line_overrides_load(workdir: Path) -> None:
    text = gen.OUTPUT.read_text(encoding="utf-8")
    yaml_text = _fenced(text, "yaml").replace("/models/qwen2-0.5b", str(workdir / "model"))
    (workdir / "grpo.yaml").write_text(yaml_text)
    command = shlex.split(_fenced(text, "bash").replace("\\\n", " "))
    assert command[:4] == ["hybridflow", "grpo", "--config", "grpo.yaml"]

    from_file = load_config(RLConfig, "grpo.yaml")
    overridden = load_config(RLConfig, "grpo.yaml", command[4:])

    assert from_file.actor.engine.optim.lr == pytest.approx(1e-6)
    assert from_file.trainer.loggers == ("console", "jsonl")
    assert overridden.actor.engine.optim.lr == pytest.approx(3e-6)
    assert overridden.rollout.n == 16
    assert overridden.trainer.loggers == ("console", "tensorboard")
    assert overridden.data.val_files == ("data/val.parquet",)
    assert overridden.actor.engine.model.path == str(workdir / "model")  # through ${vars.model}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "actor.engine.optim.lrr=1",
            "actor.engine.optim.lrr: Key 'lrr' not in 'OptimConfig'. Did you mean: 'lr'?",
        ),
        ("rollout.n=many", "rollout.n: Value 'many' of type 'str' could not be converted"),
    ],
)
def test_documented_error_messages_are_the_real_ones(
    workdir: Path, override: str, message: str
) -> None:
    text = gen.OUTPUT.read_text(encoding="utf-8")
    yaml_text = _fenced(text, "yaml").replace("/models/qwen2-0.5b", str(workdir / "model"))
    (workdir / "grpo.yaml").write_text(yaml_text)
    assert message in text

    with pytest.raises(ConfigurationError, match=re.escape(message)):
        load_config(RLConfig, "grpo.yaml", [override])
