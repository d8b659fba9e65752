"""The sections of a trainer's configuration, one small frozen dataclass per component.

Every section class ends in ``Section`` (``DataSection``, ``ActorSection``, ...); the top-level
configs a trainer takes end in ``Config`` (``RLConfig``, ``DPOConfig``, ``SFTConfig``), as do
the component configs of the other packages (``hf_engines.EngineConfig``,
``hf_rollout.RolloutConfig``) that sections embed or build.

Each section checks its own values in ``__post_init__`` (a value that must be positive through
:func:`require_positive`); checks that need several sections
(batch sizes against each other and the world size) are in
:mod:`hf_algos.config.validation`. Engine settings reuse :class:`hf_engines.EngineConfig`.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hf_algos.config.correction import RolloutCorrectionSection
from hf_algos.config.multiturn import MultiTurnSection
from hf_controller import ConfigurationError
from hf_engines.config import EngineConfig, LoRAConfig, check_lora_backend, is_planned
from hf_engines.hub import resolve_model_path


def require_positive(name: str, value: float, allow_zero: bool = False) -> None:
    """Raise :class:`~hf_controller.ConfigurationError` naming ``name`` unless ``value`` is
    ``> 0`` (``>= 0`` with ``allow_zero``). The one positive-value check of the sections (and
    of :mod:`hf_algos.config.validation`), so every section words its errors alike."""
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigurationError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def _expand_user(path: str) -> str:
    """``path`` with a leading ``~`` expanded (data specs such as ``reasoning_gym:`` kept)."""
    return str(Path(path).expanduser()) if path.startswith("~") else path


def _existing_files(name: str, paths: tuple[str, ...]) -> None:
    specs = [p for p in paths if p.startswith("reasoning_gym:")]
    missing = [p for p in paths if p not in specs and not Path(p).exists() and not is_planned(p)]
    if missing:
        raise ConfigurationError(
            f"{name} lists files that do not exist: {missing}; give paths to local .jsonl, "
            ".json, .parquet or .arrow files or saved dataset directories (relative paths "
            "are taken from the working directory "
            f"{str(Path.cwd())!r}), or 'reasoning_gym:<task>?size=...' specs"
        )
    if specs:  # reasoning_gym is imported only here: it takes seconds
        from hf_algos.data.reasoning_gym import check_reasoning_gym_spec

        for spec in specs:
            try:
                check_reasoning_gym_spec(spec)
            except (ValueError, ImportError) as error:
                raise ConfigurationError(
                    f"{name} lists the reasoning-gym spec {spec!r}, which cannot be used: "
                    f"{error}. Fix the spec (docs/data.md, 'Tasks from reasoning-gym')"
                ) from error


@dataclass(frozen=True)
class DataSection:
    """Where prompts come from and how many a step uses."""

    train_files: tuple[str, ...] = ()
    """Training files (.jsonl / .json / .parquet / .arrow, or a directory written by
    ``datasets.Dataset.save_to_disk``), rows as in docs/data.md, or
    ``reasoning_gym:<task>?size=...`` specs of generated tasks."""
    val_files: tuple[str, ...] = ()
    """Held-out prompt files for validation (greedy decoding); empty disables validation."""
    tokenizer_path: str | None = None
    """A local Hugging Face tokenizer directory or a model id in the local Hugging Face
    cache; ``None`` uses the actor model's."""
    prompt_key: str = "prompt"
    """Column holding the prompt text (or chat messages)."""
    max_prompt_length: int = 64
    """Prompts are left-padded to this many tokens (after the chat template); a longer one
    follows ``overlong_prompts``."""
    overlong_prompts: Literal["error", "drop"] = "error"
    """A prompt longer than ``max_prompt_length`` (DPO: a pair over its limits): ``error``
    stops before training, naming the file, row and length; ``drop`` leaves it out and logs
    how many were dropped (all of them dropped is an error naming the shortest and longest)."""
    train_batch_size: int = 8
    """Prompts per training step (each sampled ``rollout.n`` times)."""
    val_batch_size: int | None = None
    """Prompts per validation batch; ``None`` takes the whole validation set at once."""
    shuffle: bool = True
    """Shuffle the training prompts every epoch (reproducibly, from ``seed``)."""
    seed: int = 0
    """Seed of the shuffling order."""
    apply_chat_template: bool = True
    """Prompts go through the tokenizer's chat template (with a generation prompt), as verl
    does; a tokenizer without a template gets the raw text (logged). ``false``: raw text
    always (chat messages' contents joined by newlines)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of ``apply_chat_template`` (e.g. ``enable_thinking: false``)."""
    system_prompt: str | None = None
    """Prepended to every prompt as a system message (a row that starts with its own system
    message keeps that one)."""
    num_proc: int = 1
    """Processes that tokenize the dataset (``datasets.Dataset.map(num_proc=...)``)."""

    def __post_init__(self) -> None:
        require_positive("data.num_proc", self.num_proc)
        for name in ("train_files", "val_files"):  # ~/data.jsonl, as a shell would expand it
            paths = tuple(_expand_user(p) for p in getattr(self, name))
            object.__setattr__(self, name, paths)
        _existing_files("data.train_files", self.train_files)
        _existing_files("data.val_files", self.val_files)
        if self.tokenizer_path is not None:  # a directory, or an id in the HF cache
            resolve_model_path(self.tokenizer_path, option="data.tokenizer_path")
        require_positive("data.max_prompt_length", self.max_prompt_length)
        require_positive("data.train_batch_size", self.train_batch_size)
        if self.val_batch_size is not None:
            require_positive("data.val_batch_size", self.val_batch_size)


