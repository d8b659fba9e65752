"""Online DPO's roles as a verl user writes them: ``Worker`` subclasses with ``@register``
methods, the pattern of verl's "extend to a new algorithm" guide.

This module is verl code. Only its imports were changed, from

    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl import DataProto

to the compat modules below; nothing else in it knows about HybridFlow. Two roles:

* ``ActorRolloutWorker``: samples responses (``generate_sequences``) and takes DPO updates
  (``update_actor``) on one copy of the policy, with gradients averaged over the data
  parallel ranks by ``torch.distributed`` (gloo on CPU);
* ``ReferenceWorker``: the frozen initial policy's log-probabilities (``compute_ref_log_prob``).

Rows are prompt + response token ids of fixed widths (the task's prompts all tokenize to
one length, and responses are sampled to exactly ``response_length`` tokens).
"""

from __future__ import annotations

import os
from typing import Any

import ray
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812

from hf_controller.compat.verl import Dispatch, Worker, register
from hf_protocol.compat.verl import DataProto


def load_policy(model_path: str) -> Any:
    """The causal LM in ``model_path`` (a Hugging Face directory), in float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)


def response_log_probs(model: Any, input_ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """Per-token log-probabilities ``(B, response_length)`` of the last ``response_length``
    tokens of each row of ``input_ids`` under ``model``."""
    logits = model(input_ids=input_ids).logits[:, -response_length - 1 : -1]
    targets = input_ids[:, -response_length:]
    return torch.gather(F.log_softmax(logits.float(), dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)


@ray.remote
class ActorRolloutWorker(Worker):
    """The policy: samples responses and takes DPO steps on them."""

    def __init__(self, model_path: str, lr: float, beta: float, response_length: int) -> None:
        super().__init__()
        self.model_path = model_path
        self.lr = lr
        self.beta = beta
        self.response_length = response_length

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the policy and its optimizer; join the data-parallel process group."""
        torch.set_num_threads(1)
        if not dist.is_initialized():  # the worker group set RANK, WORLD_SIZE, MASTER_*
            dist.init_process_group("gloo")
        self.model = load_policy(self.model_path)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.0)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample one response of ``response_length`` tokens for each prompt row."""
        seed = prompts.meta_info["seed"] * 1000 + self.rank
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        eos = prompts.meta_info["eos_token_id"]
        with torch.no_grad():
            output = self.model.generate(
                input_ids=prompts.batch["input_ids"],
                attention_mask=torch.ones_like(prompts.batch["input_ids"]),
                do_sample=True,
                max_new_tokens=self.response_length,
                min_new_tokens=self.response_length,
                suppress_tokens=[eos],
                pad_token_id=eos,
            )
        torch.random.set_rng_state(generator_state)
        responses = output[:, -self.response_length :]
        return DataProto.from_dict({"input_ids": output, "responses": responses})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """``epochs`` DPO steps on this rank's pairs (rows chosen, rejected, chosen, ...);
        the loss before the first and after the last step go back as metrics."""
        losses = []
        for _ in range(data.meta_info["epochs"]):
            loss, margin = self._dpo_loss(data)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for param in self.model.parameters():  # data parallel: the mean gradient
                if param.grad is not None:
                    dist.all_reduce(param.grad)
                    param.grad /= self.world_size
            self.optimizer.step()
            losses.append(float(loss.detach()))
        with torch.no_grad():
            final_loss, margin = self._dpo_loss(data)
        metrics = {
            "actor/dpo_loss": losses[0],
            "actor/dpo_loss_after": float(final_loss),
            "actor/margin_after": float(margin),
            "actor/pid": os.getpid(),
        }
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def param_checksum(self) -> float:
        """The sum of every weight (equal on all ranks while data parallelism holds)."""
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model.parameters()))

    def _dpo_loss(self, data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """DPO's ``-log sigmoid(beta * margin)`` over the pairs, and the mean margin."""
        log_probs = response_log_probs(self.model, data.batch["input_ids"], self.response_length)
        policy = log_probs.sum(-1)
        reference = data.batch["ref_log_prob"]
        ratio = policy - reference
        margin = ratio[0::2] - ratio[1::2]
        return -F.logsigmoid(self.beta * margin).mean(), margin.detach().mean()


@ray.remote
class ReferenceWorker(Worker):
    """The frozen initial policy."""

    def __init__(self, model_path: str, response_length: int) -> None:
        super().__init__()
        self.model_path = model_path
        self.response_length = response_length

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the reference policy."""
        self.model = load_policy(self.model_path)
        self.model.eval()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """The summed log-probability of each row's response under the reference."""
        with torch.no_grad():
            log_probs = response_log_probs(
                self.model, data.batch["input_ids"], self.response_length
            )
        return DataProto.from_dict({"ref_log_prob": log_probs.sum(-1)})
