"""Offline DPO with TRL's ``DPOTrainer``: the TRL column of ``bench_dpo.py``.

Same model folder (tiny Qwen2 + character tokenizer, written by ``bench_dpo.py``), same
``train.jsonl`` / ``val.jsonl`` pairs read in file order (``train_sampling_strategy=
"sequential"``), ``--batch`` pairs per optimizer step, AdamW (``adamw_torch``, betas
0.9/0.999, eps 1e-8, no weight decay), constant lr without warm-up, gradient-norm clip 1.0,
fp32 on CPU, dropout off, no gradient checkpointing, reference = a frozen copy of the
starting model (no precomputed reference log-probs).

Per step it records the loss TRL minimised (captured in ``compute_loss``, unrounded) and
TRL's own ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins`` and
``rewards/accuracies``; held-out pair accuracy and margin are TRL's evaluation
(``eval_rewards/accuracies``) before training and every ``--eval-every`` steps.

Runs in the TRL venv (``bash tools/bench/setup_trl_venv.sh``)::

    tools/bench/.venv-trl/bin/python tools/bench/dpo_trl.py --init MODEL_DIR \
        --data DATA_DIR --loss-type sigmoid --result trl.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def make_trainer_class() -> type:
    """``DPOTrainer`` that keeps each step's exact loss and reward metrics."""
    from trl import DPOTrainer

    class RecordingDPOTrainer(DPOTrainer):
        """Notes the training loss of every forward (TRL logs it rounded to 4 digits)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.step_records: list[dict[str, float]] = []

        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            result = super().compute_loss(model, inputs, *args, **kwargs)
            if self.model.training:
                loss = result[0] if isinstance(result, tuple) else result
                metrics = self._metrics["train"]
                self.step_records.append(
                    {
                        "loss": float(loss.detach()),
                        "chosen": metrics["rewards/chosen"][-1],
                        "rejected": metrics["rewards/rejected"][-1],
                        "margin": metrics["rewards/margins"][-1],
                        "accuracy": metrics["rewards/accuracies"][-1],
                    }
                )
            return result

    return RecordingDPOTrainer


def make_callback(evals: list[dict[str, float]], step_seconds: list[float]) -> Any:
    """Records each step's wall time and every evaluation's accuracy and margin."""
    from transformers import TrainerCallback

    class RecordCallback(TrainerCallback):
        """Step times (evaluation excluded) and held-out metrics."""

        def __init__(self) -> None:
            self.mark = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.mark = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_seconds.append(time.perf_counter() - self.mark)

        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            metrics = kwargs["metrics"]
            evals.append(
                {
                    "step": int(state.global_step),
                    "accuracy": float(metrics["eval_rewards/accuracies"]),
                    "margin": float(metrics["eval_rewards/margins"]),
                }
            )

    return RecordCallback()


def main(argv: list[str] | None = None) -> int:
    """Command line: offline DPO with TRL; write the run record (JSON)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--init", type=Path, required=True, help="model + tokenizer folder")
    parser.add_argument("--data", type=Path, required=True, help="train.jsonl + val.jsonl")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--loss-type", default="sigmoid")
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch", type=int, default=32, help="pairs per optimizer step")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import trl
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.init)
    model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    files = {"train": str(args.data / "train.jsonl"), "val": str(args.data / "val.jsonl")}
    data = load_dataset("json", data_files=files)
    config = DPOConfig(
        output_dir=tempfile.mkdtemp(prefix="dpo-trl-"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=len(data["val"]),
        gradient_accumulation_steps=1,
        train_sampling_strategy="sequential",
        loss_type=[args.loss_type],
        beta=args.beta,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.steps,
        disable_dropout=True,
        eval_strategy="steps",
        eval_steps=args.eval_every,
        eval_on_start=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    evals: list[dict[str, float]] = []
    step_seconds: list[float] = []
    trainer = make_trainer_class()(
        model=model,
        args=config,
        train_dataset=data["train"],
        eval_dataset=data["val"],
        processing_class=tokenizer,
        callbacks=[make_callback(evals, step_seconds)],
    )
    trainer.train()
    if not evals or evals[-1]["step"] != args.steps:
        trainer.evaluate()
    record = {
        "name": "TRL DPOTrainer",
        "loss_type": args.loss_type,
        "steps": [{"step": i + 1, **r} for i, r in enumerate(trainer.step_records)],
        "evals": evals,
        "step_seconds": step_seconds,
        "notes": f"trl {trl.__version__}, optimizer {config.optim}, threads {args.threads}",
    }
    args.result.write_text(json.dumps(record, indent=1))
    print(f"{len(step_seconds)} steps; final held-out accuracy {evals[-1]['accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