@dataclass(frozen=True)
class RolloutSection:
    """Generation: backend and sampling; the weights come from the actor."""

    backend: str = "native"
    """Rollout backend name in ``hf_rollout.ROLLOUT_BACKENDS`` (native, vllm, sglang)."""
    n: int = 1
    """Responses sampled per prompt (the group size of GRPO / RLOO)."""
    temperature: float = 1.0
    """Sampling temperature (also used to recompute log-probs)."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 disables it."""
    top_k: int = -1
    """Top-k sampling; -1 disables it."""
    max_new_tokens: int = 32
    """Longest response, in tokens."""
    max_model_len: int = 2048
    """Longest prompt + response the backend must hold."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Weights and compute dtype of the rollout engine; ``None``: the actor's
    ``model.dtype``. vLLM on a GPU wants ``bfloat16`` while the actor keeps fp32 master
    weights (verl's ``rollout.dtype``); pushed weights are cast on load."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Backend-specific options, passed through."""
    partial: bool = False
    """``trainer.async_mode=fully_async``: generate in chunks of ``partial_chunk_tokens``, going
    on with the newest weights after a push; ``false``: a generation ends on its weights."""
    partial_chunk_tokens: int = 16
    """``partial=true``: new tokens per generation chunk."""
    multi_turn: MultiTurnSection = field(default_factory=MultiTurnSection)
    """Multi-turn tool use: episodes against an environment (off by default)."""
    max_replacements: int = 2
    """``trainer.placement=separate``: how many times in a run a rollout group whose worker
    died or missed its call deadline is replaced by a new one (given the actor's current
    weights; the prompts it held are generated again). Past it, the worker's error ends
    the run as before; 0 never replaces."""

    def __post_init__(self) -> None:
        require_positive("rollout.max_replacements", self.max_replacements, allow_zero=True)
        require_positive("rollout.partial_chunk_tokens", self.partial_chunk_tokens)
        require_positive("rollout.n", self.n)
        require_positive("rollout.temperature", self.temperature)
        require_positive("rollout.max_new_tokens", self.max_new_tokens)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigurationError(f"rollout.top_p={self.top_p!r} must be in (0, 1]")


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
    clip_ratio_low: float = 0.2
    """Lower ratio clip ``1 - clip_ratio_low``."""
    clip_ratio_high: float = 0.2
    """Upper ratio clip ``1 + clip_ratio_high`` (clip-higher: raise it, e.g. 0.28)."""
    clip_ratio_c: float | None = None
    """Dual-clip bound for negative advantages (> 1, e.g. 3.0); ``None`` disables it."""
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


