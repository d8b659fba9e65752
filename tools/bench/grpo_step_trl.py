"""The TRL half of ``grpo_step_check.py``: one GRPO step of TRL's ``GRPOTrainer`` on a
fixed batch; runs in the TRL venv (``bash tools/bench/setup_trl_venv.sh``).

Reads the batch file ``grpo_step_check.py`` wrote (prompt and completion ids and masks,
rewards, the old per-token log-probs, the group size) and, for each case (a TRL
``loss_type`` and ``scale_rewards``), builds a ``GRPOTrainer`` on the saved model and
bypasses generation: the input dict that ``_generate_and_score_completions`` returns
(``prompt_ids``, ``prompt_mask``, ``completion_ids``, ``completion_mask``, ``advantages``,
``num_items_in_batch``, ``old_per_token_logps``) is built here, with the advantages
computed by the lines of ``_generate_and_score_completions`` (group mean, TRL's
``nanstd``, ``+ 1e-4``), and handed to the trainer's own ``compute_loss``. Then
``backward`` and one step of the optimizer the trainer builds itself
(``create_optimizer``). Writes ``{case: {loss, advantages, grads, weights}}`` to a
``.pt`` file. Uses only torch, transformers and trl, no hf_* package::

    tools/bench/.venv-trl/bin/python tools/bench/grpo_step_trl.py BATCH.pt OUT.pt dapo:group ...
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import torch


def trl_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str) -> torch.Tensor:
    """GRPO advantages as ``GRPOTrainer._generate_and_score_completions`` computes them
    (``multi_objective_aggregation="sum_then_normalize"``, one reward function).

    Shape: ``rewards`` ``(B,)``, rows of a group adjacent; returns ``(B,)``.
    """
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, group_size)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size, dim=0)
    std = nanstd(grouped, dim=1).repeat_interleave(group_size, dim=0)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def make_trainer(
    model_dir: str, batch: dict[str, Any], loss_type: str, scale: str, level: str
) -> Any:
    """A ``GRPOTrainer`` for one step: no KL (``beta=0``), clip 0.2, AdamW, no decay;
    ``level`` is the ``importance_sampling_level`` (``token``; ``sequence`` for GSPO)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rows = batch["completion_ids"].shape[0]
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="grpo-step-trl-"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=1,
        num_generations=batch["group_size"],
        max_completion_length=batch["completion_ids"].shape[1],
        loss_type=loss_type,
        scale_rewards=scale,
        importance_sampling_level=level,
        beta=0.0,
        epsilon=0.2,
        num_iterations=1,
        learning_rate=batch["lr"],
        weight_decay=0.0,
        max_grad_norm=0.0,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=config,
        train_dataset=Dataset.from_list([{"prompt": "a"}] * rows),
        processing_class=tokenizer,
    )
    # Set by Trainer's training loop; one step without accumulation.
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def run_case(model_dir: str, batch: dict[str, Any], case: str) -> dict[str, Any]:
    """Loss, advantages, gradients and post-step weights of one TRL step; ``case`` is
    ``loss_type:scale_rewards[:importance_sampling_level]``."""
    loss_type, scale, *rest = case.split(":")
    trainer = make_trainer(model_dir, batch, loss_type, scale, rest[0] if rest else "token")
    model = trainer.model
    model.train()
    advantages = trl_advantages(batch["rewards"], batch["group_size"], scale)
    mask = batch["completion_mask"]
    inputs = {
        "prompt_ids": batch["prompt_ids"],
        "prompt_mask": batch["prompt_mask"],
        "completion_ids": batch["completion_ids"],
        "completion_mask": mask,
        "advantages": advantages,
        "num_items_in_batch": mask.sum(),
        "old_per_token_logps": batch["old_log_probs"],
    }
    trainer.create_optimizer()
    trainer.optimizer.zero_grad()
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    params = dict(model.named_parameters())
    grads = {name: p.grad.detach().clone() for name, p in params.items() if p.grad is not None}
    trainer.optimizer.step()
    weights = {name: p.detach().clone() for name, p in params.items()}
    return {
        "loss": float(loss.detach()),
        "advantages": advantages,
        "grads": grads,
        "weights": weights,
        "optimizer": type(trainer.optimizer).__name__,
    }


def main(argv: list[str]) -> int:
    """``BATCH.pt OUT.pt loss_type:scale_rewards[:level] ...``: run each case, save the results."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)
    batch_file, out_file, *cases = argv
    batch = torch.load(batch_file)
    results = {}
    for case in cases:
        results[case] = run_case(batch["model_dir"], batch, case)
        print(f"TRL {case}: loss {results[case]['loss']:.9f}", flush=True)
    torch.save(results, out_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
