"""The quickstart GRPO task trained with TRL's ``GRPOTrainer``: the TRL column of
``bench_grpo.py``.

Same model (a warmed-up folder written by ``grpo_plain_loop.py --save-warmup``), same
prompts in the same order, same reward, group size 8, 16 prompts per step (a generation
batch of 128), 7 new tokens, temperature 1, no KL (``beta=0``), clip 0.2, constant lr 3e-4,
AdamW without weight decay, gradient-norm clip 1.0, one update per batch. On CPU TRL needs
``use_cpu=True, bf16=False``; gradient checkpointing is off, as in the other columns.
TRL's ``dapo`` loss (its default) averages the clipped surrogate over all completion
tokens of the batch, as the plain loop does.

Step time is the wall time between two ``on_step_end`` callbacks (generation, reward,
loss, backward and the optimizer step all happen in between) less the time the callback
itself spent evaluating; greedy exact-match accuracy is measured with the task's own
evaluator every ``--eval-every`` steps, so every column is scored the same way.

Runs in the TRL venv (``bash tools/bench/setup_trl_venv.sh``):

    tools/bench/.venv-trl/bin/python tools/bench/grpo_trl.py --init WARM_DIR --result trl.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_task as task


def reverse_letters_reward_func(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """TRL reward function: the task's partial-credit reward for each completion.

    TRL passes the dataset's other columns (here ``answer``) as keyword lists.
    """
    return [task.reverse_letters_reward(c, a) for c, a in zip(completions, answer, strict=True)]


def make_callback(
    tokenizer: Any, record: task.RunRecord, eval_every: int, target: float, stop: bool
) -> Any:
    """A ``TrainerCallback`` that times steps and evaluates greedy accuracy every k steps."""
    from transformers import TrainerCallback

    val = task.validation_rows()

    class TimingEvalCallback(TrainerCallback):
        """Records each step's wall time and the accuracy curve into ``record``."""

        def __init__(self) -> None:
            self.mark = self.cpu_mark = 0.0
            self.train_seconds = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.mark, self.cpu_mark = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seconds = time.perf_counter() - self.mark
            record.step_seconds.append(seconds)
            record.step_cpu_seconds.append(time.process_time() - self.cpu_mark)
            self.train_seconds += seconds
            step = state.global_step
            if step % eval_every == 0 or step == state.max_steps:
                accuracy = task.exact_match_accuracy(kwargs["model"], tokenizer, val)
                record.evals.append(
                    {"step": step, "train_seconds": self.train_seconds, "accuracy": accuracy}
                )
                print(f"step {step:4d}  {self.train_seconds:6.1f}s  accuracy {accuracy:.3f}")
                if stop and accuracy >= target:
                    control.should_training_stop = True
            self.mark, self.cpu_mark = time.perf_counter(), time.process_time()

    return TimingEvalCallback()


def main(argv: list[str] | None = None) -> int:
    """Command line: GRPO with TRL from a warmed-up folder; write the run record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", type=Path, required=True, help="warmed-up model folder")
    parser.add_argument("--result", type=Path, help="write the run record (JSON) here")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--no-stop", action="store_true", help="run all --max-steps")
    args = parser.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    prompts_per_step, group_size = 16, 8
    tokenizer = AutoTokenizer.from_pretrained(args.init)
    model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    record = task.RunRecord(name="TRL GRPOTrainer")
    record.warmup_accuracy = task.exact_match_accuracy(model, tokenizer, task.validation_rows())
    record.evals.append({"step": 0, "train_seconds": 0.0, "accuracy": record.warmup_accuracy})
    print(f"warm-up accuracy {record.warmup_accuracy:.3f}", flush=True)
    rows = task.make_rows(args.max_steps * prompts_per_step, seed=args.seed)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="grpo-trl-"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=prompts_per_step * group_size,
        gradient_accumulation_steps=1,
        num_generations=group_size,
        max_completion_length=task.RESPONSE_LENGTH,
        temperature=1.0,
        beta=0.0,
        epsilon=0.2,
        num_iterations=1,
        learning_rate=3e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.max_steps,
        shuffle_dataset=False,  # the plain loop's prompt order
        seed=args.seed,
        logging_steps=args.eval_every,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reverse_letters_reward_func],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[
            make_callback(tokenizer, record, args.eval_every, args.target, not args.no_stop)
        ],
    )
    began = time.perf_counter()
    trainer.train()
    steps = len(record.step_seconds)
    record.notes = f"trl optimizer {config.optim}; threads {args.threads}"
    print(
        f"{steps} steps, {sum(record.step_seconds) / max(steps, 1):.3f} s/step "
        f"({sum(record.step_cpu_seconds) / max(steps, 1):.3f} s CPU), "
        f"train() wall {time.perf_counter() - began:.1f}s",
        flush=True,
    )
    if args.result is not None:
        args.result.write_text(json.dumps(asdict(record), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