@dataclass(frozen=True)
class CriticSection:
    """The value model (PPO with GAE only)."""

    engine: EngineConfig
    """Model (``head`` is forced to ``value``), optimizer and layout of the critic."""
    ppo_mini_batch_size: int = 8
    """Rows per critic optimizer step, over all ranks together."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    cliprange_value: float = 0.5
    """Clip of the value update around the old values."""
    loss_agg_mode: str = "token-mean"
    """How token losses are reduced."""

    def __post_init__(self) -> None:
        require_positive("critic.ppo_mini_batch_size", self.ppo_mini_batch_size)
        require_positive("critic.ppo_epochs", self.ppo_epochs)
        require_positive("critic.cliprange_value", self.cliprange_value)


@dataclass(frozen=True)
class KLControlSection:
    """KL penalty in the reward (``algorithm.use_kl_in_reward``)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    """A fixed coefficient, or one adapted toward ``target_kl``."""
    kl_coef: float = 0.001
    """The (initial) coefficient."""
    target_kl: float = 0.1
    """Adaptive only: the KL to track."""
    horizon: float = 10000.0
    """Adaptive only: steps over which the coefficient adapts."""

    def __post_init__(self) -> None:
        require_positive("algorithm.kl_ctrl.kl_coef", self.kl_coef, allow_zero=True)
        require_positive("algorithm.kl_ctrl.target_kl", self.target_kl)
        require_positive("algorithm.kl_ctrl.horizon", self.horizon)


@dataclass(frozen=True)
class FilterGroupsSection:
    """DAPO dynamic sampling (``algorithm.filter_groups``, verl's keys): drop the prompt groups
    whose samples all score alike (zero advantage under a group baseline), and draw more
    prompts until a step has ``data.train_batch_size`` groups that teach something."""

    enable: bool = False
    """Filter groups after scoring."""
    metric: str = "score"
    """Per-sequence value compared within a group: ``score`` (``token_level_scores`` summed
    over the response) or a key of the reward function's ``reward_extra_info`` (e.g.
    ``acc``)."""
    max_num_gen_batches: int = 0
    """Prompt batches one step may generate before it trains on what it has; 0 means up to
    one epoch's worth of batches (the hard cap)."""

    def __post_init__(self) -> None:
        require_positive(
            "algorithm.filter_groups.max_num_gen_batches", self.max_num_gen_batches, True
        )
        if not self.metric:
            raise ConfigurationError(
                "algorithm.filter_groups.metric is empty; use 'score' or a key of the reward "
                "function's extra info (e.g. 'acc')"
            )


@dataclass(frozen=True)
class AlgorithmSection:
    """Advantage estimation and the reward-side KL penalty."""

    adv_estimator: str = "grpo"
    """Estimator in ``hf_algos.advantages.ADVANTAGE_ESTIMATORS``; one that reads ``values``
    (gae) needs a critic section, one that groups by prompt (grpo, rloo) ``rollout.n >= 2``."""
    gamma: float = 1.0
    """Discount."""
    lam: float = 1.0
    """GAE lambda."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO: divide by the group's standard deviation (False gives Dr. GRPO)."""
    use_kl_in_reward: bool = False
    """Subtract ``beta * KL(policy || reference)`` from the token rewards."""
    kl_penalty: str = "kl"
    """KL estimator of the reward penalty."""
    kl_ctrl: KLControlSection = field(default_factory=KLControlSection)
    """The penalty's coefficient controller."""
    filter_groups: FilterGroupsSection = field(default_factory=FilterGroupsSection)
    """DAPO dynamic sampling: train only on prompt groups whose samples differ."""
    rollout_correction: RolloutCorrectionSection = field(default_factory=RolloutCorrectionSection)
    """Importance weights for the rollout/trainer mismatch (TIS / MIS); off by default."""


