"""A plain single-process GRPO loop on SmolLM2 and chain_sum: the reference column of
``bench_real_grpo.py``.

What it really is: one process, one ``transformers`` model, no workers. Each step takes the
next ``prompts_per_step`` rows of the training file in order; samples ``group_size``
responses per prompt in one batched ``model.generate`` (pure sampling at the temperature,
left-padded prompts); scores them with HybridFlow's reasoning-gym scorer; takes GRPO
advantages ``(r - mean) / (std + 1e-6)`` per group (unbiased std, as
``hf_algos.advantages.compute_grpo_advantage``); and makes one AdamW step on the clipped
surrogate averaged over every response token of the step (token-mean), accumulated over
micro-batches of 16 rows, with the gradient norm clipped. Generation and forward run in the
settings' precision (``bfloat16``: CPU autocast over the fp32 weights). With one update per
batch the old log-probs are the current ones detached (ratio 1, as TRL has it). Validation
(greedy and sampled accuracy, :func:`real_grpo_task.evaluate`) is kept off the training
clock.

Usage (dev venv; the driver writes the files):

    python tools/bench/real_grpo_plain.py --settings S.json --train T.jsonl --val V.jsonl \
        --result plain.json --steps 24 --eval-every 8 --seed 0
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_grpo_task as task


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: reward minus its group's mean over the group's unbiased std + eps.

    Shape: ``rewards`` ``(b * group_size,)`` with groups contiguous -> same shape.
    """
    groups = rewards.view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    return (centred / (groups.std(dim=1, keepdim=True) + eps)).reshape(-1)


def response_log_probs(
    model: Any, prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor
) -> torch.Tensor:
    """Log-probs ``(b, r)`` of ``responses`` after the left-padded ``prompts`` ``(b, p)``
    (positions counted from each row's first real token, as ``generate`` counts them)."""
    ids = torch.cat([prompts, responses], dim=1)
    attention = torch.cat([prompt_mask, torch.ones_like(responses)], dim=1)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    width = responses.shape[1]
    out = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=width + 1
    )
    logits = out.logits[:, :-1, :].float()
    return torch.log_softmax(logits, dim=-1).gather(2, responses.unsqueeze(2)).squeeze(2)


def grpo_step(
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    rows: list[dict[str, Any]],
    settings: task.RealSettings,
) -> float:
    """One GRPO step on ``rows`` (the step's prompts); returns the mean reward."""
    n = settings.group_size
    ids = [task.prompt_ids(tokenizer, row["prompt"]) for row in rows for _ in range(n)]
    sampling = task.generation_config(tokenizer, settings.max_new_tokens, settings.temperature)
    with task.autocast(settings):
        prompts, prompt_mask, responses, mask = task.generate(model, tokenizer, ids, sampling)
    texts = task.decode(tokenizer, responses, mask)
    repeated = [row for row in rows for _ in range(n)]
    rewards = torch.tensor([task.score(t, r) for t, r in zip(texts, repeated, strict=True)])
    advantages = group_advantages(rewards, n)
    tokens = mask.sum().clamp(min=1.0)  # token-mean over the whole step, not per micro-batch
    model.train()
    optimizer.zero_grad(set_to_none=True)
    for start in range(0, len(ids), settings.micro_batch_rows):
        part = slice(start, start + settings.micro_batch_rows)
        with task.autocast(settings):
            log_probs = response_log_probs(model, prompts[part], prompt_mask[part], responses[part])
        ratio = torch.exp(log_probs - log_probs.detach())
        adv = advantages[part].unsqueeze(1)
        clipped = ratio.clamp(1 - settings.clip_low, 1 + settings.clip_high) * adv
        per_token = -torch.minimum(ratio * adv, clipped)
        ((per_token * mask[part]).sum() / tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    optimizer.step()
    return float(rewards.mean())


def main(argv: list[str] | None = None) -> int:
    """Command line: GRPO from the model in the settings; write the run record."""
    args = task.column_args(__doc__ or "", argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    settings = task.RealSettings.read(args.settings)
    tokenizer = AutoTokenizer.from_pretrained(settings.model)
    model = AutoModelForCausalLM.from_pretrained(settings.model, dtype=torch.float32)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=settings.lr,
        betas=settings.betas,
        eps=settings.adam_eps,
        weight_decay=settings.weight_decay,
    )
    train, val = task.read_rows(args.train), task.read_rows(args.val)
    record = task.RealRunRecord(
        name="plain torch loop", notes=f"threads {args.threads}, {settings.precision}"
    )

    def validate(step: int, train_seconds: float) -> None:
        with task.autocast(settings):
            accuracy = task.evaluate(model, tokenizer, val, settings, seed=args.seed * 1000 + step)
        record.evals.append({"step": step, "train_seconds": train_seconds, **accuracy})
        print(f"step {step:3d}  {train_seconds:7.1f}s  {accuracy}", flush=True)

    validate(0, 0.0)
    per_step = settings.prompts_per_step
    for step in range(1, args.steps + 1):
        start, cpu_start = time.perf_counter(), time.process_time()
        rows = train[(step - 1) * per_step : step * per_step]
        record.rewards.append(grpo_step(model, tokenizer, optimizer, rows, settings))
        record.step_seconds.append(time.perf_counter() - start)
        record.step_cpu_seconds.append(time.process_time() - cpu_start)
        print(
            f"step {step:3d}  {record.step_seconds[-1]:.1f}s  reward {record.rewards[-1]:.3f}",
            flush=True,
        )
        if step % args.eval_every == 0 or step == args.steps:
            validate(step, sum(record.step_seconds))
    args.result.write_text(json.dumps(asdict(record), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
