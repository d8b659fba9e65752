"""Weights from a Megatron actor split by TP=2 or PP=2 reach the rollout whole and exact.

After one GRPO step (so the weights moved) the actor pushes its weights, gathered from its
shards one layer at a time (``iter_full_params``): in the ``hybrid`` placement into the
rollout engine in the same processes, in the ``separate`` placement over the weight channel.
Then the rollout's greedy answers equal those of the actor's exported model (transformers,
one process), and the log-probs the rollout reports for them equal the actor's own
(``compute_log_prob``) within fp32 tolerance, while those of the rollout reset to the
initial weights before the push do not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")

from transformers import AutoModelForCausalLM

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers import PPOTrainer
from hf_algos.trainers.roles.batch_io import for_worker, generate, generation_phase
from hf_algos.trainers.roles.sampling import sampling_config
from hf_protocol import DataProto, fields

from .trainer_helpers import common_overrides, task_files

pytestmark = [pytest.mark.second_lane, pytest.mark.timeout(1200)]

ATOL = 1e-5  # fp32 on CPU: megatron's and transformers' kernels differ in the last bits
LAYOUTS = {
    "hybrid-tp2": ["actor.engine.megatron.tensor_model_parallel_size=2"],
    "hybrid-pp2": ["actor.engine.megatron.pipeline_model_parallel_size=2"],
    "separate-tp2": [
        "actor.engine.megatron.tensor_model_parallel_size=2",
        "trainer.placement=separate",
        "trainer.rollout_workers=1",
    ],
    "separate-pp2": [
        "actor.engine.megatron.pipeline_model_parallel_size=2",
        "trainer.placement=separate",
        "trainer.rollout_workers=1",
    ],
}


def hf_greedy(model_dir: Path, batch: DataProto, new_tokens: int, eos: int) -> torch.Tensor:
    """Greedy answers of the exported model, one prompt at a time (no padding at all),
    ending at ``eos`` as the rollout's do."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert batch.batch is not None
    answers = []
    prompts, masks = batch.batch[fields.PROMPTS], batch.batch[fields.ATTENTION_MASK]
    for ids, mask in zip(prompts, masks, strict=True):
        prompt = ids[mask[: ids.shape[0]].bool()].unsqueeze(0)
        out = model.generate(
            prompt, max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos
        )
        answers.append(out[0, prompt.shape[1] :])
    return torch.nn.utils.rnn.pad_sequence(answers, batch_first=True, padding_value=-1)


def rollout_vs_actor(trainer: PPOTrainer, initial: Path, export_dir: Path) -> dict[str, Any]:
    """Greedy answers and log-probs of the rollout holding the ``initial`` model, then after
    a push; the actor's log-probs and the exported model's greedy answers."""
    config = trainer.config
    sampling = sampling_config(config.rollout, trainer.tokenizer, greedy=True)
    prompts = trainer.loader.next_batch()
    state = AutoModelForCausalLM.from_pretrained(initial, dtype=torch.float32).state_dict()
    trainer.roles.rollout.update_weights(state)  # back to the weights before training
    with generation_phase(trainer.roles, False, {}):  # hybrid: wakes the rollout up
        before = generate(trainer.roles.rollout, prompts, sampling, {})
        trainer.roles.sync_weights()
        after = generate(trainer.roles.rollout, prompts, sampling, {})
    request = for_worker(after)
    request.meta_info[fields.TEMPERATURE] = sampling.effective_temperature
    actor = trainer.roles.actor.compute_log_prob(request)
    trainer.roles.actor.export_hf(str(export_dir))
    assert after.batch is not None and before.batch is not None and actor.batch is not None
    mask = after.batch[fields.RESPONSE_MASK].bool()
    return {
        "mask": mask,
        "before": before.batch[fields.ROLLOUT_LOG_PROBS] * mask,
        "rollout": after.batch[fields.ROLLOUT_LOG_PROBS] * mask,
        "actor": actor.batch[fields.OLD_LOG_PROBS] * mask,
        "responses": after.batch[fields.RESPONSES].masked_fill(~mask, -1),
        "hf": hf_greedy(
            export_dir, after, config.rollout.max_new_tokens, trainer.tokenizer.eos_token_id
        ),
    }


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_push_from_megatron_shards_gives_the_rollout_the_actor(
    layout: str, ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train, _ = task_files(tmp_path)
    overrides = [
        *common_overrides(tiny_model_dir, tmp_path, train, steps=1),
        "algorithm.adv_estimator=grpo",
        "actor.entropy_coeff=0.01",  # the untrained model scores 0: move the weights anyway
        "actor.engine.optim.lr=1e-2",
        "trainer.resume_mode=disable",
        "trainer.n_workers=2",
        "actor.engine.backend=megatron",
        *LAYOUTS[layout],
    ]
    torch.set_num_threads(1)
    with PPOTrainer(load_config(RLConfig, overrides=overrides)) as trainer:
        trainer.fit()
        got = rollout_vs_actor(trainer, tiny_model_dir, tmp_path / "export")

    gap = float((got["rollout"] - got["actor"]).abs().max())
    print(f"{layout}: largest |rollout - actor| log-prob gap {gap:.2e}")
    torch.testing.assert_close(got["rollout"], got["actor"], atol=ATOL, rtol=0)
    # the step moved the weights, and the push brought the move to the rollout
    assert (got["before"] - got["actor"]).abs().max() > 100 * ATOL
    width = got["hf"].shape[1]
    answers = got["responses"][:, :width]
    assert torch.equal(answers, got["hf"][:, : answers.shape[1]]), (answers, got["hf"])
