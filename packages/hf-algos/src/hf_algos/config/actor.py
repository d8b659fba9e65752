"""``actor``: the policy, its engine, mini-batching and policy-loss settings.

Each section checks its own values in ``__post_init__``; checks that need several
sections are in :mod:`hf_algos.config.cross_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_algos.config.values import require_positive
from hf_engines.config import EngineConfig, LoRAConfig, check_lora_backend


@dataclass(frozen=True)
class ActorSection:
    """The policy: its engine, mini-batching and policy-loss settings."""

    engine: EngineConfig
    """Model, optimizer, FSDP layout and micro-batching of the actor."""
    ppo_mini_batch_size: int = 8
    """Rows (responses, not prompts) per optimizer step, over all ranks together."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    shuffle: bool = False
    """Shuffle rows between mini-batches."""
    policy_loss: str = "ppo"
    """Policy loss name in ``hf_algos.losses.POLICY_LOSSES`` (ppo, gspo, reinforce)."""
    clip_low: float = 0.2
    """Lower ratio clip ``1 - clip_low`` (verl: ``clip_ratio_low``)."""
    clip_high: float = 0.2
    """Upper ratio clip ``1 + clip_high`` (clip-higher: raise it, e.g. 0.28; verl:
    ``clip_ratio_high``)."""
    clip_c: float | None = None
    """Dual-clip bound for negative advantages (> 1, e.g. 3.0); ``None`` disables it (verl:
    ``clip_ratio_c``)."""
    loss_agg_mode: str = "token-mean"
    """How token losses are reduced (``hf_algos.losses.LOSS_AGG_MODES``)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus."""
    use_kl_loss: bool = False
    """Add ``kl_loss_coef * KL(policy || reference)`` to the loss (GRPO style)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator of the KL loss (``hf_algos.kl.KL_ESTIMATORS``)."""
    use_rollout_log_probs: bool = False
    """Take ``old_log_probs`` from the rollout (the behaviour policy that sampled the batch)
    instead of recomputing them with the actor: saves one forward pass per step; the two
    differ only by numerical differences between the engines (dtype, kernels)."""
    old_log_probs_from_update: bool = True
    """When the update is one optimizer step over the whole batch (``ppo_epochs=1``,
    ``ppo_mini_batch_size`` >= the step's rows), take ``old_log_probs`` from that step's own
    forward, detached, instead of a separate forward first: the same numbers, one forward
    pass less per step (the rollout correction is then applied in the loss). ``false``
    always recomputes them."""
    router_replay: bool = False
    """Router replay (R3) for mixture-of-experts models: the actor's forwards (old log-probs
    and the update) route every token to the experts the rollout chose (``routed_experts``,
    recorded by the native rollout), with gate weights from the actor's own router. Removes
    the rollout-vs-actor mismatch of flipped expert choices. FSDP and Megatron engines
    (with expert parallelism too)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters through peft (``rank > 0``, FSDP engine): only the adapters train, the
    rollout gets merged weights, and the reference policy is the base model with the
    adapters off (no separate reference copy). See ``docs/lora.md``."""

    def __post_init__(self) -> None:
        check_lora_backend(self.lora, self.engine, "actor")
        require_positive("actor.ppo_mini_batch_size", self.ppo_mini_batch_size)
        require_positive("actor.ppo_epochs", self.ppo_epochs)
        require_positive("actor.entropy_coeff", self.entropy_coeff, allow_zero=True)
        require_positive("actor.kl_loss_coef", self.kl_loss_coef, allow_zero=True)
