"""Supervised fine-tuning (a warm start before RL): next-token loss on prompt + response.

Rows hold a prompt and a target response. The batch uses the engine's layout (prompt
left-padded, response right-padded), so the engine's ``log_probs`` are exactly the target
tokens' log-probabilities and the loss is their negative token mean. With
``loss_mask="all"`` the prompt is trained on too: the whole text becomes the response,
after its first token.
"""

from __future__ import annotations

from hf_algos.config.loading import config_to_dict
from hf_algos.config.root import SFTConfig
from hf_algos.data import SFTDataset, StatefulDataLoader
from hf_algos.data.prompts import announce_prompt_format
from hf_algos.data.tokenizer import load_tokenizer
from hf_algos.losses import sft_loss
from hf_algos.tracking import compute_timing_metrics, timed
from hf_algos.trainers.lifecycle.trainer import Metrics, Trainer
from hf_algos.trainers.roles.batch_io import call_group, for_worker, tensors
from hf_algos.trainers.roles.workers import actor_class_with_loss, optimizer_steps
from hf_protocol import DataProto, fields


class SFTTrainer(Trainer[DataProto]):
    """Next-token training of the actor model; its checkpoints warm-start an RL run."""

    def __init__(self, config: SFTConfig) -> None:
        super().__init__(config.trainer, config_to_dict(config))
        self.config = config
        self.tokenizer = load_tokenizer(config.data, config.actor)
        announce_prompt_format(config.data, self.tokenizer)

    def start_up(self) -> None:
        """Load and tokenize the rows, then start the actor group (the SFT loss, no
        rollout) and build its model."""
        config, tokenizer, data = self.config, self.tokenizer, self.config.data
        dataset = SFTDataset(data.train_files, tokenizer, config)
        self.loader = StatefulDataLoader(dataset, data.train_batch_size, data.shuffle, data.seed)
        self.val_data = SFTDataset(data.val_files, tokenizer, config) if data.val_files else None
        run_steps = optimizer_steps(
            self.total_steps,
            data.train_batch_size,
            config.actor.ppo_mini_batch_size,
            config.actor.ppo_epochs,
        )
        actor = actor_class_with_loss(config.actor, config.trainer, sft_loss, run_steps=run_steps)
        self.roles = self.start_groups({"actor": actor}, None)
        self.roles.build()

    def train_step(self, batch: DataProto) -> Metrics:
        """One pass of mini-batch steps over ``batch``."""
        metrics: Metrics = {}
        timing: dict[str, float] = {}
        with timed("update_actor", timing):
            call_group(self.roles.actor.update_actor, batch, metrics, keep_output=False)
        timing["step"] = timing["update_actor"]
        metrics.update(compute_timing_metrics(batch, timing))
        return metrics

    def validate(self) -> Metrics:
        """Held-out ``val/sft_nll`` (token mean)."""
        if self.val_data is None:
            return {}
        dataset = self.val_data
        batch = dataset.collate([dataset[i] for i in range(len(dataset))])
        output = self.roles.actor.compute_log_prob(for_worker(batch))
        log_probs = tensors(output)[fields.OLD_LOG_PROBS]
        mask = tensors(batch)[fields.RESPONSE_MASK].to(log_probs.dtype)
        return {"val/sft_nll": float(-(log_probs * mask).sum() / mask.sum())}
