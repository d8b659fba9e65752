"""verl's own launch lines, key by key: each override maps to ours, has no effect (named in
one note line with why), or is refused in one line naming it and the fix.

The overrides are ``tests/data/verl_launch_lines.json``: every ``key=value`` of verl's example
scripts that run ``verl.trainer.main_ppo`` and of its quickstart's line, with shell variables
substituted (``tools/extract_verl_launch_lines.py``; verl commit in the file). The counts per
outcome are in docs/from-verl.md ("verl's example scripts"), checked here.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from hf_algos.cli.main import COMMANDS, main
from hf_algos.config import VerlKeysNoEffect, compose_config
from hf_algos.config.aliases import find_alias
from hf_algos.config.loading import _schema_field
from hf_algos.config.overrides import parse_value
from hf_algos.examples.reverse_letters import ModelShape, build_model_dir, make_reverse_letters_rows
from hf_controller import ConfigurationError

TABLE = json.loads((Path(__file__).parent / "data" / "verl_launch_lines.json").read_text())
LINES: dict[str, list[str]] = TABLE["scripts"]
DOC = Path(__file__).resolve().parents[3] / "docs" / "from-verl.md"
QUICKSTART = "docs/start/quickstart.rst"
GRPO_EXAMPLE = "examples/grpo_trainer/run_qwen2-7b.sh"
TINY = ModelShape(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def _command(overrides: list[str]) -> str:
    """verl's one entry point runs both: ``ppo`` for GAE (a critic), else ``grpo``."""
    return "ppo" if "algorithm.adv_estimator=gae" in overrides else "grpo"


def _check_refusal(override: str, message: str) -> None:
    """A clean refusal: one line, naming the key, no `+key` the user did not write, not
    OmegaConf's own struct error."""
    assert "\n" not in message and "Traceback" not in message, message
    assert _key(override) in message, message
    assert "+" not in message.replace(override, ""), message
    assert "is not in struct" not in message and "To append" not in message, message


_REFUSED: dict[str, str] = {}
"""Overrides a line refused already, with the error: the same text gets the same answer, so
later lines leave them out at once (each line then composes about twice, not once per
refusal)."""


def compose_line(overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    """Compose one launch line: the overrides refused (each with its error, taken out one at
    a time) and the warnings of the rest, which must resolve."""
    command = COMMANDS[_command(overrides)]
    refused = {o: _REFUSED[o] for o in overrides if o in _REFUSED}
    remaining = [o for o in overrides if o not in refused]
    while True:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                compose_config(command.config, None, remaining, command.defaults)
            except ConfigurationError as error:
                named = sorted((o for o in remaining if _key(o) in str(error)), key=len)
                assert named, f"the refusal names no override of the line: {error}"
                refused[named[-1]] = _REFUSED[named[-1]] = str(error)
                remaining.remove(named[-1])
                continue
        return refused, [str(w.message) for w in caught if w.category is VerlKeysNoEffect]


@pytest.mark.parametrize("script", sorted(LINES))
def test_every_override_resolves_or_is_refused_in_one_line(script: str) -> None:
    overrides = LINES[script]
    refused, notes = compose_line(overrides)
    for override, message in refused.items():
        _check_refusal(override, message)
    assert len(notes) <= 1  # every no-op key of the line in one note
    for note in notes:
        assert "\n" not in note and note.startswith("verl key")


def classify(key: str, values: set[str]) -> str:
    """``mapped``, ``no-op`` or ``refused``: what the table does with verl key ``key`` given
    the values verl's scripts give it (a value accepted as verl's default is a no-op)."""
    alias = find_alias(key, "RLConfig")
    if alias is None:
        section, _ = _schema_field(COMMANDS["ppo"].config, key)
        leaf = key.rpartition(".")[2]
        known = section is None or leaf in {f for f in section.__dataclass_fields__}
        return "mapped" if known and not key.startswith("actor_rollout_ref") else "refused"
    if alias.kind in ("renamed", "same", "derived", "shared"):
        return "mapped"
    if alias.kind == "ignored":
        return "no-op"
    parsed = [parse_value(v) for v in values]
    accepted = all(any(type(v) is type(a) and v == a for a in alias.accepted) for v in parsed)
    return "no-op" if accepted else "refused"


def outcome_counts() -> Counter[str]:
    """Distinct keys of the launch lines per outcome."""
    values: dict[str, set[str]] = {}
    for overrides in LINES.values():
        for override in overrides:
            values.setdefault(_key(override), set()).add(override.partition("=")[2])
    return Counter(classify(key, vals) for key, vals in values.items())


def counts_sentence() -> str:
    """The sentence of docs/from-verl.md that gives the counts."""
    counts = outcome_counts()
    pairs = sum(len(o) for o in LINES.values())
    return (
        f"{len(LINES)} launch lines, {pairs} overrides, {sum(counts.values())} distinct keys: "
        f"{counts['mapped']} mapped, {counts['no-op']} accepted with no effect, "
        f"{counts['refused']} refused"
    )


def test_the_counts_per_outcome_are_the_docs() -> None:
    sentence = counts_sentence()
    assert sentence in DOC.read_text(encoding="utf-8"), f"docs/from-verl.md should say: {sentence}"


def _launch(script: str, tmp_path: Path) -> list[str]:
    """A launch line with its model and data files made local (tiny, as a user has them)."""
    model = build_model_dir(tmp_path / "model", TINY, seed=0)
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in make_reverse_letters_rows(8, 3, seed=0)))
    local = {
        "data.train_files": rows,
        "data.val_files": rows,
        "actor_rollout_ref.model.path": model,
        "critic.model.path": model,
    }
    return [f"{_key(o)}={local[_key(o)]}" if _key(o) in local else o for o in LINES[script]]


