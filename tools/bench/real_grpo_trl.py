"""SmolLM2 on chain_sum trained with TRL's ``GRPOTrainer``: the TRL column of
``bench_real_grpo.py``.

The settings are the driver's (HybridFlow's resolved config): ``num_generations`` =
group size; ``per_device_train_batch_size`` = 16 rows with ``gradient_accumulation_steps``
making one generation batch of ``prompts x group`` rows, and one optimizer step per batch
(``steps_per_generation`` = the accumulation steps, ``num_iterations=1``); temperature with
no top-k / top-p; ``beta=0`` (no KL, no reference model); ``epsilon`` / ``epsilon_high``
the clip range; ``loss_type="dapo"`` (the clipped surrogate averaged over every completion
token of the generation batch: token-mean); AdamW at a constant lr, no warm-up, the weight
decay and gradient clip of the config; ``bf16`` when the settings' precision is ``bfloat16``
(accelerate's CPU autocast over the fp32 weights, generation included). The prompts are the
rows' chat messages (TRL renders them with the chat template and a generation prompt) in
file order (``shuffle_dataset=False``); the reward is HybridFlow's reasoning-gym scorer
(:func:`real_grpo_task.score`).

Step time is the wall time between two ``on_step_end`` callbacks less the callback's own
validation (the shared evaluator, :func:`real_grpo_task.evaluate`).

Runs in the TRL venv (``bash tools/bench/setup_trl_venv.sh``).
"""

from __future__ import annotations

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
import real_grpo_task as task


def chain_sum_reward(
    completions: list[list[dict[str, str]]],
    reward_model: list[dict[str, Any]],
    extra_info: list[dict[str, Any]],
    **_: Any,
) -> list[float]:
    """TRL reward function: HybridFlow's reasoning-gym score of each completion.

    Conversational prompts give completions as ``[{"role": "assistant", "content": ...}]``;
    TRL passes the dataset's other columns as keyword lists.
    """
    return [
        task.score(c[0]["content"], {"reward_model": truth, "extra_info": info})
        for c, truth, info in zip(completions, reward_model, extra_info, strict=True)
    ]


def make_callback(
    tokenizer: Any,
    val: list[dict[str, Any]],
    settings: task.RealSettings,
    record: task.RealRunRecord,
    eval_every: int,
    seed: int,
) -> Any:
    """A ``TrainerCallback`` that times steps and validates every ``eval_every`` steps."""
    from transformers import TrainerCallback

    class TimingEvalCallback(TrainerCallback):
        """Records each step's wall time and the validation curve into ``record``."""

        def __init__(self) -> None:
            self.mark = self.cpu_mark = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.mark, self.cpu_mark = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record.step_seconds.append(time.perf_counter() - self.mark)
            record.step_cpu_seconds.append(time.process_time() - self.cpu_mark)
            step = state.global_step
            print(f"step {step:3d}  {record.step_seconds[-1]:.1f}s", flush=True)
            if step % eval_every == 0 or step == state.max_steps:
                model = kwargs["model"]
                with task.autocast(settings):
                    accuracy = task.evaluate(model, tokenizer, val, settings, seed * 1000 + step)
                seconds = sum(record.step_seconds)
                record.evals.append({"step": step, "train_seconds": seconds, **accuracy})
                print(f"step {step:3d}  {seconds:7.1f}s  {accuracy}", flush=True)
            self.mark, self.cpu_mark = time.perf_counter(), time.process_time()

    return TimingEvalCallback()


def main(argv: list[str] | None = None) -> int:
    """Command line: GRPO with TRL from the model in the settings; write the run record."""
    args = task.column_args(__doc__ or "", argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    settings = task.RealSettings.read(args.settings)
    tokenizer = AutoTokenizer.from_pretrained(settings.model)
    model = AutoModelForCausalLM.from_pretrained(settings.model, dtype=torch.float32)
    train, val = task.read_rows(args.train), task.read_rows(args.val)
    record = task.RealRunRecord(name="TRL GRPOTrainer")
    with task.autocast(settings):
        accuracy = task.evaluate(model, tokenizer, val, settings, seed=args.seed * 1000)
    record.evals.append({"step": 0, "train_seconds": 0.0, **accuracy})
    print(f"step   0  {accuracy}", flush=True)
    batch_rows = settings.prompts_per_step * settings.group_size
    accumulation = batch_rows // settings.micro_batch_rows
    rows = train[: args.steps * settings.prompts_per_step]
    columns = [{k: r[k] for k in ("prompt", "reward_model", "extra_info")} for r in rows]
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="real-grpo-trl-"),
        use_cpu=True,
        bf16=settings.precision == "bfloat16",  # accelerate's autocast over fp32 weights
        gradient_checkpointing=False,
        per_device_train_batch_size=settings.micro_batch_rows,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        num_generations=settings.group_size,
        num_iterations=1,
        max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=settings.clip_low,
        epsilon_high=settings.clip_high,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=settings.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.betas[0],
        adam_beta2=settings.betas[1],
        adam_epsilon=settings.adam_eps,
        max_grad_norm=settings.grad_clip,
        max_steps=args.steps,
        shuffle_dataset=False,  # the other columns' prompt order
        seed=args.seed,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[chain_sum_reward],
        args=config,
        train_dataset=Dataset.from_list(columns),
        processing_class=tokenizer,
        callbacks=[make_callback(tokenizer, val, settings, record, args.eval_every, args.seed)],
    )
    trainer.train()
    record.rewards = [float(h["reward"]) for h in trainer.state.log_history if "reward" in h]
    record.notes = f"trl optimizer {config.optim}; threads {args.threads}"
    args.result.write_text(json.dumps(asdict(record), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