@dataclass(frozen=True)
class RewardSection:
    """How responses are scored: the rule-based :class:`~hf_algos.rewards.RewardManager`'s
    config (``RewardManager.from_config``), or a reward model."""

    num_workers: int = 2
    """Processes that run the rule-based scoring functions (by each row's ``data_source``)."""
    timeout_s: float = 10.0
    """Seconds one sample's scoring may take before it scores 0 and is reported."""
    max_error_fraction: float = 0.1
    """Share of a batch's samples (train step or validation batch) that may fail (raise or
    time out) and score 0; above it the run stops, showing the first failures. 1.0: never."""
    max_memory_mb: int | None = 4096
    """Address-space cap (MiB) of each scoring process: a runaway allocation becomes that
    sample's ``MemoryError``. ``null`` disables it."""
    cpu_time_limit_s: float | None = None
    """CPU seconds one sample may use before its scoring process is killed (``SIGXCPU``,
    reported as a dead process with its cause). ``null``: ``2 x timeout_s + 5``; 0: none."""
    hard_timeout_grace_s: float = 60.0
    """Extra seconds a task (a chunk of samples: ``timeout_s`` each) may run before its
    process, which ignores the alarm (stuck in C code), is killed and replaced; its samples
    score 0 and are reported, and the other tasks go on. A batch not done by then for every
    round of tasks (process start-up included) replaces the whole pool. A process that dies
    is reported at once, not at this deadline."""
    start_method: str | None = None
    """How scoring processes start (multiprocessing's start method); ``null``:
    ``forkserver`` where available (each process forks from a server that imported the
    scoring code once, so a replaced one starts fast and no Ray or torch threads are
    forked), else ``spawn``."""
    skip_special_tokens: bool = True
    """Drop special tokens (EOS, chat markers) from the response text a function scores."""
    max_logged_errors: int = 5
    """Failed samples logged one by one per batch (and shown when the run stops for them)."""
    model: EngineConfig | None = None
    """A reward model (value head) scored by a ``RewardModelWorker`` instead of the rules;
    its checkpoint is ``reward.model.model.path``."""
    function_path: str | None = None
    """A Python file (by path; it need not be importable) defining the scoring function
    ``function_name`` (verl: ``custom_reward_function.path``). It scores every row whose
    data_source has no function registered by your code, and replaces the built-in gsm8k /
    math functions; see docs/rewards.md."""
    function_name: str | tuple[str, ...] = "compute_score"
    """The function of ``function_path`` (verl: ``custom_reward_function.name``); verl's,
    HybridFlow's and TRL's batched signatures are accepted. A list (TRL's ``reward_funcs``)
    scores each sample with every function named, each in its own signature: the score is
    their weighted sum (``function_weights``), a function returning ``None`` for a sample is
    left out of its sum, and each is logged as ``reward/<name>/mean``."""
    function_weights: tuple[float, ...] | None = None
    """Weights of the functions of ``function_name``, one per name in the same order (TRL's
    ``reward_weights``); ``null``: 1.0 each."""

    @property
    def function_names(self) -> tuple[str, ...]:
        """``function_name`` as a tuple (one name, or the list's names)."""
        name = self.function_name
        return (name,) if isinstance(name, str) else tuple(name)

    def __post_init__(self) -> None:
        if not isinstance(self.function_name, str):  # a list given in Python: keep it frozen
            object.__setattr__(self, "function_name", tuple(self.function_name))
        if self.function_weights is not None:
            weights = tuple(float(w) for w in self.function_weights)
            object.__setattr__(self, "function_weights", weights)
        _check_function_list(self.function_names, self.function_weights)
        if self.function_path is None and (
            self.function_weights is not None or len(self.function_names) > 1
        ):
            raise ConfigurationError(
                f"reward.function_name={list(self.function_names)} with reward.function_weights"
                f"={None if self.function_weights is None else list(self.function_weights)} "
                f"needs reward.function_path, the file that defines those functions; set it, "
                f"or drop function_weights and give one function_name (without a file, the "
                f"functions registered for each data_source score it)"
            )
        if self.function_path is not None and self.model is not None:
            raise ConfigurationError(
                f"reward.function_path={self.function_path!r} and reward.model are both set; "
                f"a run scores with one of them: drop reward.model to score with the file, "
                f"or reward.function_path to score with the reward model"
            )
        if self.function_path is not None and not Path(self.function_path).is_file():
            raise ConfigurationError(
                f"reward.function_path={self.function_path!r} is not a file; give the path of "
                f"a Python file defining {', '.join(self.function_names)} (relative paths are "
                f"taken from the working directory {str(Path.cwd())!r})"
            )
        require_positive("reward.num_workers", self.num_workers)
        require_positive("reward.timeout_s", self.timeout_s)
        if self.hard_timeout_grace_s < 0:
            raise ValueError(
                f"reward.hard_timeout_grace_s={self.hard_timeout_grace_s} must be >= 0"
            )
        if not 0.0 <= self.max_error_fraction <= 1.0:
            raise ValueError(
                f"reward.max_error_fraction={self.max_error_fraction} must be in [0, 1] "
                f"(1.0 never stops the run for failed samples)"
            )
        if self.max_memory_mb is not None and self.max_memory_mb < 64:
            raise ValueError(
                f"reward.max_memory_mb={self.max_memory_mb} is too small for a Python "
                f"process; give at least 64 (MiB) or null to disable the cap"
            )
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ValueError(
                f"reward.start_method={self.start_method!r} is not available here; choose "
                f"from {methods} (or null: forkserver where available)"
            )

    @property
    def process_start_method(self) -> str:
        """``start_method``, or ``forkserver`` where available, else ``spawn``."""
        if self.start_method is not None:
            return self.start_method
        return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

    @property
    def cpu_limit_per_sample_s(self) -> float | None:
        """The CPU-time limit per sample in force (``None``: none)."""
        if self.cpu_time_limit_s is None:
            return 2 * self.timeout_s + 5
        return self.cpu_time_limit_s or None


