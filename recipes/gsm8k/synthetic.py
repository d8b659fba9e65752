"""A CPU try-out of the GSM8K recipes: a tiny GSM8K look-alike and a tiny random model.

The generated files have the layout of the real dataset's (``question`` / ``answer``
columns, ``main/train-*.parquet`` and ``main/test-*.parquet``), so ``prepare_data`` and the
recipes run, and are tested, on a machine with neither the dataset nor a GPU. The problems
are short so that a character-level tokenizer keeps them within the tiny model's context.
The model is random: the run shows the pipeline working, not learning.

    python -m recipes.gsm8k.synthetic --out /tmp/gsm8k_cpu    # prints the commands to run
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from hf_algos.data import build_char_tokenizer, write_rows
from hf_engines.testing import build_tiny_model
from recipes.gsm8k.prepare_data import prepare_gsm8k

_NAMES = ("Ann", "Bo", "Cy", "Di", "Ed", "Flo")
_ITEMS = ("apples", "pens", "cards", "eggs")

CPU_OVERRIDES: tuple[str, ...] = (
    "rollout.backend=native",
    "rollout.engine_kwargs={}",  # the vLLM options mean nothing to the native backend
    "trainer.use_gpu=false",
    "trainer.n_workers=1",
    "actor.engine.fsdp.param_dtype=float32",
    "actor.engine.fsdp.activation_checkpointing=false",
    "data.max_prompt_length=160",
    "data.train_batch_size=2",
    "rollout.n=2",
    "rollout.max_new_tokens=16",
    "rollout.max_model_len=256",
    "actor.ppo_mini_batch_size=4",
    "actor.engine.micro_batch.micro_batch_size=2",
    "actor.engine.optim.lr=1e-4",
    "reward.num_workers=1",
    "trainer.total_training_steps=2",
    "trainer.test_freq=2",
    "trainer.val_before_train=false",
    "trainer.save_freq=0",
    "trainer.loggers=[jsonl]",
    "trainer.progress_bar=false",
    "trainer.resume_mode=disable",
)
"""Overrides that turn a GSM8K recipe's GPU config into a 2-step CPU run of a tiny model
(critic keys are added by the PPO recipe's test)."""


def make_problem(rng: random.Random) -> dict[str, str]:
    """One word problem and its worked answer ending in ``#### <number>``."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    start, more = rng.randint(2, 9), rng.randint(2, 9)
    total = start + more
    question = f"{name} has {start} {item} and gets {more} more. How many {item} now?"
    answer = f"{name} has {start} + {more} = {total} {item}.\n#### {total}"
    return {"question": question, "answer": answer}


def write_synthetic_gsm8k(directory: Path, train: int = 32, test: int = 4, seed: int = 0) -> Path:
    """Write ``main/train-00000-of-00001.parquet`` and the test shard under ``directory``."""
    rng = random.Random(seed)
    for split, count in (("train", train), ("test", test)):
        rows = [make_problem(rng) for _ in range(count)]
        write_rows(rows, directory / "main" / f"{split}-00000-of-00001.parquet")
    return directory


def build_tiny_setup(directory: Path) -> tuple[Path, Path]:
    """A tiny random Qwen2 with a character tokenizer (chat template included) and prepared
    synthetic GSM8K data under ``directory``; returns ``(model_dir, data_dir)``."""
    model_dir = build_tiny_model(directory / "model", "qwen2")
    build_char_tokenizer(model_dir)
    source = write_synthetic_gsm8k(directory / "gsm8k_raw")
    data_dir = directory / "data"
    prepare_gsm8k(source, data_dir)
    return model_dir, data_dir


def cpu_command(recipe: str, model_dir: Path, data_dir: Path, output_dir: Path) -> str:
    """The command line that runs ``recipe`` on CPU with the tiny setup."""
    paths = [
        f"recipe.model_path={model_dir}",
        f"recipe.output_dir={output_dir}",
        f"data.train_files=[{data_dir / 'train.parquet'}]",
        f"data.val_files=[{data_dir / 'test.parquet'}]",
    ]
    return " ".join([f"python -m recipes.{recipe}.main", *paths, *CPU_OVERRIDES])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/gsm8k_cpu"), help="output folder")
    out = parser.parse_args().out.resolve()
    model, data = build_tiny_setup(out)
    print(f"tiny model: {model}\ndata: {data}\nrun on CPU:")
    print("  " + cpu_command("gsm8k_grpo", model, data, out / "grpo"))
