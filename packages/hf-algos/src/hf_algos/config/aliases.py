"""verl's config keys, mapped to ours: one explicit table, applied to YAML files and overrides.

Each :class:`Alias` says what a verl key path becomes here:

* ``renamed``: the same meaning under our key (values converted where verl spells them
  differently, e.g. ``rollout.name=hf`` -> ``rollout.backend=native``);
* ``same``: verl's path is ours already (listed so ``docs/from-verl.md`` shows it);
* ``derived``: computed from several keys (``trainer.n_gpus_per_node`` x ``trainer.nnodes``
  workers, on GPUs);
* ``shared``: a setting verl gives each role but one of ours covers for several (the
  reference runs in the actor's engine layout): the value must equal ours, else an error
  names the key to set;
* ``ignored``: a performance knob that has no effect here (one warning names them all);
* ``refused``: the key exists in both but means something else; the error explains the
  difference and the value to use;
* ``unsupported``: no equivalent here; the error says so.

A key ending in ``.*`` stands for every key below it (verl's ``profiler.*``); an exact entry
wins over it. Any other key under verl's own sections (``actor_rollout_ref``,
``custom_reward_function``, ``reward_model``, ...) is refused as unsupported.
``tools/gen_verl_keys.py`` renders the table into ``docs/from-verl.md``.

verl's rollout engine knobs (``tensor_model_parallel_size``, ``gpu_memory_utilization``, ...)
are ``derived``: they become ``rollout.engine_kwargs`` under the names of the backend chosen
(:data:`ROLLOUT_ENGINE_KEYS`), once every source is merged, and have no effect with the native
backend (which generates with the actor's own model).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hf_controller import ConfigurationError

AliasKind = Literal["renamed", "same", "derived", "shared", "ignored", "refused", "unsupported"]

VERL_ROOTS = (
    "actor_rollout_ref",
    "async_training",
    "custom_reward_function",
    "reward_model",
    "global_profiler",
)
"""Top-level sections only verl has: every key under them must be in the table."""

_ARA = "actor_rollout_ref.actor"
_ROLL = "actor_rollout_ref.rollout"
_REF = "actor_rollout_ref.ref"


@dataclass(frozen=True)
class Alias:
    """What one verl key path means here."""

    verl: str
    """verl's dotted key path."""
    kind: AliasKind
    """How it is handled (see the module docstring)."""
    ours: tuple[str, ...] = ()
    """Our key path(s) it sets (several: the value goes to each)."""
    note: str = ""
    """Why, for refused / ignored / unsupported keys and conversions (shown to the user)."""
    convert: Callable[[Any], Any] | None = None
    """Converts verl's value into ours, where they are spelled differently."""
    configs: tuple[str, ...] = ()
    """Root config classes this entry applies to (empty: all)."""
    accepted: tuple[Any, ...] = ()
    """Values that mean what we do anyway (verl's ``critic_warmup=0``, an offload switch
    set to ``false``): accepted, and they set nothing."""


class VerlKeysNoEffect(UserWarning):
    """The verl keys of one load that have no effect here, with why (one warning for all)."""


def no_effect_message(ignored: Sequence[tuple[str, str]]) -> str:
    """One line naming every verl key that has no effect here, each with its reason."""
    if len(ignored) == 1:
        key, note = ignored[0]
        return f"verl key {key} has no effect here: {note}"
    return "verl keys with no effect here: " + "; ".join(f"{k} ({note})" for k, note in ignored)


