"""Typed configuration of a training engine, validated before any process group starts.

Each component owns a small dataclass; :class:`EngineConfig` only groups them. Building a
config (directly or with :func:`config_from_dict`) checks every value, so a wrong path, an
unknown key or a batch size that does not divide fails in the driver, naming the value and
the fix, rather than minutes later inside a worker.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import math
import typing
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from hf_controller import ConfigurationError
from hf_engines.gguf import check_gguf, is_gguf_reference
from hf_engines.hub import resolve_model_path

DType = Literal["float32", "bfloat16", "float16"]
_DTYPES = typing.get_args(DType)
ComputeDType = Literal["auto", "float32", "bfloat16", "float16"]
"""A compute dtype, or ``auto``: bf16 where the device computes it natively and the model
is bf16-safe, else fp32 (:func:`hf_engines.precision.choose_compute_dtype`)."""

ConfigT = TypeVar("ConfigT")


_DRY_CHECKS: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "hf_engines_dry_checks", default=None
)


@contextmanager
def dry_checks(planned: Iterable[str] = ()) -> Iterator[None]:
    """Within this scope, building a config checks every value but writes nothing: a GGUF
    model file is checked, not imported into the cache, and the ``planned`` paths (files a
    caller makes only when the run starts, e.g. a packaged example's model) are taken as
    existing. ``hybridflow`` checks a config this way before it makes anything, and
    ``--cfg`` stops there."""
    token = _DRY_CHECKS.set((_DRY_CHECKS.get() or frozenset()) | frozenset(map(str, planned)))
    try:
        yield
    finally:
        _DRY_CHECKS.reset(token)


def is_planned(path: str) -> bool:
    """Whether ``path`` is one of the planned paths of the current :func:`dry_checks`, or
    inside one (a planned directory's files are planned too)."""
    return any(Path(path).is_relative_to(planned) for planned in _DRY_CHECKS.get() or ())


def checks_are_dry() -> bool:
    """Whether the current config checks must write nothing (:func:`dry_checks`)."""
    return _DRY_CHECKS.get() is not None


def _check_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    if value not in choices:
        raise ConfigurationError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def _check_positive(name: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{name}={value!r} must be {bound}")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to train and how to materialise it."""

    path: str | None = None
    """A local Hugging Face model directory (with ``config.json``), a model id
    (``org/name``) already in the local Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``), or
    a GGUF file (``*.gguf``, or ``pkg:<module>/<file>`` shipped by an installed package),
    imported once into a cached model directory; nothing is downloaded at run time."""
    hf_config: dict[str, Any] | None = None
    """A Hugging Face config dict (with ``model_type``) for a randomly initialised model."""
    dtype: DType = "float32"
    """Dtype the parameters (and so the optimizer's master copy) are stored in. The
    compute precision of the FSDP engine is ``fsdp.param_dtype`` (``auto``: bf16 where the
    hardware has it, over these fp32 master weights)."""
    seed: int = 0
    """Seed for random initialisation (model or new head); the same on every rank."""
    head: Literal["causal_lm", "value"] = "causal_lm"
    """``causal_lm`` for actor / reference log-probs; ``value`` adds a 1-output critic head."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to transformers (``sdpa``, ``eager``, ...)."""
    trust_remote_code: bool = False
    """Run the Python code a model directory ships (``auto_map`` in its ``config.json``);
    passed to transformers' ``AutoConfig`` / ``AutoModel*`` / ``AutoTokenizer``."""
    revision: str | None = None
    """Branch, tag or commit of a model id in the cache (default ``main``); ids only."""
    remove_padding: Literal["auto", "pack", "trim", "off"] = "auto"
    """Skip padding tokens: ``pack`` all real tokens into one row (varlen), ``trim`` the
    columns that are padding in every row of a micro-batch, or ``off``. ``auto`` packs with
    flash-attention kernels and trims otherwise (packing costs dense kernels N**2)."""

    def __post_init__(self) -> None:
        if (self.path is None) == (self.hf_config is None):
            raise ConfigurationError(
                "model needs exactly one of model.path (a local Hugging Face model directory) "
                "or model.hf_config (a config dict for random initialisation); "
                f"got path={self.path!r} and hf_config={'set' if self.hf_config else None}"
            )
        if self.path is not None and not is_planned(self.path):
            if checks_are_dry() and is_gguf_reference(self.path):
                # The file and its architecture; assembled and imported by the run.
                check_gguf(self.path, assemble=False)
            else:
                _check_model_directory(self.local_path(), self.path, self.trust_remote_code)
        elif self.revision is not None:
            raise ConfigurationError(
                f"model.revision={self.revision!r} needs model.path to be a model id; "
                "model.hf_config builds a random model, which has no revisions"
            )
        if self.hf_config is not None and "model_type" not in self.hf_config:
            raise ConfigurationError(
                "model.hf_config has no 'model_type' key; add e.g. model_type='llama' so "
                f"transformers knows the architecture (keys given: {sorted(self.hf_config)})"
            )
        if self.dtype == "auto":
            raise ConfigurationError(
                "model.dtype='auto' is not a storage dtype: the parameters and optimizer state "
                "stay in model.dtype (float32 for mixed precision); the compute precision is "
                "fsdp.param_dtype, which takes 'auto' (bf16 where this hardware has it)"
            )
        _check_choice("model.dtype", self.dtype, _DTYPES)
        _check_choice("model.head", self.head, ("causal_lm", "value"))
        _check_choice("model.remove_padding", self.remove_padding, ("auto", "pack", "trim", "off"))

    def local_path(self) -> str | None:
        """The local directory of :attr:`path` (a model id resolved offline through the
        Hugging Face cache at :attr:`revision`); ``None`` for an ``hf_config`` model."""
        if self.path is None:
            return None
        return str(resolve_model_path(self.path, self.revision))


def _check_model_directory(directory: str | None, path: str, trust_remote_code: bool) -> None:
    """Raise naming the fix unless ``directory`` holds a ``config.json`` transformers can use.

    A config whose ``auto_map`` names the directory's own Python code needs
    ``trust_remote_code``; checked here so the refusal is ours, before a worker starts.
    """
    assert directory is not None
    config_file = Path(directory) / "config.json"
    if not config_file.is_file():
        raise ConfigurationError(
            f"model.path={path!r} ({directory}) has no config.json. Set model.path to a Hugging "
            "Face model directory (save one with model.save_pretrained(dir)) or a cached model "
            "id; for a randomly initialised model give model.hf_config"
        )
    auto_map = json.loads(config_file.read_text()).get("auto_map")
    if auto_map and not trust_remote_code:
        raise ConfigurationError(
            f"model.path={path!r} ships its own model code (config.json auto_map: "
            f"{sorted(auto_map)}), which runs only with model.trust_remote_code=true; set it "
            "if you trust that code, or use a model whose architecture transformers includes"
        )


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer (AdamW, or Muon with AdamW), gradient clipping and the learning-rate
    schedule."""

    name: Literal["adamw", "muon"] = "adamw"
    """``adamw`` steps every parameter with AdamW. ``muon`` steps the 2-D weight matrices of
    the transformer blocks (attention and MLP projections; LoRA adapters with LoRA on) with
    torch's ``Muon`` and everything else (embeddings, output / value head, norms, biases)
    with AdamW as configured here. Muon's step is scaled with torch's
    ``adjust_lr_fn='match_rms_adamw'`` (0.2 x sqrt(max(rows, cols))), so its update has
    AdamW's RMS and the same ``lr``, ``weight_decay`` and schedule suit both groups. On
    FSDP2 each matrix's update is orthogonalized whole (one all-gather of it per step); the
    Megatron engine takes it with ``tensor_model_parallel_size=1`` only. See
    ``hf_engines.optim``."""
    lr: float = 1e-5
    """Peak learning rate."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    muon_momentum: float = 0.95
    """Muon's momentum factor (Nesterov momentum), in [0, 1); used with ``name='muon'``."""
    muon_ns_steps: int = 5
    """Newton-Schulz iterations that orthogonalize each Muon update (torch's default 5;
    fewer are cheaper and less exact); used with ``name='muon'``."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this value; ``None`` disables clipping."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from ``lr / warmup_steps`` to ``lr``."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: keep ``lr``, or decay it along a half cosine until ``total_steps``."""
    total_steps: int | None = None
    """Total optimizer steps of the run, where the cosine schedule ends. Unset, HybridFlow's
    trainers set it from the run's length; an engine built with it unset and the cosine
    schedule raises."""
    min_lr_ratio: float = 0.0
    """Cosine floor, as a fraction of ``lr``."""
    fused: bool = False
    """Step AdamW with torch's fused kernel (all parameters in a few kernels) instead of its
    ``foreach`` loop; both work on FSDP2's DTensor shards and give the same update up to
    rounding. Meant for GPUs, where the step is host-bound at small sizes
    (docs/benchmarks.md, "The GPU run")."""

    def __post_init__(self) -> None:
        _check_choice("optim.name", self.name, ("adamw", "muon"))
        _check_positive("optim.lr", self.lr)
        _check_positive("optim.weight_decay", self.weight_decay, allow_zero=True)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigurationError(f"optim.betas={self.betas!r} must be two numbers in [0, 1)")
        object.__setattr__(self, "betas", (float(self.betas[0]), float(self.betas[1])))
        if self.grad_clip is not None:
            _check_positive("optim.grad_clip", self.grad_clip)
        _check_positive("optim.warmup_steps", self.warmup_steps, allow_zero=True)
        _check_choice("optim.schedule", self.schedule, ("constant", "cosine"))
        if self.total_steps is not None and self.total_steps <= self.warmup_steps:
            raise ConfigurationError(
                f"optim.total_steps={self.total_steps} must be > optim.warmup_steps="
                f"{self.warmup_steps}: set total_steps to the number of optimizer steps of the "
                "run (or leave it unset where a trainer sets it from the run's length)"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigurationError(f"optim.min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ConfigurationError(
                f"optim.muon_momentum={self.muon_momentum!r} must be in [0, 1) (torch's default "
                "0.95)"
            )
        if not isinstance(self.muon_ns_steps, int) or not 1 <= self.muon_ns_steps < 100:
            raise ConfigurationError(
                f"optim.muon_ns_steps={self.muon_ns_steps!r} must be an integer in [1, 99] "
                "(torch's default 5)"
            )


@dataclass(frozen=True)
class FSDPConfig:
    """FSDP2 layout and memory policy."""

    dp_replicate: int = 1
    """Replicas (HSDP); each shards the model over ``dp_shard`` ranks."""
    dp_shard: int = -1
    """Ranks one copy of the model is sharded over; -1 means world_size // dp_replicate."""
    param_dtype: ComputeDType = "float32"
    """Dtype of parameters during forward / backward (mixed precision): the compute
    precision. ``auto``: ``bfloat16`` on a CPU with AMX or AVX512_BF16 (``/proc/cpuinfo``
    flags) or a GPU with native bf16, when the checkpoint is bf16 or fp32 (not fp16), else
    ``float32``; resolved once in the driver, which logs one line with the reason. The
    parameters and optimizer state stay in ``model.dtype``."""
    reduce_dtype: DType = "float32"
    """Dtype gradients are reduced in."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in backward to save memory."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state on the CPU (CUDA only)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (ZeRO-3); False keeps them until backward."""
    blocks_per_unit: int = 1
    """Transformer blocks sharded as one FSDP unit: each unit is gathered with one
    all-gather and one set of hooks. More blocks per unit means fewer, larger collectives
    and less host work per step, for more memory held while a unit runs. 0 makes the whole
    model one unit (only the root is sharded): the least host work, with every gathered
    parameter held at once."""
    gradient_sync: Literal["auto", "every_micro_batch", "last_micro_batch"] = "auto"
    """When gradients are reduced over the ranks during gradient accumulation.
    ``every_micro_batch`` reduce-scatters each micro-batch's gradients (sharded
    accumulation, the least memory). ``last_micro_batch`` accumulates them unsharded and
    reduces once per step, as DDP's ``no_sync``: less communication and host work, with the
    full gradients held on every rank; with ``reshard_after_forward=False`` the gathered
    parameters are also kept from one micro-batch to the next. ``auto`` is
    ``last_micro_batch`` where that costs no memory (``dp_shard`` is 1, so a shard is the
    whole gradient, and ``cpu_offload`` is off), else ``every_micro_batch``."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Compute device: ``auto`` picks CUDA when the process group backend is NCCL."""
    ulysses_sequence_parallel_size: int = 1
    """Ranks that split each micro-batch's packed tokens between them (Ulysses sequence
    parallelism): every attention layer swaps sequence shards for head shards with an
    all-to-all. Divides the world size and the model's attention and key/value heads;
    verl's ``ulysses_sequence_parallel_size``. FSDP still shards over all ranks."""

    def __post_init__(self) -> None:
        _check_positive("fsdp.dp_replicate", self.dp_replicate)
        _check_positive("fsdp.ulysses_sequence_parallel_size", self.ulysses_sequence_parallel_size)
        if self.dp_shard != -1:
            _check_positive("fsdp.dp_shard", self.dp_shard)
        _check_choice("fsdp.param_dtype", self.param_dtype, ("auto", *_DTYPES))
        _check_choice("fsdp.reduce_dtype", self.reduce_dtype, _DTYPES)
        _check_choice("fsdp.device", self.device, ("auto", "cpu", "cuda"))
        _check_positive("fsdp.blocks_per_unit", self.blocks_per_unit, allow_zero=True)
        _check_choice(
            "fsdp.gradient_sync",
            self.gradient_sync,
            ("auto", "every_micro_batch", "last_micro_batch"),
        )

    def mesh_shape(self, world_size: int) -> tuple[int, int]:
        """Return ``(dp_replicate, dp_shard)`` for ``world_size`` ranks, or raise naming the fix."""
        shard = world_size // self.dp_replicate if self.dp_shard == -1 else self.dp_shard
        if shard < 1 or self.dp_replicate * shard != world_size:
            raise ConfigurationError(
                f"fsdp.dp_replicate={self.dp_replicate} x fsdp.dp_shard={self.dp_shard} does not "
                f"cover world_size={world_size}; choose values whose product is {world_size} "
                "(or dp_shard=-1)"
            )
        return self.dp_replicate, shard


AUTO_MICRO_BATCH_TOKENS = 2048
"""The token budget of a micro-batch when neither ``micro_batch_size`` nor ``max_tokens`` is
set (raised to the longest row of a batch). Measured on SmolLM2-135M on 2 CPU cores
(docs/benchmarks.md, "The real model on a CPU"): one row at a time (the old default) took
1.5x a plain loop's update; 2048 tokens 1.0x; 4096 tokens 1.3x (the logits over a 49k
vocabulary outgrow the caches). On a GPU a larger budget is faster: set ``max_tokens``
(verl's ``ppo_max_token_len_per_gpu``)."""


@dataclass(frozen=True)
class MicroBatchConfig:
    """How a mini-batch is split into micro-batches for gradient accumulation.

    Neither field set (the default): rows are packed in order into micro-batches of at most
    :data:`AUTO_MICRO_BATCH_TOKENS` tokens (at least the longest row)."""

    micro_batch_size: int | None = None
    """Rows per micro-batch (ignored when ``max_tokens`` is set); verl's
    ``ppo_micro_batch_size_per_gpu``."""
    max_tokens: int | None = None
    """Token budget per micro-batch (attention-mask tokens); rows are packed in order;
    verl's ``ppo_max_token_len_per_gpu``."""

    def __post_init__(self) -> None:
        if self.micro_batch_size is not None:
            _check_positive("micro_batch.micro_batch_size", self.micro_batch_size)
        if self.max_tokens is not None:
            _check_positive("micro_batch.max_tokens", self.max_tokens)


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters (LoRA, through ``peft``) on a trained model; ``rank=0`` is off.

    With LoRA on, the base weights are frozen and only the adapters train (and sit in the
    optimizer and the checkpoints); the rollout and a merged export get ``W + alpha/rank *
    B @ A`` under the base model's own parameter names. See ``docs/lora.md``.
    """

    rank: int = 0
    """Rank ``r`` of each adapter; 0 trains every weight (no ``peft`` import at all)."""
    alpha: float = 16.0
    """Adapter scale numerator: the update is ``alpha / rank * B @ A``."""
    target_modules: tuple[str, ...] = ("all-linear",)
    """Module names (suffixes) that get adapters, as ``peft`` matches them; ``all-linear``
    takes every linear layer except the output head."""
    dropout: float = 0.0
    """Dropout on the adapter's input during training."""

    def __post_init__(self) -> None:
        targets = self.target_modules
        object.__setattr__(
            self, "target_modules", (targets,) if isinstance(targets, str) else tuple(targets)
        )
        _check_positive("lora.rank", self.rank, allow_zero=True)
        _check_positive("lora.alpha", self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigurationError(f"lora.dropout={self.dropout!r} must be in [0, 1)")
        if not self.target_modules:
            raise ConfigurationError(
                "lora.target_modules is empty; name the layers to adapt (e.g. [q_proj, v_proj]) "
                "or keep the default [all-linear]"
            )
        if "all-linear" in self.target_modules and len(self.target_modules) > 1:
            raise ConfigurationError(
                f"lora.target_modules={list(self.target_modules)!r} mixes 'all-linear' with "
                "module names; give either [all-linear] or only module names"
            )

    @property
    def enabled(self) -> bool:
        """Whether adapters are used (``rank > 0``)."""
        return self.rank > 0


def check_lora_backend(lora: LoRAConfig, engine: EngineConfig, role: str) -> None:
    """Raise naming the fix when ``lora`` is on for an engine that cannot train adapters."""
    if not lora.enabled:
        return
    if engine.backend != "fsdp":
        raise ConfigurationError(
            f"{role}: lora.rank={lora.rank} needs the FSDP2 engine, but backend="
            f"{engine.backend!r}; set backend='fsdp' (the Megatron engine trains full weights "
            "only) or lora.rank=0"
        )
    if engine.model.head != "causal_lm":
        raise ConfigurationError(
            f"{role}: LoRA adapts causal-LM policies; model.head={engine.model.head!r} would "
            "leave a new value head frozen at its random initialisation; set lora.rank=0"
        )


def check_sequence_parallel(engine: EngineConfig, world_size: int, role: str) -> None:
    """Raise naming the fix when ``fsdp.ulysses_sequence_parallel_size`` cannot split
    ``world_size`` ranks (the heads are checked when the model is built)."""
    size = engine.fsdp.ulysses_sequence_parallel_size
    if size == 1:
        return
    if engine.backend != "fsdp":
        raise ConfigurationError(
            f"{role}: fsdp.ulysses_sequence_parallel_size={size} is for the FSDP2 engine, but "
            f"backend={engine.backend!r}; set backend='fsdp' or leave the size at 1"
        )
    if world_size % size:
        raise ConfigurationError(
            f"{role}: fsdp.ulysses_sequence_parallel_size={size} does not divide the "
            f"{world_size} workers (trainer.n_workers); choose a divisor of {world_size}"
        )


_MEGATRON_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")


@dataclass(frozen=True)
class MegatronConfig:
    """Megatron-core layout: tensor / pipeline parallel sizes (data parallel is the rest)."""

    tensor_model_parallel_size: int = 1
    """Ranks each layer's weight matrices are split over (heads and MLP columns)."""
    pipeline_model_parallel_size: int = 1
    """Stages the transformer layers are split over, consecutive layers per stage."""
    expert_model_parallel_size: int = 1
    """Ranks a mixture-of-experts layer's experts are split over (each holds
    ``num_experts / size`` whole experts); the ranks come out of the data-parallel ones."""
    layer_spec: Literal["auto", "local", "transformer_engine"] = "auto"
    """Layer implementation: megatron's ``local`` modules, ``transformer_engine`` ones, or
    ``auto`` (Transformer Engine when it is installed and CUDA is used, else local)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Compute device: ``auto`` picks CUDA when the process group backend is NCCL."""
    use_distributed_optimizer: bool = False
    """Split the optimizer state over data-parallel ranks (ZeRO-1): each rank steps a share
    of the parameters and broadcasts them after the step. Same updates, ``1 / DP`` of the
    optimizer memory; parameters and gradients stay replicated. With pipeline parallelism
    and tied embeddings the first and last stages also split their embedding copies'
    optimizer state by rows."""

    def __post_init__(self) -> None:
        _check_positive("megatron.tensor_model_parallel_size", self.tensor_model_parallel_size)
        _check_positive("megatron.pipeline_model_parallel_size", self.pipeline_model_parallel_size)
        _check_positive("megatron.expert_model_parallel_size", self.expert_model_parallel_size)
        _check_choice(
            "megatron.layer_spec", self.layer_spec, ("auto", "local", "transformer_engine")
        )
        _check_choice("megatron.device", self.device, ("auto", "cpu", "cuda"))

    def data_parallel_size(self, world_size: int) -> int:
        """Data-parallel ranks for ``world_size`` ranks, or raise naming the fix."""
        model_parallel = self.tensor_model_parallel_size * self.pipeline_model_parallel_size
        if world_size % model_parallel != 0:
            raise ConfigurationError(
                f"world_size={world_size} is not divisible by megatron.tensor_model_parallel_"
                f"size={self.tensor_model_parallel_size} x megatron.pipeline_model_parallel_"
                f"size={self.pipeline_model_parallel_size} = {model_parallel}; use a multiple "
                f"of {model_parallel} ranks or smaller parallel sizes"
            )
        data_parallel = world_size // model_parallel
        if data_parallel % self.expert_model_parallel_size != 0:
            raise ConfigurationError(
                f"megatron.expert_model_parallel_size={self.expert_model_parallel_size} does not "
                f"divide the {data_parallel} data-parallel ranks (world_size={world_size}); "
                "expert-parallel ranks come out of the data-parallel ones, choose a divisor"
            )
        return data_parallel

    def validate_model(self, hf_config: Mapping[str, Any]) -> None:
        """Check that a Hugging Face config (as a dict) splits over this layout."""
        model_type = hf_config.get("model_type")
        if model_type not in _MEGATRON_MODEL_TYPES:
            raise ConfigurationError(
                f"model_type={model_type!r} is not supported by the Megatron engine; it "
                f"converts {', '.join(_MEGATRON_MODEL_TYPES)} (use backend='fsdp' for others)"
            )
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        heads = int(hf_config.get("num_attention_heads", 0))
        kv_heads = int(hf_config.get("num_key_value_heads") or heads)
        checks = (
            ("num_attention_heads", heads, tp, "megatron.tensor_model_parallel_size"),
            ("num_key_value_heads", kv_heads, tp, "megatron.tensor_model_parallel_size"),
            (
                "vocab_size",
                int(hf_config.get("vocab_size", 0)),
                tp,
                "megatron.tensor_model_parallel_size",
            ),
            (
                "intermediate_size",
                int(hf_config.get("intermediate_size", 0)),
                tp,
                "megatron.tensor_model_parallel_size",
            ),
            (
                "num_hidden_layers",
                int(hf_config.get("num_hidden_layers", 0)),
                pp,
                "megatron.pipeline_model_parallel_size",
            ),
        )
        for name, value, size, option in checks:
            if value % size != 0:
                common = math.gcd(*(check[1] for check in checks if check[3] == option))
                fits = [n for n in range(1, common + 1) if common % n == 0]
                raise ConfigurationError(
                    f"{option}={size} does not divide the model's {name}={value}; sizes that "
                    f"divide this model: {', '.join(map(str, fits))}"
                )
        self._validate_experts(hf_config)

    def _validate_experts(self, hf_config: Mapping[str, Any]) -> None:
        """Check the expert-parallel size against a mixture-of-experts config (or its lack)."""
        ep = self.expert_model_parallel_size
        # config.json spells it num_local_experts (transformers' attribute map), dicts may not
        experts = int(hf_config.get("num_experts") or hf_config.get("num_local_experts") or 0)
        if experts == 0:
            if ep > 1:
                raise ConfigurationError(
                    f"megatron.expert_model_parallel_size={ep} needs a mixture-of-experts model "
                    f"(model_type={hf_config.get('model_type')!r} has no experts); set it to 1"
                )
            return
        if experts % ep != 0:
            raise ConfigurationError(
                f"megatron.expert_model_parallel_size={ep} does not divide the model's "
                f"num_experts={experts}; choose a divisor of {experts}"
            )
        if self.tensor_model_parallel_size > 1:
            raise ConfigurationError(
                "mixture-of-experts models run with megatron.tensor_model_parallel_size=1 only "
                f"(got {self.tensor_model_parallel_size}); split the experts with "
                "megatron.expert_model_parallel_size instead"
            )


def hf_config_dict(model: ModelConfig) -> dict[str, Any] | None:
    """The model's Hugging Face config as a plain dict (``config.json`` or ``hf_config``);
    ``None`` for a planned model path (:func:`dry_checks`) whose files are not made yet: like
    :class:`ModelConfig`'s own checks, the layout is checked when the config is built again
    once the files exist."""
    if model.hf_config is not None:
        return dict(model.hf_config)
    planned = model.path is not None and is_planned(model.path)
    if planned and not (Path(str(model.path)) / "config.json").is_file():
        return None
    directory = model.local_path()
    assert directory is not None  # guaranteed by ModelConfig
    loaded: dict[str, Any] = json.loads((Path(directory) / "config.json").read_text())
    return loaded


@dataclass(frozen=True)
class EngineConfig:
    """Everything one training engine needs; each part goes only to the code that uses it."""

    model: ModelConfig
    """The model to build."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and LR schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 layout and memory policy."""
    micro_batch: MicroBatchConfig = field(default_factory=MicroBatchConfig)
    """Micro-batching for forward and training."""
    logprob_chunk_size: int | None = None
    """Tokens per chunk when the FSDP engine computes the log-probs and entropy of given
    tokens: the output head, log-softmax and entropy run on this many tokens at a time, in
    the forward and again in the backward, so the full-vocabulary logits of a whole
    micro-batch never exist at once (``hf_engines.chunked_logprob``). ``null`` (default):
    as many tokens as make 32M logits (128 MiB in float32; 682 tokens of a 49k
    vocabulary, 128 of a 262k one). ``0``: the old path, the logits of every response
    position at once. Models whose output head is more than ``lm_head`` with a logit scale
    or softcap keep the old path (logged)."""
    backend: Literal["fsdp", "megatron"] = "fsdp"
    """Which engine trains the model: ``fsdp`` (FSDPEngine) or ``megatron`` (MegatronEngine)."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Megatron-core layout, used when ``backend='megatron'``."""
    offload: bool = False
    """Hybrid placement: move params/grads/optimizer state to CPU while the rollout generates
    (the driver calls the worker's ``offload()`` before generation and ``onload()`` after;
    nothing to move on a CPU run)."""

    def __post_init__(self) -> None:
        _check_choice("backend", self.backend, ("fsdp", "megatron"))
        if self.logprob_chunk_size is not None:
            _check_positive("logprob_chunk_size", self.logprob_chunk_size, allow_zero=True)
        if self.backend == "megatron":
            hf_config = hf_config_dict(self.model)
            if hf_config is not None:  # None: a planned model, checked when it exists
                self.megatron.validate_model(hf_config)
            _check_megatron_optimizer(self.optim, self.megatron)


def _check_megatron_optimizer(optim: OptimConfig, megatron: MegatronConfig) -> None:
    """Refuse Muon on tensor-parallel Megatron weights, naming the fix.

    Muon orthogonalizes each weight matrix as a whole; with tensor parallelism every rank
    holds a slice of each matrix, and orthogonalizing the slices separately is a different
    (wrong) update.
    """
    tp = megatron.tensor_model_parallel_size
    if optim.name == "muon" and tp > 1:
        raise ConfigurationError(
            f"optim.name='muon' needs whole weight matrices, but megatron."
            f"tensor_model_parallel_size={tp} splits each one over {tp} ranks (Muon would "
            "orthogonalize the slices apart); set megatron.tensor_model_parallel_size=1, "
            "backend='fsdp' (FSDP2 orthogonalizes the gathered matrices), or optim.name='adamw'"
        )


def config_from_dict(cls: type[ConfigT], data: Mapping[str, Any], where: str = "") -> ConfigT:
    """Build the config dataclass ``cls`` from ``data``, recursing into nested configs.

    Unknown keys are an error that names them and lists the valid keys; values are then
    validated by the dataclass itself.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a config dataclass")
    if not isinstance(data, Mapping):
        raise ConfigurationError(f"{where or cls.__name__} must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigurationError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)} in {cls.__name__}; "
            f"valid keys: {', '.join(sorted(fields))}"
        )
    missing = sorted(
        name
        for name, f in fields.items()
        if name not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    if missing:
        prefix = f"{where}." if where else ""
        raise ConfigurationError(
            f"missing required key(s) {', '.join(prefix + k for k in missing)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            value = config_from_dict(hint, value, f"{where}.{name}" if where else name)
        kwargs[name] = value
    return cls(**kwargs)
