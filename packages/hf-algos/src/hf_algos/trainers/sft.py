"""Supervised fine-tuning (a warm start before RL): next-token loss on prompt + response.

Rows hold a prompt and a target response. The batch uses the engine's layout (prompt
left-padded, response right-padded), so the engine's ``log_probs`` are exactly the target
tokens' log-probabilities and the loss is their negative token mean. With
``loss_mask="all"`` the prompt is trained on too: the whole text becomes the response,
after its first token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from hf_algos.config.loading import config_to_dict
from hf_algos.config.trainers import SFTConfig
from hf_algos.data import StatefulDataLoader, left_pad, read_rows, right_pad
from hf_algos.data.collate import position_ids_from_mask
from hf_algos.data.prompts import encode_prompt, resolve_chat_template
from hf_algos.losses.fields import batch_field
from hf_algos.tracking import compute_timing_metrics, timed
from hf_algos.trainers import builders
from hf_algos.trainers.base import Metrics, Trainer
from hf_algos.trainers.roles import build_role_groups
from hf_algos.trainers.steps import MODEL_FIELDS, absorb, for_worker, tensors
from hf_engines import ModelOutputs
from hf_protocol import DataProto


def sft_loss(
    outputs: ModelOutputs, micro_batch: DataProto
) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood per target token (token mean over ``response_mask``).

    Reads ``outputs["log_probs"]`` ``(b, R)`` and ``response_mask`` ``(b, R)``.
    Metrics: ``sft_nll`` (the loss) and ``sft_ppl`` (``exp(nll)``).
    """
    log_probs = outputs["log_probs"]
    mask = batch_field(micro_batch, "response_mask", log_probs.device, "the SFT collate writes")
    mask = mask.to(log_probs.dtype)
    loss = -(log_probs * mask).sum() / mask.sum().clamp(min=1.0)
    nll = float(loss.detach())
    return loss, {"sft_nll": nll, "sft_ppl": float(torch.exp(loss.detach()))}


class SFTDataset:
    """Prompt + response rows tokenized up front (``prompt_key`` / ``response_key``)."""

    def __init__(
        self, files: Sequence[str], tokenizer: PreTrainedTokenizerBase, config: SFTConfig
    ) -> None:
        self.pad_token_id = int(tokenizer.pad_token_id)
        use_template = resolve_chat_template(tokenizer, None)
        self.items: list[tuple[list[int], list[int]]] = []
        for index, row in enumerate(read_rows(list(files))):
            prompt = encode_prompt(tokenizer, row[config.data.prompt_key], use_template)
            text = row.get(config.response_key)
            if not isinstance(text, str):
                raise KeyError(
                    f"SFT row {index} has no string {config.response_key!r} field "
                    f"(fields: {sorted(row)}); set response_key to the target column"
                )
            response = tokenizer(text, add_special_tokens=False)["input_ids"]
            response = [*response, int(tokenizer.eos_token_id)][: config.max_response_length]
            if config.loss_mask == "all":
                prompt, response = prompt[:1], [*prompt[1:], *response]
            self.items.append((list(prompt), list(response)))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        return self.items[index]

    def collate(self, rows: Sequence[tuple[list[int], list[int]]]) -> DataProto:
        """The engine's layout: ``prompts`` left-padded, ``responses`` right-padded."""
        prompt_ids, response_ids = [p for p, _ in rows], [r for _, r in rows]
        width = max(map(len, prompt_ids))
        prompts, prompt_mask = left_pad(prompt_ids, self.pad_token_id, width)
        responses, response_mask = right_pad(
            response_ids, self.pad_token_id, max(map(len, response_ids))
        )
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        return DataProto.from_dict(
            tensors={
                "prompts": prompts,
                "responses": responses,
                "response_mask": response_mask,
                "input_ids": torch.cat([prompts, responses], dim=1),
                "attention_mask": attention_mask,
                "position_ids": position_ids_from_mask(attention_mask),
            }
        )


class SFTTrainer(Trainer):
    """Next-token training of the actor model; its checkpoints warm-start an RL run."""

    def __init__(self, config: SFTConfig) -> None:
        super().__init__(config.trainer, config_to_dict(config))
        self.config = config
        tokenizer = builders.load_tokenizer(config.data, config.actor)
        data = config.data
        dataset = SFTDataset(data.train_files, tokenizer, config)
        self.loader = StatefulDataLoader(dataset, data.train_batch_size, data.shuffle, data.seed)
        self.val_data = SFTDataset(data.val_files, tokenizer, config) if data.val_files else None
        actor = builders.actor_class_with_loss(config.actor, config.trainer, sft_loss)
        self.roles = build_role_groups(config.trainer, {"actor": actor}, None)
        self.roles.init_models()

    def train_step(self, batch: DataProto) -> Metrics:
        """One pass of mini-batch steps over ``batch``."""
        metrics: Metrics = {}
        timing: dict[str, float] = {}
        with timed("update_actor", timing):
            absorb(None, self.roles.actor.update_actor(for_worker(batch, MODEL_FIELDS)), metrics)
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
        log_probs = tensors(output)["old_log_probs"]
        mask = tensors(batch)["response_mask"].to(log_probs.dtype)
        return {"val/sft_nll": float(-(log_probs * mask).sum() / mask.sum())}

    def __enter__(self) -> SFTTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