def _map(values: Mapping[Any, Any], name: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value not in values:
            raise ConfigurationError(
                f"{name}={value!r} has no equivalent here; use one of {sorted(map(str, values))}"
            )
        return values[value]

    return convert


def _not_null(name: str, instead: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value is None:
            raise ConfigurationError(
                f"{name}=null has no equivalent here; give a number, or {instead}"
            )
        return value

    return convert


def _rollout_name(value: Any) -> Any:
    if value == "trtllm":
        raise ConfigurationError(
            f"{_ROLL}.name='trtllm' has no equivalent here; use vllm, sglang or hf (native)"
        )
    return "native" if value == "hf" else value


def _renamed(verl: str, *ours: str, note: str = "", **kw: Any) -> Alias:
    return Alias(verl, "renamed", tuple(ours), note, **kw)


def _same(verl: str) -> Alias:
    return Alias(verl, "same", (verl,))


def _ignored(verl: str, note: str) -> Alias:
    return Alias(verl, "ignored", (), note)


def _unsupported(verl: str, note: str, accepted: tuple[Any, ...] = ()) -> Alias:
    return Alias(verl, "unsupported", (), note, accepted=accepted)


def _shared(verl: str, ours: str, note: str, **kw: Any) -> Alias:
    return Alias(verl, "shared", (ours,), note, **kw)


_STRATEGIES = {"fsdp": "fsdp", "fsdp2": "fsdp", "megatron": "megatron"}
"""verl's ``strategy`` -> our ``engine.backend``."""
_STRATEGY_NOTE = "fsdp / fsdp2 -> fsdp (FSDP2), megatron -> megatron"
_MEGATRON_SIZES = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
)
"""verl's ``megatron.*`` layout keys we map."""
_OFFLOAD_NOTE = (
    "true -> actor.engine.offload=true: the actor's parameters, gradients and optimizer "
    "state move to the CPU together while the rollout generates (verl moves each one "
    "separately, around every phase); false (the default) sets nothing"
)
_REF_OFFLOAD_NOTE = (
    "the reference has no offload setting here: it is frozen (no gradients, no optimizer "
    "state) and stays in GPU memory; actor.engine.offload moves the actor only"
)
_REF_NOTE = "the reference runs in the actor's engine layout: must equal the actor's value"


def _engine_layout(verl_role: str, role: str) -> tuple[Alias, ...]:
    """verl's ``strategy`` and ``megatron.*`` sizes of one trained role -> its engine."""
    return (
        _renamed(
            f"{verl_role}.strategy",
            f"{role}.engine.backend",
            note=_STRATEGY_NOTE,
            convert=_map(_STRATEGIES, f"{verl_role}.strategy"),
        ),
        *(
            _renamed(f"{verl_role}.megatron.{k}", f"{role}.engine.megatron.{k}")
            for k in (*_MEGATRON_SIZES, "use_distributed_optimizer")
        ),
    )


def _reference_layout() -> tuple[Alias, ...]:
    """verl's reference ``strategy`` / ``megatron.*``: the actor's, or an error."""
    ref = "actor_rollout_ref.ref"
    return (
        _shared(
            f"{ref}.strategy",
            "actor.engine.backend",
            f"{_REF_NOTE}; {_STRATEGY_NOTE}",
            convert=_map(_STRATEGIES, f"{ref}.strategy"),
        ),
        *(
            _shared(f"{ref}.megatron.{k}", f"actor.engine.megatron.{k}", _REF_NOTE)
            for k in _MEGATRON_SIZES
        ),
    )


ROLLOUT_ENGINE_KEYS: dict[str, dict[str, str]] = {
    "tensor_model_parallel_size": {"vllm": "tensor_parallel_size", "sglang": "tp_size"},
    "gpu_memory_utilization": {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"},
    "enforce_eager": {"vllm": "enforce_eager", "sglang": "disable_cuda_graph"},
    "max_num_seqs": {"vllm": "max_num_seqs", "sglang": "max_running_requests"},
    "max_num_batched_tokens": {"vllm": "max_num_batched_tokens"},
    "enable_chunked_prefill": {"vllm": "enable_chunked_prefill"},
}
"""verl's ``actor_rollout_ref.rollout.<key>`` engine knobs -> ``rollout.engine_kwargs`` name,
per ``rollout.backend`` (a backend not listed has no such option: the key is a no-op)."""

_ENGINE_NOTES = {
    "native": "rollout.backend=native generates with the actor's own model, in its memory "
    "(rollout.name=vllm or sglang for an inference engine)",
    "sglang": "no sglang option of that name",
}
"""Why an engine knob does nothing with a backend (shown with the no-op note)."""


def _engine_note(key: str) -> str:
    names = ROLLOUT_ENGINE_KEYS[key]
    per_backend = ", ".join(f"{b}: rollout.engine_kwargs.{n}" for b, n in names.items())
    return f"by rollout.backend: {per_backend}; native: no effect"


_OPTIMIZERS = {"AdamW": "adamw", "Muon": "muon"}
"""verl's ``optim.optimizer`` (a class of ``torch.optim``) -> our ``optim.name``."""
_OPTIMIZER_NOTE = (
    "AdamW -> adamw, Muon -> muon (Muon on the transformer blocks' 2-D weights, AdamW on "
    "the rest, as torch's Muon needs); other classes have no equivalent"
)

_PROFILER_NOTE = "no profiler hooks here; trainer.trace_file writes a timeline of every step"
_MICRO_NOTE = "uses the actor's micro-batches, actor.engine.micro_batch"
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_DTYPES.update({v: v for v in list(_DTYPES.values())})
_RESIDENT = (
    "{role} has no offload setting here and stays in GPU memory; actor.engine.offload moves "
    "the actor only"
)


def _megatron_extras(verl_role: str, role: str) -> tuple[Alias, ...]:
    """verl's Megatron keys beyond the layout sizes, for one role (actor, ref, critic)."""
    return (
        _unsupported(
            f"{verl_role}.megatron.context_parallel_size",
            "no context parallelism in the Megatron engine here; "
            "actor.engine.fsdp.ulysses_sequence_parallel_size splits sequences (FSDP)",
            accepted=(1,),
        ),
        _unsupported(
            f"{verl_role}.megatron.expert_tensor_parallel_size",
            f"{role}.engine.megatron.tensor_model_parallel_size shards the experts too",
        ),
        _unsupported(
            f"{verl_role}.megatron.virtual_pipeline_model_parallel_size",
            "no interleaved pipeline schedule here",
            accepted=(None,),
        ),
        _unsupported(
            f"{verl_role}.megatron.use_dist_checkpointing",
            f"the model loads from its Hugging Face checkpoint ({role}.engine.model.path)",
            accepted=(False,),
        ),
        _ignored(
            f"{verl_role}.megatron.dist_checkpointing_path",
            "read only with use_dist_checkpointing, which has no equivalent here",
        ),
    )


def _launch_line_keys() -> tuple[Alias, ...]:
    """The further keys of verl's example launch lines (``examples/*/run_*.sh``)."""
    return (
        *_actor_launch_keys(),
        *_model_launch_keys(),
        *_rollout_launch_keys(),
        *_critic_launch_keys(),
        *_data_launch_keys(),
    )


def _actor_launch_keys() -> tuple[Alias, ...]:
    """Actor keys of verl's launch lines (optimizer, FSDP, switches)."""
    dtype = "bf16 -> bfloat16, fp16 -> float16, fp32 -> float32"
    return (
        _renamed(f"{_ARA}.optim.clip_grad", "actor.engine.optim.grad_clip"),
        _renamed(f"{_ARA}.optim.lr_decay_style", "actor.engine.optim.schedule"),
        _unsupported(
            f"{_ARA}.optim.lr_warmup_steps_ratio",
            "give the warmup in steps: actor.engine.optim.warmup_steps",
            accepted=(0, 0.0),
        ),
        _unsupported(
            f"{_ARA}.optim.override_optimizer_config.*",
            "no Megatron optimizer overrides here; actor.engine.offload moves the optimizer "
            "state to the CPU while the rollout generates",
        ),
        _renamed(f"{_ARA}.fsdp_config.fsdp_size", "actor.engine.fsdp.dp_shard", note="-1: all"),
        *(
            _renamed(
                f"{_ARA}.fsdp_config.mixed_precision.{k}",
                f"actor.engine.fsdp.{k}",
                note=dtype,
                convert=_map(_DTYPES, f"{_ARA}.fsdp_config.mixed_precision.{k}"),
            )
            for k in ("param_dtype", "reduce_dtype")
        ),
        _ignored(f"{_ARA}.fsdp_config.mixed_precision.buffer_dtype", "buffers keep their dtype"),
        *(
            _renamed(
                key,
                "actor.engine.model.dtype",
                note=dtype,
                convert=_map(_DTYPES, key),
            )
            for key in (f"{_ARA}.fsdp_config.model_dtype", "actor_rollout_ref.model.torch_dtype")
        ),
        *(
            _ignored(f"{role}.fsdp_config.{k}", "FSDP2 prefetches and keeps the parameters itself")
            for role in (_ARA, _REF)
            for k in ("forward_prefetch", "use_orig_params")
        ),
        *(
            _ignored(f"{role}.use_torch_compile", "nothing is compiled with torch.compile here")
            for role in (_ARA, _REF)
        ),
        *(
            _ignored(
                f"{role}.entropy_from_logits_with_chunking",
                "always chunked here: actor.engine.logprob_chunk_size",
            )
            for role in (_ARA, _REF)
        ),
        _ignored(f"{_ARA}.entropy_checkpointing", "no such switch here"),
        _unsupported(f"{_ARA}.calculate_sum_pi_squared", "no such metric here", accepted=(False,)),
        _unsupported(
            f"{_ARA}.use_prefix_grouper",
            "a group's responses do not share their prompt's forward here",
            accepted=(False,),
        ),
        _unsupported(f"{_ARA}.freeze_vision_tower", "text-only models here", accepted=(False,)),
        _renamed(
            f"{_ARA}.router_replay.mode",
            "actor.router_replay",
            note="R3 -> true, disabled -> false; R2 has no equivalent",
            convert=_map({"R3": True, "disabled": False}, f"{_ARA}.router_replay.mode"),
        ),
        _unsupported(
            f"{_ARA}.checkpoint.*",
            "a checkpoint holds the whole training state; trainer.export_dir writes a Hugging "
            "Face model at the end",
        ),
        _renamed(f"{_ARA}.megatron.seed", "actor.engine.model.seed"),
        _ignored(f"{_ARA}.megatron.use_mbridge", "the engine converts Hugging Face weights itself"),
        _unsupported(
            f"{_ARA}.megatron.override_transformer_config.*",
            "no override of Megatron's TransformerConfig here (it follows the Hugging Face "
            "config; actor.engine.model.hf_config changes that)",
        ),
    )


def _model_launch_keys() -> tuple[Alias, ...]:
    """Megatron, profiler, model and reference keys of verl's launch lines."""
    return (
        *_megatron_extras(_ARA, "actor"),
        *_megatron_extras(_REF, "actor"),
        *(_ignored(f"{role}.profiler.*", _PROFILER_NOTE) for role in (_ARA, _REF, "critic")),
        _ignored("global_profiler.*", _PROFILER_NOTE),
        _unsupported(
            "actor_rollout_ref.model.override_config.*",
            "the model's Hugging Face config is used as saved (actor.engine.model.hf_config "
            "is a whole config, for a randomly initialised model)",
        ),
        _ignored("actor_rollout_ref.model.use_shm", "the model loads from its path"),
        _ignored(
            "actor_rollout_ref.model.use_fused_kernels",
            "log-probs and entropy come from the hidden states a chunk of tokens at a time "
            "(actor.engine.logprob_chunk_size), without verl's fused kernels",
        ),
        _ignored("actor_rollout_ref.model.fused_kernel_options.*", "no fused kernels here"),
        _unsupported(
            "actor_rollout_ref.model.enable_activation_offload",
            "activation checkpointing (enable_gradient_checkpointing) saves the memory here",
            accepted=(False,),
        ),
        _unsupported(
            "actor_rollout_ref.model.exclude_modules", "LoRA goes on actor.lora.target_modules"
        ),
        _unsupported("actor_rollout_ref.model.lora_adapter_path", "LoRA adapters start fresh"),
        _unsupported(
            "actor_rollout_ref.hybrid_engine",
            "the actor and the rollout share processes (trainer.placement=hybrid, the default)",
            accepted=(True,),
        ),
        _ignored("actor_rollout_ref.nccl_timeout", "trainer.call_timeout_s bounds worker calls"),
        *(
            _ignored(f"{_REF}.{k}", _MICRO_NOTE)
            for k in (
                "log_prob_max_token_len_per_gpu",
                "log_prob_use_dynamic_bsz",
                "log_prob_micro_batch_size",
            )
        ),
    )


def _rollout_launch_keys() -> tuple[Alias, ...]:
    """Rollout keys of verl's launch lines."""
    return (
        *(
            _ignored(f"{_ROLL}.{k}", _MICRO_NOTE)
            for k in (
                "log_prob_max_token_len_per_gpu",
                "log_prob_use_dynamic_bsz",
                "log_prob_micro_batch_size",
            )
        ),
        *(
            Alias(
                f"{_ROLL}.engine_kwargs.{backend}.*",
                "derived",
                ("rollout.engine_kwargs.*",),
                f"rollout.engine_kwargs.* when rollout.backend={backend}; else no effect",
            )
            for backend in ("vllm", "sglang", "trtllm")
        ),
        _ignored(
            f"{_ROLL}.free_cache_engine",
            "the rollout frees its KV cache between generations (hybrid placement) anyway",
        ),
        _ignored(f"{_ROLL}.load_format", "the rollout's weights come from the actor"),
        _ignored(
            f"{_ROLL}.layered_summon", "weights are pushed in buckets (trainer.weight_bucket_mb)"
        ),
        _ignored(f"{_ROLL}.multi_stage_wake_up", "the rollout wakes up in one stage"),
        _renamed(
            f"{_ROLL}.checkpoint_engine.update_weights_bucket_megabytes", "trainer.weight_bucket_mb"
        ),
        _ignored(f"{_ROLL}.disable_log_stats", "engine statistics are not logged"),
        _ignored(f"{_ROLL}.skip_tokenizer_init", "the engine is given token ids"),
        _ignored(
            f"{_ROLL}.calculate_log_probs",
            "the rollout's log-probs are used as algorithm.rollout_correction and "
            "actor.use_rollout_log_probs say",
        ),
        _unsupported(
            f"{_ROLL}.over_sample_rate",
            "every prompt of a batch is generated to the end",
            accepted=(0, 0.0),
        ),
        *(
            _unsupported(f"{_ROLL}.{k}", "one rollout engine per rollout worker", accepted=(1,))
            for k in ("data_parallel_size", "expert_parallel_size")
        ),
        _renamed(
            f"{_ROLL}.enable_rollout_routing_replay",
            "actor.router_replay",
            note="verl's R3: the rollout records the expert choices, the actor replays them",
        ),
        _ignored(f"{_ROLL}.prometheus.*", "no metrics server here"),
        _ignored(f"{_ROLL}.trace.*", _PROFILER_NOTE),
        *(
            _unsupported(
                f"{_ROLL}.multi_turn.{k}",
                "tools, environments and turns are set in rollout.multi_turn "
                "(tools, environment, max_turns)",
            )
            for k in ("format", "interaction_config_path", "max_user_turns")
        ),
    )


def _critic_launch_keys() -> tuple[Alias, ...]:
    """Critic keys of verl's launch lines."""
    resident = _RESIDENT.format(role="the critic")
    return (
        _renamed(
            "critic.model.enable_gradient_checkpointing",
            "critic.engine.fsdp.activation_checkpointing",
        ),
        _renamed("critic.model.trust_remote_code", "critic.engine.model.trust_remote_code"),
        _ignored(
            "critic.model.use_remove_padding",
            "padding is skipped by default (critic.engine.model.remove_padding=auto)",
        ),
        *(
            Alias(f"critic.{k}", "ignored", (), resident, accepted=(False,))
            for k in (
                "model.fsdp_config.param_offload",
                "model.fsdp_config.optimizer_offload",
                "megatron.param_offload",
                "megatron.optimizer_offload",
                "megatron.grad_offload",
            )
        ),
        _renamed("critic.ppo_max_token_len_per_gpu", "critic.engine.micro_batch.max_tokens"),
        _ignored("critic.forward_max_token_len_per_gpu", "uses critic.engine.micro_batch"),
        _ignored("critic.use_dynamic_bsz", "set critic.engine.micro_batch.max_tokens to pack"),
        _unsupported(
            "critic.optim.lr_warmup_steps_ratio",
            "give the warmup in steps: critic.engine.optim.warmup_steps",
            accepted=(0, 0.0),
        ),
        *_megatron_extras("critic", "critic"),
    )


def _data_launch_keys() -> tuple[Alias, ...]:
    """Algorithm, data, reward and trainer keys of verl's launch lines."""
    return (
        _unsupported("algorithm.use_pf_ppo", "no priority-filtered PPO here", accepted=(False,)),
        _unsupported("algorithm.pf_ppo.*", "no priority-filtered PPO here"),
        *(
            _unsupported(
                f"algorithm.rollout_correction.{k}",
                "verl's nested rollout-correction keys have no equivalent; ours are "
                "algorithm.rollout_correction.mode / level / rollout_is_cap / mis_low / "
                "mis_high (verl 0.6's flat algorithm.rollout_is_* keys translate)",
            )
            for k in (
                "bypass_mode",
                "loss_type",
                "rollout_is",
                "rollout_is_batch_normalize",
                "rollout_is_threshold",
                "rollout_rs",
                "rollout_rs_threshold",
            )
        ),
        _unsupported("data.image_key", "text-only datasets here"),
        _unsupported(
            "data.custom_cls.*", "no custom dataset class; rows are read by hf_algos.data"
        ),
        _unsupported("data.sampler.*", "no custom sampler; data.shuffle orders the prompts"),
        _ignored("data.dataloader_num_workers", "prompts are batched in the driver"),
        _renamed("data.filter_overlong_prompts_workers", "data.num_proc"),
        _ignored(
            "data.trust_remote_code",
            "the tokenizer follows actor.engine.model.trust_remote_code",
        ),
        _renamed("data.apply_chat_template_kwargs.*", "data.chat_template_kwargs.*"),
        _ignored(
            "reward_model.use_reward_loop", "rewards are scored in reward.num_workers processes"
        ),
        _renamed("reward_model.num_workers", "reward.num_workers"),
        _renamed(
            "reward_model.micro_batch_size_per_gpu", "reward.model.micro_batch.micro_batch_size"
        ),
        Alias(
            "reward_model.model.fsdp_config.param_offload",
            "ignored",
            (),
            _RESIDENT.format(role="the reward model"),
            accepted=(False,),
        ),
        _ignored(
            "reward_model.model.use_remove_padding",
            "padding is skipped by default (reward.model.model.remove_padding=auto)",
        ),
        _unsupported(
            "reward_model.rollout.*",
            "no generative reward model here; reward.model scores with a value head, "
            "reward.function_path with code",
        ),
        _unsupported(
            "reward_model.sandbox_fusion.*",
            "no sandbox service; a reward function (reward.function_path) runs in "
            "reward.num_workers processes",
        ),
        _unsupported(
            "reward_model.reward_kwargs.*",
            "no reward-manager arguments here (verl's DAPO overlong buffer); shape the score "
            "in the reward function (reward.function_path)",
        ),
        _renamed("trainer.max_critic_ckpt_to_keep", "trainer.max_checkpoints"),
        _ignored("trainer.use_legacy_worker_impl", "one worker implementation here"),
    )


VERL_ALIASES: tuple[Alias, ...] = (
    # data
    *(
        _same(f"data.{k}")
        for k in (
            "train_files",
            "val_files",
            "prompt_key",
            "max_prompt_length",
            "train_batch_size",
            "val_batch_size",
            "shuffle",
            "seed",
        )
    ),
    _renamed("data.tokenizer", "data.tokenizer_path"),
    _renamed("data.max_response_length", "rollout.max_new_tokens", configs=("RLConfig",)),
    _renamed("data.max_response_length", "max_response_length", configs=("DPOConfig", "SFTConfig")),
    _renamed(
        "data.filter_overlong_prompts",
        "data.overlong_prompts",
        note="true -> drop, false -> error",
        convert=_map({True: "drop", False: "error"}, "data.filter_overlong_prompts"),
    ),
    _renamed("data.response_key", "response_key", configs=("SFTConfig",)),
    _ignored("data.return_raw_chat", "chat messages are kept in raw_prompt anyway"),
    _ignored("data.truncation", "over-long prompts follow data.overlong_prompts"),
    # model
    _renamed("actor_rollout_ref.model.path", "actor.engine.model.path"),
    _renamed("actor_rollout_ref.model.trust_remote_code", "actor.engine.model.trust_remote_code"),
    _renamed("actor_rollout_ref.model.lora_rank", "actor.lora.rank"),
    _renamed("actor_rollout_ref.model.lora_alpha", "actor.lora.alpha"),
    _renamed("actor_rollout_ref.model.target_modules", "actor.lora.target_modules"),
    _renamed(
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "actor.engine.fsdp.activation_checkpointing",
    ),
    _ignored(
        "actor_rollout_ref.model.use_remove_padding",
        "padding is skipped by default (actor.engine.model.remove_padding=auto)",
    ),
    # actor
    _renamed(f"{_ARA}.optim.lr", "actor.engine.optim.lr"),
    _renamed(
        f"{_ARA}.optim.optimizer",
        "actor.engine.optim.name",
        note=_OPTIMIZER_NOTE,
        convert=_map(_OPTIMIZERS, f"{_ARA}.optim.optimizer"),
    ),
    _renamed(f"{_ARA}.optim.weight_decay", "actor.engine.optim.weight_decay"),
    _renamed(f"{_ARA}.optim.betas", "actor.engine.optim.betas"),
    _renamed(f"{_ARA}.optim.lr_warmup_steps", "actor.engine.optim.warmup_steps"),
    _renamed(f"{_ARA}.optim.warmup_style", "actor.engine.optim.schedule"),
    _renamed(f"{_ARA}.optim.min_lr_ratio", "actor.engine.optim.min_lr_ratio"),
    _renamed(f"{_ARA}.grad_clip", "actor.engine.optim.grad_clip"),
    _renamed(f"{_ARA}.ppo_micro_batch_size_per_gpu", "actor.engine.micro_batch.micro_batch_size"),
    _renamed(f"{_ARA}.ppo_max_token_len_per_gpu", "actor.engine.micro_batch.max_tokens"),
    *(
        _renamed(f"{_ARA}.{k}", f"actor.{k}")
        for k in (
            "ppo_epochs",
            "shuffle",
            "loss_agg_mode",
            "entropy_coeff",
            "use_kl_loss",
            "kl_loss_coef",
            "kl_loss_type",
        )
    ),
    _renamed(f"{_ARA}.clip_ratio_low", "actor.clip_low"),
    _renamed(f"{_ARA}.clip_ratio_high", "actor.clip_high"),
    _renamed(f"{_ARA}.clip_ratio_c", "actor.clip_c"),
    _renamed(f"{_ARA}.clip_ratio", "actor.clip_low", "actor.clip_high"),
    _renamed(
        f"{_ARA}.policy_loss.loss_mode",
        "actor.policy_loss",
        note="vanilla -> ppo",
        convert=lambda v: "ppo" if v == "vanilla" else v,
    ),
    Alias(
        f"{_ARA}.ppo_mini_batch_size",
        "derived",
        ("actor.ppo_mini_batch_size",),
        "verl counts prompts, we count rows: actor.ppo_mini_batch_size = verl's value x rollout.n",
        configs=("RLConfig",),
    ),
    _unsupported(f"{_ARA}.ppo_micro_batch_size", "use actor.engine.micro_batch.micro_batch_size"),
    _ignored(f"{_ARA}.use_dynamic_bsz", "set actor.engine.micro_batch.max_tokens to pack"),
    *(
        _renamed(f"{_ARA}.{k}", "actor.engine.offload", note=_OFFLOAD_NOTE, accepted=(False,))
        for k in (
            "fsdp_config.param_offload",
            "fsdp_config.optimizer_offload",
            "megatron.param_offload",
            "megatron.optimizer_offload",
            "megatron.grad_offload",
        )
    ),
    *_engine_layout(_ARA, "actor"),
    # reference
    _ignored("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "uses the actor's"),
    *(
        Alias(f"{_REF}.{k}", "ignored", (), _REF_OFFLOAD_NOTE, accepted=(False,))
        for k in ("fsdp_config.param_offload", "megatron.param_offload")
    ),
    *_reference_layout(),
    # rollout
    _renamed(
        f"{_ROLL}.name",
        "rollout.backend",
        note="hf -> native; trtllm has no equivalent",
        convert=_rollout_name,
    ),
    *(
        _renamed(f"{_ROLL}.{k}", f"rollout.{k}")
        for k in ("n", "temperature", "top_p", "top_k", "max_model_len", "dtype")
    ),
    _renamed(f"{_ROLL}.response_length", "rollout.max_new_tokens"),
    *(
        Alias(f"{_ROLL}.{k}", "derived", ("rollout.engine_kwargs",), _engine_note(k))
        for k in ROLLOUT_ENGINE_KEYS
    ),
    _ignored(f"{_ROLL}.log_prob_micro_batch_size_per_gpu", "uses the actor's micro-batches"),
    _renamed(
        f"{_ROLL}.val_kwargs.n",
        "trainer.val_samples",
        note="sampled at rollout.temperature besides the greedy answer",
    ),
    _unsupported(
        f"{_ROLL}.val_kwargs.*",
        "validation decodes greedily; rollout.val_kwargs.n (trainer.val_samples) adds k "
        "sampled answers per prompt at rollout.temperature",
    ),
    _renamed(f"{_ROLL}.multi_turn.enable", "rollout.multi_turn.enable"),
    _renamed(f"{_ROLL}.multi_turn.max_assistant_turns", "rollout.multi_turn.max_turns"),
    _renamed(
        f"{_ROLL}.multi_turn.max_tool_response_length",
        "rollout.multi_turn.max_tool_response_tokens",
    ),
    _unsupported(
        f"{_ROLL}.multi_turn.tool_config_path",
        "name registered tools in rollout.multi_turn.tools, or an environment class in "
        "rollout.multi_turn.environment ('path/to/file.py:Class')",
    ),
    # critic
    _renamed("critic.optim.lr", "critic.engine.optim.lr"),
    _renamed(
        "critic.optim.optimizer",
        "critic.engine.optim.name",
        note=_OPTIMIZER_NOTE,
        convert=_map(_OPTIMIZERS, "critic.optim.optimizer"),
    ),
    _renamed("critic.model.path", "critic.engine.model.path"),
    _renamed("critic.ppo_micro_batch_size_per_gpu", "critic.engine.micro_batch.micro_batch_size"),
    *(_same(f"critic.{k}") for k in ("ppo_epochs", "cliprange_value")),
    *_engine_layout("critic", "critic"),
    # Ulysses sequence parallelism (FSDP engine)
    _renamed(
        f"{_ARA}.ulysses_sequence_parallel_size",
        "actor.engine.fsdp.ulysses_sequence_parallel_size",
    ),
    _shared(
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
        "actor.engine.fsdp.ulysses_sequence_parallel_size",
        _REF_NOTE,
    ),
    _renamed(
        "critic.ulysses_sequence_parallel_size",
        "critic.engine.fsdp.ulysses_sequence_parallel_size",
    ),
    # reward
    _renamed("custom_reward_function.path", "reward.function_path"),
    _renamed("custom_reward_function.name", "reward.function_name"),
    _renamed("reward_model.model.path", "reward.model.model.path"),
    _ignored("reward_model.enable", "a reward model is used when reward.model is set"),
    _ignored("reward_model.reward_manager", "one reward manager scores every row"),
    # algorithm
    *(
        _same(f"algorithm.{k}")
        for k in (
            "adv_estimator",
            "gamma",
            "lam",
            "use_kl_in_reward",
            "kl_penalty",
            "kl_ctrl.type",
            "kl_ctrl.kl_coef",
            "kl_ctrl.target_kl",
            "kl_ctrl.horizon",
            "filter_groups.enable",
            "filter_groups.metric",
            "filter_groups.max_num_gen_batches",
        )
    ),
    _renamed("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std"),
    # rollout correction (verl 0.6's flat algorithm.rollout_is_* keys)
    _renamed(
        "algorithm.rollout_is_mode",
        "algorithm.rollout_correction.mode",
        note="truncate -> tis, mask -> mis",
        convert=_map({"truncate": "tis", "mask": "mis"}, "algorithm.rollout_is_mode"),
    ),
    _renamed(
        "algorithm.rollout_is_threshold",
        "algorithm.rollout_correction.rollout_is_cap",
        "algorithm.rollout_correction.mis_high",
        note="the TIS cap and the MIS upper bound; null (verl: off) is refused",
        convert=_not_null(
            "algorithm.rollout_is_threshold",
            "leave algorithm.rollout_correction.mode=off for no correction",
        ),
    ),
    _renamed(
        "algorithm.rollout_is_threshold_lower",
        "algorithm.rollout_correction.mis_low",
        note="null (verl: 1 / threshold) is refused; give the bound",
        convert=_not_null("algorithm.rollout_is_threshold_lower", "drop the key (mis_low=0.5)"),
    ),
    _renamed(
        "algorithm.rollout_is_level",
        "algorithm.rollout_correction.level",
        note="geometric -> sequence (our sequence level is the geometric mean)",
        convert=_map({"token": "token", "geometric": "sequence"}, "algorithm.rollout_is_level"),
    ),
    _ignored(
        "algorithm.rollout_is",
        "the weights apply whenever algorithm.rollout_correction.mode is not off, and the "
        "mismatch metrics are logged in every mode",
    ),
    _ignored(
        "algorithm.rollout_is_veto_threshold",
        "no veto; algorithm.rollout_correction.mode=mis drops out-of-band tokens",
    ),
    # async (verl's fully-async trainer; docs/async.md)
    _renamed(
        "async_training.trigger_parameter_sync_step",
        "trainer.weight_push_every",
        note="one trainer step here consumes one generated batch (verl's require_batches=1)",
    ),
    _renamed("async_training.partial_rollout", "rollout.partial"),
    Alias(
        "async_training.staleness_threshold",
        "refused",
        note=(
            "verl's staleness_threshold is the share of stale samples a batch may hold; "
            "trainer.max_staleness bounds how many policy versions a sample may lag (older "
            "prompt groups are generated again): set trainer.max_staleness (e.g. 2) and "
            "trainer.async_mode=fully_async"
        ),
    ),
    # trainer
    _renamed("trainer.logger", "trainer.loggers"),
    Alias(
        "trainer.n_gpus_per_node",
        "derived",
        ("trainer.n_workers", "trainer.use_gpu"),
        "trainer.n_workers = n_gpus_per_node x trainer.nnodes (our total over all nodes), "
        "and trainer.use_gpu=true (one GPU per worker) unless trainer.device=cpu is given",
    ),
    *(
        _same(f"trainer.{k}")
        for k in (
            "nnodes",
            "total_epochs",
            "total_training_steps",
            "project_name",
            "experiment_name",
            "save_freq",
            "test_freq",
            "val_before_train",
            "val_only",
            "log_val_generations",
        )
    ),
    _renamed("trainer.default_local_dir", "trainer.checkpoint_dir"),
    _renamed(
        "trainer.resume_mode",
        "trainer.resume_mode",
        note="resume_path -> path",
        convert=lambda v: "path" if v == "resume_path" else v,
    ),
    _renamed("trainer.resume_from_path", "trainer.resume_from"),
    _renamed("trainer.max_actor_ckpt_to_keep", "trainer.max_checkpoints"),
    _renamed(
        "trainer.device",
        "trainer.use_gpu",
        note="cuda -> true (a GPU per worker), cpu -> false",
        convert=_map({"cuda": True, "gpu": True, "cpu": False}, "trainer.device"),
    ),
    _unsupported(
        "trainer.critic_warmup",
        "the actor trains from the first step: 0 (verl's default) is accepted",
        accepted=(0,),
    ),
    _ignored(
        "trainer.balance_batch",
        "each rank gets an even share of the rows (uneven batches allowed); verl's reordering "
        "by token count is not done",
    ),
    _ignored(
        f"{_ROLL}.mode",
        "generation follows trainer.async_mode and rollout.multi_turn (verl's async server "
        "mode is our rollout.multi_turn agent loop)",
    ),
    _unsupported("trainer.default_hdfs_dir", "checkpoints go to trainer.checkpoint_dir only"),
    *_launch_line_keys(),
)
"""Every verl key we know, in the order ``docs/from-verl.md`` lists them."""


def find_alias(key: str, config_name: str) -> Alias | None:
    """The table entry for verl key ``key`` under root config ``config_name``, if any."""
    applies = [a for a in VERL_ALIASES if not a.configs or config_name in a.configs]
    exact = next((a for a in applies if a.verl == key), None)
    if exact is not None:
        return exact
    below = [a for a in applies if a.verl.endswith(".*") and key.startswith(a.verl[:-1])]
    return max(below, key=lambda a: len(a.verl), default=None)


@dataclass
class AliasTracker:
    """Per-load state: which of our keys an alias set (to catch conflicting duplicates) and
    values that several keys combine into (``n_gpus_per_node``)."""

    config: type
    """The root config class being loaded."""
    set_by: dict[str, tuple[str, Any, str]] = field(default_factory=dict)
    """Our key -> (the key the user gave, its value, the source), for conflict checks."""
    gpus_per_node: int | None = None
    """verl's ``trainer.n_gpus_per_node`` when given."""
    mini_batch_prompts: tuple[int, str] | None = None
    """verl's ``actor_rollout_ref.actor.ppo_mini_batch_size`` (prompts) and its source."""
    shared: list[tuple[str, Any, str, str]] = field(default_factory=list)
    """``shared`` keys given: (verl key, value, our key it must equal, source)."""
    ignored: list[tuple[str, str]] = field(default_factory=list)
    """verl keys given that have no effect here: (key, why), in the order given."""
    engine: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """verl's rollout engine knobs given (:data:`ROLLOUT_ENGINE_KEYS`): key -> (value, source)."""

    def ignore(self, key: str, note: str) -> None:
        """Note that verl key ``key`` has no effect here (once per key)."""
        if all(given != key for given, _ in self.ignored):
            self.ignored.append((key, note))

    def record(self, given: str, ours: str, value: Any, source: str) -> None:
        """Note that ``given`` set ``ours``; the same key given twice differently is an error."""
        earlier = self.set_by.get(ours)
        if earlier and earlier[0] != given and earlier[1] != value and earlier[2] == source:
            raise ConfigurationError(
                f"{earlier[0]}={earlier[1]!r} and {given}={value!r} set the same key {ours} "
                f"(verl's name and ours) to different values in {source}; keep one of them"
            )
        self.set_by[ours] = (given, value, source)

    def derived(self, tree: Any) -> dict[str, Any]:
        """Values computed from several keys once all sources are merged (see
        :meth:`workers` and :meth:`mini_batch_rows`)."""
        self.check_shared(tree)
        return {**self.workers(tree), **self.mini_batch_rows(tree), **self.engine_kwargs(tree)}

    def engine_kwargs(self, tree: Any) -> dict[str, Any]:
        """verl's rollout engine knobs as ``rollout.engine_kwargs`` of the backend chosen
        (:data:`ROLLOUT_ENGINE_KEYS`); with a backend that has no such option, a no-op noted."""
        from omegaconf import OmegaConf

        backend = str(OmegaConf.select(tree, "rollout.backend", default="native"))
        result: dict[str, Any] = {}
        for key, (value, source) in self.engine.items():
            if ".engine_kwargs." in key:  # verl's engine_kwargs.<backend>.<name>
                for_backend, _, name = key.split(".engine_kwargs.", 1)[1].partition(".")
                if for_backend != backend:
                    self.ignore(key, f"for rollout.name={for_backend}; rollout.backend={backend}")
                    continue
            else:
                name = ROLLOUT_ENGINE_KEYS[key.rpartition(".")[2]].get(backend, "")
            if not name:
                self.ignore(key, _ENGINE_NOTES.get(backend, f"no {backend} rollout option"))
                continue
            ours = f"rollout.engine_kwargs.{name}"
            explicit = self.set_by.get(ours)
            if explicit is not None and explicit[1] != value:
                raise ConfigurationError(
                    f"{key}={value!r} (from {source}) and {ours}={explicit[1]!r} set the same "
                    f"{backend} option; keep one of them"
                )
            result[ours] = value
        return result

    def check_shared(self, tree: Any) -> None:
        """Every ``shared`` key given equals the value of ours it stands for, or raise."""
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        for given, value, ours, source in self.shared:
            try:  # a required section not given yet (``actor: ???``): nothing to compare
                actual = OmegaConf.select(
                    tree, ours, throw_on_missing=False, throw_on_resolution_failure=False
                )
            except (AttributeError, OmegaConfBaseException):  # below a ??? node
                actual = None
            if actual is not None and actual != value:
                verl_ours = next(
                    (a.verl for a in VERL_ALIASES if a.kind == "renamed" and a.ours == (ours,)),
                    ours,
                )
                raise ConfigurationError(
                    f"{given}={value!r} (from {source}) differs from {ours}={actual!r}: "
                    f"HybridFlow's reference runs in the actor's engine layout; set "
                    f"{verl_ours}={value!r} (or {ours}) for both, or drop {given}"
                )

    def mini_batch_rows(self, tree: Any) -> dict[str, Any]:
        """verl's actor mini-batch, counted in prompts, as our rows: x ``rollout.n``."""
        if self.mini_batch_prompts is None:
            return {}
        prompts, source = self.mini_batch_prompts
        rows = prompts * int(tree.rollout.n)
        explicit = self.set_by.get("actor.ppo_mini_batch_size")
        if explicit is not None and int(explicit[1]) != rows:
            raise ConfigurationError(
                f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts} prompts (from {source}) "
                f"is {rows} rows with rollout.n={tree.rollout.n}, but "
                f"actor.ppo_mini_batch_size={explicit[1]} (rows); set only one of them"
            )
        return {"actor.ppo_mini_batch_size": rows}

    def workers(self, tree: Any) -> dict[str, Any]:
        """verl's ``n_gpus_per_node`` gives the workers in total and asks for GPUs, unless
        ``trainer.use_gpu`` (or ``trainer.device``) is given too, which then decides."""
        if self.gpus_per_node is None:
            return {}
        nnodes = int(tree.trainer.nnodes)
        total = self.gpus_per_node * nnodes
        explicit = self.set_by.get("trainer.n_workers")
        if explicit is not None and int(explicit[1]) != total:
            raise ConfigurationError(
                f"trainer.n_gpus_per_node={self.gpus_per_node} x trainer.nnodes={nnodes} = "
                f"{total} workers, but trainer.n_workers={explicit[1]} (the total over all "
                "nodes); set only one of them"
            )
        if "trainer.use_gpu" in self.set_by:  # said outright (trainer.device=cpu): CPU slots
            return {"trainer.n_workers": total}
        return {"trainer.n_workers": total, "trainer.use_gpu": True}


def _apply(
    alias: Alias | None, key: str, value: Any, tracker: AliasTracker, source: str
) -> list[tuple[str, Any]]:
    """``(our key, value)`` pairs for verl key ``key`` (or ours, when no alias matches)."""
    if alias is None:
        if key.split(".")[0] in VERL_ROOTS:
            known = [a.verl for a in VERL_ALIASES]
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigurationError(
                f"verl key {key} (from {source}) has no equivalent in hybridflow{hint}; drop "
                "it (docs/from-verl.md lists the verl keys that are translated)"
            )
        tracker.record(key, key, value, source)
        return [(key, value)]
    if _is_accepted(value, alias.accepted):
        return []
    if alias.kind == "refused":
        raise ConfigurationError(f"{key}={value!r} (from {source}) is refused: {alias.note}")
    if alias.kind == "unsupported":
        raise ConfigurationError(
            f"verl key {key} (from {source}) is not supported by hybridflow: {alias.note}"
        )
    if alias.kind == "ignored":
        tracker.ignore(key, alias.note)
        return []
    if alias.kind == "shared":
        converted = alias.convert(value) if alias.convert is not None else value
        tracker.shared.append((key, converted, alias.ours[0], source))
        return []
    if alias.kind == "derived":
        if alias.verl == "trainer.n_gpus_per_node":
            tracker.gpus_per_node = int(value)
        elif alias.ours == ("rollout.engine_kwargs",) or alias.verl.endswith(".*"):
            tracker.engine[key] = (value, source)
        else:
            tracker.mini_batch_prompts = (int(value), source)
        return []
    converted = alias.convert(value) if alias.convert is not None else value
    below = key[len(alias.verl) - 1 :] if alias.verl.endswith(".*") else ""  # a `x.*` entry
    targets = [ours[:-1] + below if ours.endswith(".*") else ours for ours in alias.ours]
    for ours in targets:
        tracker.record(key, ours, converted, source)
    return [(ours, converted) for ours in targets]


def _is_accepted(value: Any, accepted: tuple[Any, ...]) -> bool:
    """Whether ``value`` is one of ``accepted``, types included (``False`` is not ``0``)."""
    return any(type(value) is type(a) and value == a for a in accepted)


def translate_value(
    key: str, value: Any, tracker: AliasTracker, source: str
) -> list[tuple[str, Any]]:
    """Translate one parsed override ``key=value``: ``(our key, value)`` pairs (verl's value
    converted where we spell it differently: ``rollout.name=hf`` -> ``rollout.backend=native``)."""
    return _apply(find_alias(key, tracker.config.__name__), key, value, tracker, source)


def translate_drop(key: str, config_name: str) -> list[str]:
    """Our key(s) that ``~key`` drops (verl's key dropped means its target is)."""
    alias = find_alias(key, config_name)
    return list(alias.ours) if alias is not None and alias.kind in ("renamed", "same") else [key]


def translate_tree(data: Mapping[str, Any], tracker: AliasTracker, source: str) -> dict[str, Any]:
    """A nested mapping (a YAML file) with verl's keys moved to ours (a new dict)."""
    result: dict[str, Any] = {}
    for key, value in _leaves(data, "", tracker.config.__name__):
        for ours, converted in _apply(
            find_alias(key, tracker.config.__name__), key, value, tracker, source
        ):
            _set(result, ours, converted)
    return result


def _leaves(data: Mapping[str, Any], prefix: str, config_name: str) -> list[tuple[str, Any]]:
    """``(dotted key, value)`` pairs, descending only where a verl key could be deeper."""
    pairs: list[tuple[str, Any]] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        deeper = any(a.verl.startswith(f"{path}.") for a in VERL_ALIASES) or (
            path.split(".")[0] in VERL_ROOTS
        )
        if isinstance(value, Mapping) and deeper and find_alias(path, config_name) is None:
            pairs.extend(_leaves(value, f"{path}.", config_name))
        else:
            pairs.append((path, value))
    return pairs


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):  # a section given as a value: OmegaConf reports it
            child = node[part] = {}
        node = child
    node[leaf] = value
