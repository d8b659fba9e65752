"""``hybridflow generate``: completions for a file of prompts, from the training stack.

The same pieces as a training run, minus the training: the config's tokenizer and prompt
formatting (``data.*``: chat template, system prompt, ``max_prompt_length``), its actor model
(``actor.engine.model.path``, e.g. an exported run) or, as ``hybridflow eval`` does, the
actor of the checkpoint ``trainer.resume_mode`` names (``path``: ``trainer.resume_from``;
``auto``: the latest in ``trainer.checkpoint_dir``, if any; ``disable``: none), loaded into
the rollout by a weight sync, and its rollout (``rollout.backend``,
``rollout.max_new_tokens``, temperature, top-p).
Rows need only a prompt (``data.prompt_key``); no reward is built. Each answer is one line
of the output jsonl: ``{"index", "sample", "prompt", "completion"}``, in prompt order;
nothing else is written (no run directory, nothing next to the checkpoint).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from hf_algos.checkpoint import CheckpointManager
from hf_algos.config.loading import config_to_dict
from hf_algos.config.root import RLConfig
from hf_algos.data.loader import CollatingDataset, all_batches
from hf_algos.data.prompts import announce_prompt_format
from hf_algos.data.rl_dataset import rl_dataset
from hf_algos.data.tokenizer import load_tokenizer
from hf_algos.run_identity import check_resume_identity, run_identity
from hf_algos.trainers.roles.batch_io import generate, generation_phase, response_ids, tensors
from hf_algos.trainers.roles.groups import build_role_groups
from hf_algos.trainers.roles.sampling import sampling_config
from hf_algos.trainers.roles.workers import actor_class, rollout_class
from hf_protocol import DataProto, fields

__all__ = ["generate_completions"]


def generate_completions(config: RLConfig, prompts_file: str, output: Path, samples: int) -> int:
    """Answer every prompt of ``prompts_file`` and write the answers to ``output`` (jsonl).

    ``samples=0``: one greedy answer per prompt; ``samples=k``: ``k`` answers sampled at the
    rollout's temperature (seeded by ``trainer.seed``). Returns the lines written.
    """
    tokenizer = load_tokenizer(config.data, config.actor)
    announce_prompt_format(config.data, tokenizer)
    dataset = rl_dataset(config.data, (prompts_file,), tokenizer, require_reward_fields=False)
    sampling = sampling_config(
        config.rollout,
        tokenizer,
        seed=config.trainer.seed,
        greedy=samples == 0,
        n=samples or None,
    )

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    trainer = config.trainer
    actor = actor_class(config.actor, trainer, run_steps=1)  # no step is taken
    roles = build_role_groups(
        trainer,
        {"actor": actor},
        rollout_class(config.rollout, config.actor, trainer, tokenizer),
    )
    written = 0
    try:
        roles.init_models()
        # as a resumed run or ``hybridflow eval`` picks it; absolute, as the workers' working
        # directory differs from the driver's
        checkpoints = CheckpointManager(Path(trainer.resolved_checkpoint_dir).absolute())
        checkpoint = checkpoints.to_resume(trainer.resume_mode, trainer.resume_from)
        if checkpoint is not None:  # another model's checkpoint is refused in one line
            checkpoint = checkpoint.absolute()
            identity = run_identity(config_to_dict(config))
            check_resume_identity(checkpoint, identity, trainer.resume_force, False)
            state = checkpoints.load(checkpoint, {"actor": roles.actor})
            print(f"generating with the actor of {checkpoint} (step {state['global_step']})")
        roles.sync_weights()
        batch_size = config.data.val_batch_size or config.data.train_batch_size
        output.parent.mkdir(parents=True, exist_ok=True)
        with generation_phase(roles, config.actor.engine.offload, {}), output.open("w") as out:
            for start, prompts in enumerate_batches(dataset, batch_size):
                answers = generate(roles.rollout, prompts, sampling, {})
                for line in completion_lines(answers, start, sampling.n, decode):
                    out.write(json.dumps(line) + "\n")
                    written += 1
    finally:
        roles.shutdown()
    return written


def enumerate_batches(
    dataset: CollatingDataset, batch_size: int
) -> Iterator[tuple[int, DataProto]]:
    """Every batch of ``dataset`` in order, with the index of its first prompt."""
    for number, batch in enumerate(all_batches(dataset, batch_size)):
        yield number * batch_size, batch


def completion_lines(
    answers: DataProto, first_index: int, samples: int, decode: Callable[[list[int]], str]
) -> list[dict[str, object]]:
    """The output lines of one generated batch: ``answers`` holds each prompt's ``samples``
    answers together (the rollout's order); ``first_index`` is its first prompt's index."""
    batch, extra = tensors(answers), answers.non_tensor_batch
    lines: list[dict[str, object]] = []
    for row in range(len(answers)):
        prompt = extra[fields.RAW_PROMPT][row]
        lines.append(
            {
                "index": first_index + row // samples,
                "sample": row % samples,
                "prompt": prompt if isinstance(prompt, str) else list(prompt),
                "completion": decode(response_ids(batch, row)),
            }
        )
    return lines
