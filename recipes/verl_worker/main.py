"""Online DPO driven the way verl's "extend to a new algorithm" guide shows, on HybridFlow.

The driver builds a resource pool, wraps each role class of :mod:`recipes.verl_worker.workers`
in a ``RayClassWithInitArgs``, colocates both roles in one process per slot with
``create_colocated_worker_cls`` and ``spawn``, and runs the loop: sample, score, pair,
reference log-prob, DPO update. It is verl code with its imports changed (the README shows
the diff); the task is the quickstart's (reverse six letters) on a tiny random Qwen2.

    python -m recipes.verl_worker.main                       # 2 workers, 6 steps, CPU
    python -m recipes.verl_worker.main --steps 20 --workers 1
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from hf_controller.compat.verl import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)
from hf_protocol.compat.verl import DataProto
from recipes.verl_worker.workers import ActorRolloutWorker, ReferenceWorker


@dataclass(frozen=True)
class RunConfig:
    """What one run reads."""

    workdir: Path = Path("outputs/verl_worker")
    """Where the generated tiny model is written."""
    workers: int = 2
    """Processes, each holding both roles (data parallel)."""
    steps: int = 6
    """DPO steps."""
    prompts_per_step: int = 8
    """Prompts sampled per step (a multiple of ``workers`` keeps pairs whole per rank)."""
    samples_per_prompt: int = 4
    """Responses per prompt; the best and the worst of them make a pair."""
    epochs: int = 2
    """Optimizer steps on each step's pairs."""
    lr: float = 3e-3
    """AdamW learning rate."""
    beta: float = 0.1
    """DPO's beta."""
    seed: int = 0
    """Seed of the model, the prompts and the sampling."""


WORD_LENGTH = 6


def make_model(workdir: Path, seed: int) -> tuple[str, Any]:
    """A tiny random Qwen2 with a character tokenizer in ``workdir``; its path and tokenizer."""
    from hf_algos.data import build_char_tokenizer
    from hf_engines.testing import build_tiny_model

    model_path = str(build_tiny_model(workdir / "tiny_model", "qwen2", seed))
    return model_path, build_char_tokenizer(model_path, chat_template=None)


def make_prompts(tokenizer: Any, count: int, rng: np.random.Generator) -> DataProto:
    """``count`` prompts ``abcdef=``, their token ids and their answers (``fedcba``)."""
    words = [
        "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), WORD_LENGTH)) for _ in range(count)
    ]
    ids = tokenizer([f"{w}=" for w in words], return_tensors="pt")["input_ids"]
    answers = np.array([w[::-1] for w in words], dtype=object)
    return DataProto.from_dict({"input_ids": ids}, {"answer": answers})


def score(tokenizer: Any, batch: DataProto) -> np.ndarray:
    """The fraction of right letters in each row's response."""
    texts = tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
    answers = batch.non_tensor_batch["answer"]
    right = [
        sum(a == b for a, b in zip(text, answer, strict=False))
        for text, answer in zip(texts, answers, strict=True)
    ]
    return np.array(right) / WORD_LENGTH


def make_pairs(batch: DataProto, scores: np.ndarray, n: int) -> DataProto:
    """Per prompt, the best response (chosen) and the worst (rejected), interleaved."""
    order = []
    for prompt in range(len(batch) // n):
        group = scores[prompt * n : (prompt + 1) * n]
        order += [prompt * n + int(np.argmax(group)), prompt * n + int(np.argmin(group))]
    return batch.select_idxs(np.array(order))


def build_groups(config: RunConfig, model_path: str) -> dict[str, RayWorkerGroup]:
    """Both roles colocated in ``config.workers`` processes: verl's resource pool,
    ``RayClassWithInitArgs``, ``create_colocated_worker_cls`` and ``spawn``."""
    resource_pool = RayResourcePool(process_on_nodes=[config.workers], use_gpu=False)
    class_dict = {
        "actor_rollout": RayClassWithInitArgs(
            cls=ActorRolloutWorker,
            model_path=model_path,
            lr=config.lr,
            beta=config.beta,
            response_length=WORD_LENGTH,
        ),
        "ref": RayClassWithInitArgs(
            cls=ReferenceWorker, model_path=model_path, response_length=WORD_LENGTH
        ),
    }
    worker_dict_cls = create_colocated_worker_cls(class_dict=class_dict)
    wg_dict = RayWorkerGroup(
        resource_pool=resource_pool, ray_cls_with_init=worker_dict_cls, device_name="cpu"
    )
    groups = wg_dict.spawn(prefix_set=class_dict.keys())
    for group in groups.values():
        group.init_model()
    return groups


@dataclass
class RunResult:
    """What a run returns."""

    history: list[dict[str, float]]
    """Each step's metrics."""
    checksums_before: list[float]
    """Each rank's weight sum before training."""
    checksums_after: list[float]
    """Each rank's weight sum after training (all equal: the gradients were averaged)."""


def run(config: RunConfig) -> RunResult:
    """Train ``config.steps`` online DPO steps; their metrics."""
    model_path, tokenizer = make_model(config.workdir, config.seed)
    groups = build_groups(config, model_path)
    actor, ref = groups["actor_rollout"], groups["ref"]
    checksums_before = actor.param_checksum()
    rng = np.random.default_rng(config.seed)
    history = []
    for step in range(config.steps):
        prompts = make_prompts(tokenizer, config.prompts_per_step, rng)
        prompts = prompts.repeat(config.samples_per_prompt, interleave=True)
        gen_batch = prompts.pop(batch_keys=["input_ids"])  # as verl's trainer does
        gen_batch.meta_info = {
            "seed": config.seed * 10_000 + step,
            "eos_token_id": tokenizer.eos_token_id,
        }
        batch = prompts.union(actor.generate_sequences(gen_batch))
        scores = score(tokenizer, batch)
        pairs = make_pairs(batch, scores, config.samples_per_prompt)
        pairs.batch["ref_log_prob"] = ref.compute_ref_log_prob(pairs).batch["ref_log_prob"]
        pairs.meta_info["epochs"] = config.epochs
        output = actor.update_actor(pairs)
        metrics = output.meta_info["metrics"]  # verl's gather: {name: [one value per worker]}
        history.append(
            {
                "step": step,
                "score/mean": float(scores.mean()),
                "actor/dpo_loss": float(np.mean(metrics["actor/dpo_loss"])),
                "actor/dpo_loss_after": float(np.mean(metrics["actor/dpo_loss_after"])),
                "workers": len(set(metrics["actor/pid"])),
            }
        )
        print(history[-1])
    return RunResult(history, checksums_before, actor.param_checksum())


def main() -> None:
    """The command line: ``--steps``, ``--workers``, ``--workdir``."""
    parser = argparse.ArgumentParser(description="online DPO with verl-style workers on HybridFlow")
    parser.add_argument("--steps", type=int, default=RunConfig.steps)
    parser.add_argument("--workers", type=int, default=RunConfig.workers)
    parser.add_argument("--workdir", type=Path, default=RunConfig.workdir)
    args = parser.parse_args()
    ray.init(num_cpus=max(2, args.workers))
    torch.set_num_threads(1)
    run(RunConfig(workdir=args.workdir, steps=args.steps, workers=args.workers))
    ray.shutdown()


if __name__ == "__main__":
    main()
