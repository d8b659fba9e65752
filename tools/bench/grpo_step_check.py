"""One GRPO step of HybridFlow against TRL's ``GRPOTrainer`` on a fixed batch: the policy
loss, every parameter's gradient and the weights after the optimizer step must agree.

A correctness check independent of learning noise. The batch is fixed: 4 prompts x 4
completions of the quickstart task (its tokenizer and tiny random Qwen2, saved to a
folder), completions of 1-7 tokens (right-padded, so the masks differ per row), one
scalar reward per completion (one group with equal rewards, whose advantages must be 0),
and "old" log-probs = the model's own log-probs plus fixed noise in [-0.3, 0.3], so the
ratios are off 1 and the 0.2 clip is hit on some tokens. Every prompt has the same length
(8 tokens): TRL does not pass ``position_ids`` and a left-padded prompt would get other
positions than HybridFlow gives it (positions counted over the attention mask).

Each case pairs an HybridFlow setting with the TRL ``loss_type`` that aggregates the same
way (no KL, ``beta=0``, clip 0.2 both sides, AdamW lr 1e-3 without weight decay or
gradient clipping):

==========================  ===========  ==========================================
``actor.loss_agg_mode``     TRL          both: ``sum(l*m) / ...``
==========================  ===========  ==========================================
token-mean                  ``bnpo``     all valid tokens of the batch
token-mean                  ``dapo``     all valid tokens (``num_items_in_batch``)
seq-mean-token-mean         ``grpo``     per-sequence token mean, mean over sequences
seq-mean-token-sum-norm     ``dr_grpo``  per-sequence sum / max_completion_length,
                                         mean over sequences; advantages not / std
seq-mean-token-mean + gspo  ``grpo``,    GSPO: sequence-level ratio
                            sequence IS
==========================  ===========  ==========================================

HybridFlow side (this process, dev venv): the advantages from the registered ``grpo``
estimator (``compute_advantage``, ``epsilon=1e-4`` as TRL adds to the std; TRL's
``scale_rewards="none"`` is ``norm_adv_by_std=False``), then ``FSDPEngine.train_step``
(one gloo rank, micro-batches of 4 rows, so the loss goes through the engine's global
token/sequence shares) with ``ppo_actor_loss`` bound as the trainer binds it
(``hf_algos.trainers.roles.workers.actor_class``). Gradients are read in an optimizer
step-pre-hook, i.e. exactly what AdamW steps on. TRL side: ``grpo_step_trl.py`` in the
TRL venv (see its docstring). Prints one row per case and exits 1 if a case is off by
more than ``--tol`` on the loss, the advantages, the gradients (relative to the largest) or
the weights where ``|grad| >= 1e-6`` (AdamW's first step, ``lr * g / (|g| + 1e-8)``, turns
float noise of a gradient near 1e-8 into a visible weight difference; the table shows the
overall largest too)::

    python tools/bench/grpo_step_check.py [--trl-python tools/bench/.venv-trl/bin/python]
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import grpo_task as task  # noqa: E402

from hf_algos.advantages import compute_advantage  # noqa: E402
from hf_algos.losses import ppo_actor_loss  # noqa: E402
from hf_engines import EngineConfig, FSDPEngine, config_from_dict  # noqa: E402
from hf_protocol import DataProto, build_prompt_response_batch, fields  # noqa: E402

PROMPTS, GROUP, LR, MICRO_BATCH = 4, 4, 1e-3, 4
STEADY = 1e-6
"""Gradient magnitude above which AdamW's first update no longer amplifies float noise."""
DEFAULT_TRL_PYTHON = HERE / ".venv-trl" / "bin" / "python"


@dataclass(frozen=True)
class Case:
    """One comparison: HybridFlow's loss settings and the TRL settings that should match."""

    loss_agg_mode: str
    policy_loss: str
    norm_adv_by_std: bool
    trl: str
    """``loss_type:scale_rewards[:importance_sampling_level]`` for ``grpo_step_trl.py``."""


CASES = (
    Case("token-mean", "ppo", True, "bnpo:group"),
    Case("token-mean", "ppo", True, "dapo:group"),
    Case("seq-mean-token-mean", "ppo", True, "grpo:group"),
    Case("seq-mean-token-sum-norm", "ppo", False, "dr_grpo:none"),
    Case("seq-mean-token-mean", "gspo", True, "grpo:group:sequence"),
)


