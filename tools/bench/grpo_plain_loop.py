"""A plain single-process GRPO loop on the quickstart task: the reference column of
``bench_grpo.py`` and the proof that the quickstart's numbers reach the accuracy target.

What it really is: one process, one model, no workers, no DataProto.

1. Warm-up (unless ``--init`` names a warmed-up folder): supervised fine-tuning, 75 steps
   of 64 rows at lr 1e-3 (AdamW), loss on the answer and ``<eos>`` (greedy accuracy after
   it: 0.30; see :func:`sft_warmup` for why not a weaker start).
2. GRPO, each step: 16 fresh prompts x 8 samples drawn with KV-cached batched sampling at
   temperature 1; the partial-credit reward; group advantages ``(r - mean) / (std + 1e-4)``;
   one forward/backward of the clipped surrogate (clip 0.2, no KL, token mean over the
   batch) and one AdamW step at a constant lr of 3e-4 (gradient norm clipped at 1.0).
   With one update per batch the "old" log-probs equal the current ones detached (as TRL
   does); ``--old-log-probs forward`` instead computes them in a separate no-grad forward
   pass, as a trainer that keeps rollout and update apart does.
3. Greedy exact-match accuracy on a fixed 256-row validation set every ``--eval-every``
   steps; evaluation time is kept off the training clock.

Usage (from the repository root, dev venv):

    python tools/bench/grpo_plain_loop.py --result /tmp/plain.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_task as task


@dataclass
class WarmupSettings:
    """Supervised warm-up before GRPO."""

    steps: int = 75
    """Optimizer steps (75 answer-only steps leave greedy accuracy at 0.30 here; 80 reach
    0.70, so the warm-up is kept just short of learning the task)."""
    batch_size: int = 64
    """Rows per step."""
    lr: float = 1e-3
    """AdamW learning rate (constant)."""
    seed: int = 1
    """Seed of the training rows."""
    loss_on: str = "answer"
    """``answer``: loss over the answer tokens (and ``<eos>``) only, as the quickstart's SFT
    does; ``all``: next-token loss over the whole row (90 such steps leave accuracy at 0.10,
    too weak a start: see :func:`sft_warmup`)."""


@dataclass
class GRPOSettings:
    """The GRPO phase (the quickstart's numbers)."""

    prompts_per_step: int = 16
    """Distinct prompts per step."""
    group_size: int = 8
    """Samples per prompt."""
    lr: float = 3e-4
    """AdamW learning rate (constant)."""
    clip: float = 0.2
    """PPO ratio clip range (symmetric)."""
    temperature: float = 1.0
    """Sampling temperature."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (TRL's default, kept for a like-for-like comparison)."""
    max_steps: int = 1000
    """Upper bound on GRPO steps."""
    eval_every: int = 25
    """Steps between greedy evaluations."""
    target_accuracy: float = 0.9
    """Exact-match accuracy that counts as reached."""
    stop_at_target: bool = True
    """Stop at the first evaluation that reaches the target."""
    old_log_probs: str = "detach"
    """``detach`` (reuse the training forward) or ``forward`` (a separate no-grad pass)."""
    seed: int = 2
    """Seed of prompts and sampling."""


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages: reward minus its group's mean, over the group's (unbiased) std + eps.

    Shape: ``rewards`` ``(b * group_size,)`` with groups contiguous -> same shape.
    """
    groups = rewards.view(-1, group_size)
    normalized = (groups - groups.mean(dim=1, keepdim=True)) / (
        groups.std(dim=1, keepdim=True) + eps
    )
    return normalized.reshape(-1)


def clipped_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
) -> torch.Tensor:
    """PPO clipped surrogate, averaged over all unmasked tokens of the batch.

    Shapes: ``log_probs``, ``old_log_probs``, ``mask`` ``(b, r)``; ``advantages`` ``(b,)``.
    """
    ratio = torch.exp(log_probs - old_log_probs)
    adv = advantages.unsqueeze(1)
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def response_log_probs(
    model: torch.nn.Module, prompts: torch.Tensor, responses: torch.Tensor
) -> torch.Tensor:
    """Log-probs ``(b, r)`` of ``responses`` given ``prompts`` (one forward, no padding)."""
    sequences = torch.cat([prompts, responses], dim=1)
    logits = model(input_ids=sequences).logits[:, prompts.shape[1] - 1 : -1, :].float()
    return torch.log_softmax(logits, dim=-1).gather(2, responses.unsqueeze(2)).squeeze(2)


def sft_warmup(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, settings: WarmupSettings
) -> None:
    """Supervised fine-tuning on ``prompt=answer<eos>`` rows (cross-entropy, AdamW).

    Why the answer-only default: from a full-row warm-up of 90 steps (accuracy 0.10), GRPO
    with the partial-credit reward collapsed to 0 accuracy for 900 steps in both this loop
    and TRL. The reward ignores characters past the answer, so a policy that rarely gets a
    whole word right loses nothing by dropping ``<eos>`` and emitting a 7th letter, and once
    ``<eos>`` is gone no sample can be exact. From the answer-only warm-up (0.30) enough
    samples are exact to keep ``<eos>``.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    rows = task.make_rows(settings.steps * settings.batch_size, seed=settings.seed)
    eos = torch.full((settings.batch_size, 1), task.EOS_ID)
    model.train()
    for step in range(settings.steps):
        batch = rows[step * settings.batch_size : (step + 1) * settings.batch_size]
        prompts = task.encode_prompts(tokenizer, [row["prompt"] for row in batch])
        answers = tokenizer([row["answer"] for row in batch], add_special_tokens=False)
        responses = torch.cat([torch.tensor(answers["input_ids"]), eos], dim=1)
        if settings.loss_on == "answer":
            loss = -response_log_probs(model, prompts, responses).mean()
        else:
            sequences = torch.cat([prompts, responses], dim=1)
            loss = model(input_ids=sequences, labels=sequences).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def grpo_step(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    rows: list[dict[str, str]],
    settings: GRPOSettings,
    generator: torch.Generator,
) -> dict[str, float]:
    """One GRPO step on ``rows`` (the step's prompts); returns its metrics."""
    n = settings.group_size
    prompts = task.encode_prompts(tokenizer, [row["prompt"] for row in rows])
    prompts = prompts.repeat_interleave(n, dim=0)
    model.eval()  # sampling mode (the model has no dropout, so this changes no number)
    responses, _ = task.generate(
        model, prompts, temperature=settings.temperature, generator=generator
    )
    texts = task.completion_texts(tokenizer, responses)
    answers = [row["answer"] for row in rows for _ in range(n)]
    rewards = torch.tensor(
        [task.reverse_letters_reward(t, a) for t, a in zip(texts, answers, strict=True)]
    )
    advantages = group_advantages(rewards, n)
    mask = task.response_mask(responses)
    model.train()
    old: torch.Tensor | None = None
    if settings.old_log_probs == "forward":
        with torch.no_grad():
            old = response_log_probs(model, prompts, responses)
    log_probs = response_log_probs(model, prompts, responses)
    loss = clipped_policy_loss(
        log_probs, log_probs.detach() if old is None else old, advantages, mask, settings.clip
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
    optimizer.step()
    return {"loss": float(loss.detach()), "reward": float(rewards.mean())}


def train_grpo(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    settings: GRPOSettings,
    record: task.RunRecord,
) -> task.RunRecord:
    """Run GRPO until the target accuracy (or ``max_steps``); fill and return ``record``."""
    if settings.old_log_probs not in ("detach", "forward"):
        raise ValueError(f"old_log_probs={settings.old_log_probs!r}; choose 'detach' or 'forward'")
    val = task.validation_rows()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(settings.seed)
    rows = task.make_rows(settings.max_steps * settings.prompts_per_step, seed=settings.seed)
    record.evals.append({"step": 0, "train_seconds": 0.0, "accuracy": record.warmup_accuracy})
    train_seconds = 0.0
    for step in range(1, settings.max_steps + 1):
        start, cpu_start = time.perf_counter(), time.process_time()
        chunk = rows[(step - 1) * settings.prompts_per_step : step * settings.prompts_per_step]
        metrics = grpo_step(model, tokenizer, optimizer, chunk, settings, generator)
        record.step_seconds.append(time.perf_counter() - start)
        record.step_cpu_seconds.append(time.process_time() - cpu_start)
        train_seconds += record.step_seconds[-1]
        if step % settings.eval_every == 0 or step == settings.max_steps:
            accuracy = task.exact_match_accuracy(model, tokenizer, val)
            record.evals.append(
                {"step": step, "train_seconds": train_seconds, "accuracy": accuracy}
            )
            print(
                f"step {step:4d}  {train_seconds:6.1f}s  reward {metrics['reward']:.3f}  "
                f"accuracy {accuracy:.3f}",
                flush=True,
            )
            if settings.stop_at_target and accuracy >= settings.target_accuracy:
                break
    return record


def main(argv: list[str] | None = None) -> int:
    """Command line: warm up (or load a warmed-up folder), run GRPO, write the record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", type=Path, help="start GRPO from this warmed-up model folder")
    parser.add_argument("--save-warmup", type=Path, help="save the warmed-up model here")
    parser.add_argument("--warmup-only", action="store_true", help="stop after the warm-up")
    parser.add_argument("--warmup-steps", type=int, default=WarmupSettings.steps)
    parser.add_argument("--warmup-loss", choices=("all", "answer"), default=WarmupSettings.loss_on)
    parser.add_argument("--result", type=Path, help="write the run record (JSON) here")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--model-seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=GRPOSettings.max_steps)
    parser.add_argument("--eval-every", type=int, default=GRPOSettings.eval_every)
    parser.add_argument("--seed", type=int, default=GRPOSettings.seed)
    parser.add_argument("--no-stop", action="store_true", help="run all --max-steps")
    parser.add_argument("--old-log-probs", choices=("detach", "forward"), default="detach")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    began = time.perf_counter()
    record = task.RunRecord(name="plain torch loop")
    if args.init is None:
        folder = Path(tempfile.mkdtemp(prefix="grpo-task-"))
        task.build_task_model(folder, seed=args.model_seed)
    else:
        folder = args.init
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if args.init is None:
        warm_start = time.perf_counter()
        sft_warmup(
            model, tokenizer, WarmupSettings(steps=args.warmup_steps, loss_on=args.warmup_loss)
        )
        record.notes = f"warm-up {time.perf_counter() - warm_start:.1f}s; "
    record.warmup_accuracy = task.exact_match_accuracy(model, tokenizer, task.validation_rows())
    print(f"warm-up accuracy {record.warmup_accuracy:.3f}", flush=True)
    if args.save_warmup is not None:
        model.save_pretrained(args.save_warmup)
        tokenizer.save_pretrained(args.save_warmup)
    if not args.warmup_only:
        settings = GRPOSettings(
            max_steps=args.max_steps,
            eval_every=args.eval_every,
            stop_at_target=not args.no_stop,
            old_log_probs=args.old_log_probs,
            seed=args.seed,
        )
        record.notes += f"old log-probs: {settings.old_log_probs}; threads {args.threads}"
        train_grpo(model, tokenizer, settings, record)
        steps = len(record.step_seconds)
        print(
            f"{steps} steps, {sum(record.step_seconds) / max(steps, 1):.3f} s/step "
            f"({sum(record.step_cpu_seconds) / max(steps, 1):.3f} s CPU), "
            f"total wall {time.perf_counter() - began:.1f}s",
            flush=True,
        )
    if args.result is not None:
        args.result.write_text(json.dumps(asdict(record), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