def _check_function_list(names: tuple[str, ...], weights: tuple[float, ...] | None) -> None:
    """Refuse ``reward.function_name`` / ``function_weights`` that cannot pair up."""
    if not names or not all(names):
        raise ConfigurationError(
            f"reward.function_name={list(names)} must name at least one function, each a "
            f"non-empty name of a function of reward.function_path"
        )
    if weights is not None and len(weights) != len(names):
        raise ConfigurationError(
            f"reward.function_weights has {len(weights)} weight(s) {list(weights)} but "
            f"reward.function_name names {len(names)} function(s) {list(names)}; give one "
            f"weight per function, in the same order (or null: 1.0 each)"
        )


@dataclass(frozen=True)
class TrainerSection:
    """The driver: steps, placement, logging, checkpoints, validation."""

    total_epochs: int = 1
    """Passes over the training prompts."""
    total_training_steps: int | None = None
    """Stop after this many steps (default: all epochs)."""
    placement: Literal["hybrid", "separate"] = "hybrid"
    """``hybrid``: actor, rollout and reference fused in one process per slot, weights synced
    in process; ``separate``: each role its own pool, weights streamed from actor rank 0 to
    the rollout ranks over a torch.distributed channel (never through the driver)."""
    nnodes: int = 1
    """Machines (Ray nodes) the run spans; each role group puts ``n_workers / nnodes``
    processes on each of them (one placement group per node)."""
    n_workers: int = 1
    """Processes per role group in TOTAL, over all nodes (one per GPU, or CPU slots); must be
    a multiple of ``nnodes``. verl's ``trainer.n_gpus_per_node=k`` is accepted and sets
    ``n_workers = k * nnodes`` and ``use_gpu=true``."""
    rollout_workers: int | None = None
    """``separate`` placement: processes of the rollout group in total (default
    ``n_workers``); a multiple of ``nnodes``."""
    weight_bucket_mb: int = 64
    """``separate`` placement: bucket size of the weight channel (MiB per broadcast)."""
    async_mode: Literal["off", "one_step_off", "fully_async"] = "off"
    """``off``: generate, then train, each step; ``one_step_off``: the rollout generates batch
    t+1 with the weights of step t-1 while the actor trains on batch t; ``fully_async``:
    ``queue_size`` generations run ahead of the trainer (docs/async.md). Async modes need
    ``placement=separate``."""
    weight_push_every: int = 1
    """``fully_async``: push the actor's weights to the rollout every this many steps."""
    max_staleness: int = 2
    """``fully_async``: a prompt group generated by a policy more than this many versions
    older than the trainer's is dropped and generated again (``async/stale_dropped``)."""
    queue_size: int = 2
    """``fully_async``: generated-but-untrained batches kept in flight ahead of the trainer."""
    use_gpu: bool = False
    """Reserve GPUs for the workers (``gpus_per_worker`` each) and compute on them (verl's
    ``trainer.device=cuda``). Refused at start where there is no GPU: never a CPU run."""
    cpus_per_worker: float | None = None
    """CPUs reserved per process (default 1 with GPUs, 0.1 without, so several CPU workers
    share a core)."""
    gpus_per_worker: float = 1.0
    """GPUs reserved per training process when ``use_gpu`` (fractions allowed)."""
    rollout_gpus_per_worker: float | None = None
    """``separate`` placement: GPUs per rollout process (default ``gpus_per_worker``), e.g. 2
    for a tensor-parallel vLLM replica."""
    backend: Literal["ray", "local"] = "ray"
    """``local`` runs the workers inside the driver process (one worker only; for debugging
    and the lowest per-step overhead)."""
    prestart_workers: bool = True
    """Ray backend, ``hybridflow`` command: start the training pool's worker processes right
    after Ray, before the driver imports torch, so that their imports overlap (seconds of
    start-up; :mod:`hf_algos.trainers.placement`). ``false``: they start with the groups."""
    project_name: str = "hybridflow"
    """Tracking project name."""
    experiment_name: str = "run"
    """Tracking run name."""
    loggers: tuple[str, ...] = ("console",)
    """Metric sinks from ``hf_algos.tracking.LOGGERS`` (console, jsonl, tensorboard, wandb,
    mlflow)."""
    log_dir: str = "outputs/logs"
    """Root of the run directories: each run logs into its own
    ``<log_dir>/<project_name>/<experiment_name>/<run id>`` (metrics.jsonl, TensorBoard
    events, wandb files, config.yaml); the MLflow store is ``<log_dir>/mlruns``."""
    wandb_mode: Literal["auto", "online", "offline", "disabled"] = "auto"
    """``auto``: stream to W&B when an API key is configured (``WANDB_API_KEY`` or
    ``wandb login``), offline files when not; the others are used as given."""
    log_val_generations: int = 0
    """Log this many sample generations (prompt, response, ground truth, score) per
    validation to every logger (a table where it has one); 0 logs none."""
    trace_file: str | None = None
    """Write the worker groups' call timeline here as a Chrome trace at the end of ``fit``
    (and when it fails); a relative path is inside the run directory. Open it in
    https://ui.perfetto.dev."""
    ray_dashboard: bool = False
    """Start the Ray dashboard with the trainer's local Ray (``pip install 'ray[default]'``)."""
    progress_bar: bool = True
    """Show a tqdm progress bar over the steps."""
    test_freq: int = 0
    """Validate every this many steps (and at the end); 0 disables."""
    val_before_train: bool = False
    """Validate once before the first step."""
    val_only: bool = False
    """Validate once (the model, or the checkpoint ``resume_from`` names) and stop without
    training; every greedy generation goes to the loggers (``generations.jsonl``). What
    ``hybridflow eval`` runs; verl's ``trainer.val_only``."""
    val_samples: int = 0
    """Besides the greedy answer, sample this many answers per validation prompt at the
    rollout's temperature: ``val/sampled/accuracy`` (mean@k), ``val/sampled/pass@k`` and
    ``val/sampled/maj@k`` (the most frequent answer, or the ``pred`` a reward function
    returns, is right; verl's ``val_kwargs.n`` with ``do_sample``), during training too;
    0 validates greedily only."""
    save_freq: int = 0
    """Checkpoint every this many steps (and at the end); 0 disables."""
    checkpoint_dir: str = "outputs/checkpoints"
    """Where ``global_step_<k>`` checkpoint directories go."""
    resume_mode: Literal["auto", "disable", "path"] = "auto"
    """``auto``: continue from the latest checkpoint in ``checkpoint_dir`` if any;
    ``path``: from ``resume_from``; ``disable``: start fresh."""
    resume_from: str | None = None
    """A ``global_step_<k>`` directory (``resume_mode=path``)."""
    max_checkpoints: int | None = None
    """Keep only this many newest checkpoints; ``None`` keeps all (the one
    ``latest_checkpointed_iteration.txt`` names is never deleted)."""
    export_dir: str | None = None
    """``hybridflow`` command: after the last step, save the trained actor there as a Hugging
    Face directory (``from_pretrained`` loads it, tokenizer included), like TRL's
    ``output_dir``; ``None`` keeps only the checkpoints (``hybridflow export`` converts one)."""
    call_timeout_s: float | None = 3600.0
    """Deadline of every blocking call on a worker group (a step's generate, update,
    log-prob, save...). Past it the run stops with ``WorkerTimeoutError`` naming the group,
    method, the ranks that have not answered and each one's current Python stack, instead of
    waiting forever on a stuck worker. ``None`` waits without limit."""
    max_restarts: int = 0
    """When a worker process dies during a step, tear the worker groups down, re-create
    them and resume from the last checkpoint (or the start) up to this many times; 0 stops
    the run with the dead worker's error. Set ``save_freq`` so little is re-run."""
    seed: int = 0
    """Seed of the driver's RNGs (sampling seeds derive from it)."""

    @property
    def workers_per_node(self) -> int:
        """Processes of each training role group on every node."""
        return self.n_workers // self.nnodes

    def __post_init__(self) -> None:
        require_positive("trainer.total_epochs", self.total_epochs)
        if self.total_training_steps is not None:
            require_positive("trainer.total_training_steps", self.total_training_steps)
        require_positive("trainer.n_workers", self.n_workers)
        require_positive("trainer.nnodes", self.nnodes)
        require_positive("trainer.gpus_per_worker", self.gpus_per_worker)
        if self.cpus_per_worker is not None:
            require_positive("trainer.cpus_per_worker", self.cpus_per_worker)
        if self.rollout_gpus_per_worker is not None:
            require_positive("trainer.rollout_gpus_per_worker", self.rollout_gpus_per_worker)
        for name, total in (
            ("n_workers", self.n_workers),
            ("rollout_workers", self.rollout_workers),
        ):
            if total is not None and total % self.nnodes != 0:
                raise ConfigurationError(
                    f"trainer.{name}={total} (the total over all nodes) cannot be split evenly "
                    f"over trainer.nnodes={self.nnodes}; use a multiple of {self.nnodes} "
                    f"(e.g. trainer.{name}={self.nnodes * max(1, total // self.nnodes)}) or "
                    f"trainer.nnodes=1"
                )
        require_positive("trainer.weight_bucket_mb", self.weight_bucket_mb)
        require_positive("trainer.weight_push_every", self.weight_push_every)
        require_positive("trainer.max_staleness", self.max_staleness, allow_zero=True)
        require_positive("trainer.queue_size", self.queue_size)
        require_positive("trainer.test_freq", self.test_freq, allow_zero=True)
        require_positive("trainer.save_freq", self.save_freq, allow_zero=True)
        require_positive("trainer.max_restarts", self.max_restarts, allow_zero=True)
        require_positive("trainer.log_val_generations", self.log_val_generations, allow_zero=True)
        require_positive("trainer.val_samples", self.val_samples, allow_zero=True)
        if self.call_timeout_s is not None:
            require_positive("trainer.call_timeout_s", self.call_timeout_s)
        resume_dir = Path(self.resume_from) if self.resume_from is not None else None
        if self.resume_mode == "path" and (resume_dir is None or not resume_dir.is_dir()):
            raise ConfigurationError(
                f"trainer.resume_mode='path' needs trainer.resume_from to be an existing "
                f"checkpoint directory (global_step_<k>); got {self.resume_from!r}"
            )
        if self.backend == "local" and (self.n_workers != 1 or self.placement != "hybrid"):
            raise ConfigurationError(
                f"trainer.backend='local' runs one worker in the driver process; it needs "
                f"trainer.n_workers=1 and placement='hybrid' (got {self.n_workers}, "
                f"{self.placement!r}); use backend='ray' for more"
            )


@dataclass(frozen=True)
class DPOSection:
    """DPO loss and, for online DPO, how pairs are made."""

    beta: float = 0.1
    """Inverse temperature of the implicit reward."""
    loss_type: str = "sigmoid"
    """DPO loss variant in ``hf_algos.losses.dpo`` (sigmoid, ipo, hinge, ...)."""
    label_smoothing: float = 0.0
    """Conservative-DPO label noise."""
    online: bool = False
    """Sample ``rollout.n`` responses per prompt, score them and pair best against worst."""
    mini_batch_size: int = 8
    """Pairs per optimizer step, over all ranks."""

    def __post_init__(self) -> None:
        require_positive("dpo.beta", self.beta)
        require_positive("dpo.mini_batch_size", self.mini_batch_size)
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigurationError(
                f"dpo.label_smoothing={self.label_smoothing!r} must be in [0, 0.5)"
            )