def make_batch(model_dir: Path, seed: int = 0) -> dict[str, Any]:
    """The fixed batch both sides train on (tensors; rows of a group adjacent)."""
    from transformers import AutoModelForCausalLM

    generator = torch.Generator().manual_seed(seed)
    tokenizer = task.build_task_tokenizer()
    rows = task.make_rows(PROMPTS, seed=seed)
    prompt_ids = task.encode_prompts(tokenizer, [r["prompt"] for r in rows])
    prompt_ids = prompt_ids.repeat_interleave(GROUP, dim=0)
    count, width = PROMPTS * GROUP, task.RESPONSE_LENGTH
    lengths = torch.randint(1, width + 1, (count,), generator=generator)
    letters = torch.randint(4, len(task.SYMBOLS), (count, width), generator=generator)
    positions = torch.arange(width).expand(count, width)
    mask = (positions < lengths.unsqueeze(1)).long()
    # A short completion ends with <eos>, as a sampled one would.
    completion_ids = torch.where(positions == (lengths - 1).unsqueeze(1), task.EOS_ID, letters)
    completion_ids = torch.where(lengths.unsqueeze(1) == width, letters, completion_ids)
    completion_ids = completion_ids * mask  # pad id 0 after the end
    rewards = torch.randint(-2, 5, (count,), generator=generator).float() / 4
    rewards[GROUP : 2 * GROUP] = 0.5  # a group without spread: its advantages must be 0
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        logits = model(input_ids=input_ids).logits[:, -width - 1 : -1]
        own = torch.log_softmax(logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    noise = (torch.rand(count, width, generator=generator) - 0.5) * 0.6
    return {
        "model_dir": str(model_dir),
        "group_size": GROUP,
        "lr": LR,
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "rewards": rewards,
        "old_log_probs": (own + noise) * mask,
    }


def to_dataproto(batch: dict[str, Any]) -> DataProto:
    """The batch in HybridFlow's layout, reward on each completion's last token, uid column."""
    mask = batch["completion_mask"]
    responses = [
        row[: int(m.sum())].tolist() for row, m in zip(batch["completion_ids"], mask, strict=True)
    ]
    count = len(responses)
    data = build_prompt_response_batch(
        batch["prompt_ids"].tolist(),
        responses,
        pad_id=task.PAD_ID,
        response_width=mask.shape[1],
        non_tensors={fields.UID: np.array([str(i // GROUP) for i in range(count)], dtype=object)},
        meta_info={fields.TEMPERATURE: 1.0},
    )
    last = mask.sum(-1) - 1
    rewards = torch.zeros(mask.shape, dtype=torch.float32)
    rewards[torch.arange(count), last] = batch["rewards"]
    assert data.batch is not None
    data.batch[fields.TOKEN_LEVEL_REWARDS] = rewards
    data.batch[fields.OLD_LOG_PROBS] = batch["old_log_probs"]
    return data


def hybridflow_step(batch: dict[str, Any], case: Case) -> dict[str, Any]:
    """Advantages, loss, gradients and post-step weights of one HybridFlow actor step."""
    data = to_dataproto(batch)
    compute_advantage(data, "grpo", norm_adv_by_std=case.norm_adv_by_std, epsilon=1e-4)
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"path": batch["model_dir"], "seed": 0},
            "optim": {"lr": LR, "weight_decay": 0.0, "grad_clip": None},
            "micro_batch": {"micro_batch_size": MICRO_BATCH},
        },
    )
    engine = FSDPEngine(config)
    names = {id(p): name for name, p in engine.model.named_parameters()}
    grads: dict[str, torch.Tensor] = {}

    def capture(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grads[names[id(p)]] = _full(p.grad).clone()

    engine.optimizer.register_step_pre_hook(capture)
    loss_fn = functools.partial(
        ppo_actor_loss,
        clip_low=0.2,
        clip_high=0.2,
        loss_agg_mode=case.loss_agg_mode,
        policy_loss=case.policy_loss,
    )
    metrics = engine.train_step(data, loss_fn)
    weights = {name: _full(p.detach()).clone() for name, p in engine.model.named_parameters()}
    assert data.batch is not None
    advantages = data.batch[fields.ADVANTAGES]
    return {
        "loss": metrics["loss"],
        "advantages": advantages[torch.arange(len(data)), 0],
        "grads": grads,
        "weights": weights,
        "grad_norm": metrics["grad_norm"],
    }


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A (possibly sharded DTensor) tensor as a plain full tensor."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def max_diff(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Largest absolute difference over all tensors, and it over the largest magnitude."""
    if set(ours) != set(theirs):
        raise ValueError(f"parameter names differ: {sorted(set(ours) ^ set(theirs))}")
    diff = max(float((ours[k] - theirs[k]).abs().max()) for k in ours)
    scale = max(float(theirs[k].abs().max()) for k in ours)
    return diff, diff / scale


def compare(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """The differences the report prints for one case."""
    grad_abs, grad_rel = max_diff(ours["grads"], theirs["grads"])
    weight_abs, weight_rel = max_diff(ours["weights"], theirs["weights"])
    # AdamW's first update is lr * g / (|g| + eps), eps 1e-8: where |g| is near eps, a
    # 1e-9 difference of g (float noise at 1e-7 of the largest gradient) moves the update by
    # a good fraction of lr. Away from eps the update is insensitive to such noise.
    steady = max(
        float(
            (ours["weights"][k] - theirs["weights"][k])[theirs["grads"][k].abs() >= STEADY]
            .abs()
            .max()
        )
        for k in theirs["grads"]
    )
    trl_norm = float(
        torch.linalg.vector_norm(torch.cat([g.flatten() for g in theirs["grads"].values()]))
    )
    return {
        "loss_hybridflow": ours["loss"],
        "loss_trl": theirs["loss"],
        "loss_abs": abs(ours["loss"] - theirs["loss"]),
        "adv_abs": float((ours["advantages"] - theirs["advantages"]).abs().max()),
        "grad_norm_hybridflow": ours["grad_norm"],
        "grad_norm_trl": trl_norm,
        "grad_abs": grad_abs,
        "grad_rel": grad_rel,
        "weight_abs": weight_abs,
        "weight_rel": weight_rel,
        "weight_abs_steady": steady,
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: build the batch, run both sides, print the table, check ``--tol``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON)
    parser.add_argument(
        "--tol",
        type=float,
        default=1e-5,
        help="largest accepted loss and advantage difference, gradient difference relative to "
        "the largest gradient, and weight difference where |grad| >= 1e-6",
    )
    parser.add_argument("--result", type=Path, help="write the table (JSON) here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-step-"))
    model_dir = task.build_task_model(workdir / "model", seed=0)
    batch = make_batch(model_dir)
    torch.save(batch, workdir / "batch.pt")
    trl_out = workdir / "trl.pt"
    command = [str(args.trl_python), str(HERE / "grpo_step_trl.py"), str(workdir / "batch.pt")]
    subprocess.run([*command, str(trl_out), *[c.trl for c in CASES]], check=True)
    trl = torch.load(trl_out)
    dist.init_process_group("gloo", init_method=f"file://{workdir / 'pg'}", rank=0, world_size=1)
    rows = []
    try:
        for case in CASES:
            row: dict[str, object] = {
                "hybridflow": f"{case.loss_agg_mode} ({case.policy_loss})",
                "trl": case.trl,
            }
            row.update(compare(hybridflow_step(batch, case), trl[case.trl]))
            rows.append(row)
    finally:
        dist.destroy_process_group()
    failed = print_table(rows, args.tol)
    if args.result:
        args.result.write_text(json.dumps(rows, indent=2))
    return 1 if failed else 0


def print_table(rows: list[dict[str, Any]], tol: float) -> bool:
    """Print a markdown table of ``rows``; return whether a row is off by more than ``tol``."""
    print(
        "| HybridFlow | TRL | loss (HybridFlow) | loss diff | advantages diff "
        "| grads max diff (relative) | weights max diff (/lr) | weights diff, |g| >= 1e-6 | ok |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for r in rows:
        ok = max(r["loss_abs"], r["adv_abs"], r["grad_rel"], r["weight_abs_steady"]) <= tol
        failed |= not ok
        print(
            f"| {r['hybridflow']} | {r['trl']} | {r['loss_hybridflow']:.7f} | {r['loss_abs']:.1e} "
            f"| {r['adv_abs']:.1e} | {r['grad_abs']:.1e} ({r['grad_rel']:.1e}) "
            f"| {r['weight_abs']:.1e} ({r['weight_abs'] / LR:.2f}) | {r['weight_abs_steady']:.1e} "
            f"| {'yes' if ok else 'NO'} |"
        )
    return failed


if __name__ == "__main__":
    sys.exit(main())