@pytest.mark.parametrize(
    ("command", "script", "expected"),
    [
        (
            "ppo",
            QUICKSTART,
            {
                "rollout.backend": "vllm",
                "rollout.engine_kwargs": {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.4},
                "actor.engine.optim.lr": 1e-6,
                "critic.engine.optim.lr": 1e-5,
                "actor.ppo_mini_batch_size": 64,
                "trainer.n_workers": 1,
            },
        ),
        (
            "grpo",
            GRPO_EXAMPLE,
            {
                "rollout.backend": "vllm",
                "rollout.engine_kwargs": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.6},
                "rollout.n": 5,
                "actor.ppo_mini_batch_size": 256 * 5,
                "actor.engine.offload": False,
                "actor.engine.fsdp.activation_checkpointing": True,
                "trainer.n_workers": 8,
            },
        ),
    ],
)
def test_verl_launch_lines_print_their_config(
    command: str,
    script: str,
    expected: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    line = _launch(script, tmp_path)
    capsys.readouterr()  # the tiny model's writing bars
    code = main([command, "--cfg", *line])
    out, err = capsys.readouterr()
    assert code == 0, err
    shown = OmegaConf.create(out)
    for key, value in expected.items():
        assert OmegaConf.select(shown, key) == value, key
    assert "UserWarning" not in err and not re.search(r"\.py:\d+", err), err
    assert "+" not in err, err
    notes = [line for line in err.splitlines() if line]
    assert len(notes) == 1 and notes[0].startswith(f"hybridflow {command}: note: verl keys with")
    assert "log_prob_micro_batch_size_per_gpu (uses the actor's" in notes[0]


def _composed(*overrides: str) -> tuple[Any, list[str]]:
    """The grpo tree of ``overrides`` and the messages of its no-effect warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = compose_config(
            COMMANDS["grpo"].config,
            None,
            ["actor_rollout_ref.model.path=/models/m", *overrides],
            COMMANDS["grpo"].defaults,
        )
    return tree, [str(w.message) for w in caught if w.category is VerlKeysNoEffect]


def test_offload_switches_set_the_actors_offload() -> None:
    actor = "actor_rollout_ref.actor.fsdp_config"
    tree, notes = _composed(f"{actor}.param_offload=True", f"{actor}.optimizer_offload=False")
    assert tree.actor.engine.offload is True and notes == []
    tree, _ = _composed(f"{actor}.param_offload=False", f"{actor}.optimizer_offload=False")
    assert tree.actor.engine.offload is False
    tree, notes = _composed("actor_rollout_ref.ref.fsdp_config.param_offload=True")
    assert tree.actor.engine.offload is False
    assert notes == [
        "verl key actor_rollout_ref.ref.fsdp_config.param_offload has no effect here: the "
        "reference has no offload setting here: it is frozen (no gradients, no optimizer "
        "state) and stays in GPU memory; actor.engine.offload moves the actor only"
    ]


def test_rollout_engine_knobs_follow_the_backend() -> None:
    roll = "actor_rollout_ref.rollout"
    knobs = (f"{roll}.tensor_model_parallel_size=2", f"{roll}.gpu_memory_utilization=0.5")
    tree, notes = _composed(*knobs, f"{roll}.name=sglang")
    assert tree.rollout.engine_kwargs == {"tp_size": 2, "mem_fraction_static": 0.5}
    assert notes == []
    tree, notes = _composed(*knobs)  # native, the default: named in one note line
    assert tree.rollout.engine_kwargs == {}
    assert len(notes) == 1 and notes[0].startswith("verl keys with no effect here: ")
    assert f"{roll}.tensor_model_parallel_size (rollout.backend=native generates" in notes[0]
    tree, notes = _composed(f"{roll}.name=vllm", f"+{roll}.engine_kwargs.vllm.max_loras=2")
    assert tree.rollout.engine_kwargs == {"max_loras": 2}
    with pytest.raises(ConfigurationError, match="set the same vllm option; keep one of them"):
        _composed(*knobs, f"{roll}.name=vllm", "+rollout.engine_kwargs.tensor_parallel_size=4")


def test_a_verl_plus_key_that_is_ours_sets_it() -> None:
    tree, _ = _composed("+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16")
    assert tree.actor.engine.fsdp.param_dtype == "bfloat16"
