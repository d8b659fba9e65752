"""``EngineWorker``: what every engine role shares (process group, engine, memory moves).

Each role (actor, critic, reference, reward model) is its own subclass; colocating roles
in one process is the controller's job (``create_colocated_worker_cls_fused``), not flags.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import torch

from hf_controller import (
    ConfigurationError,
    Dispatch,
    Worker,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    release_host_memory,
)
from hf_engines.config import EngineConfig, LoRAConfig, check_lora_backend
from hf_engines.engine import TrainingEngine
from hf_engines.fsdp import FSDPEngine
from hf_engines.workers.distributed import init_distributed
from hf_engines.workers.mesh import (
    ENGINE_MESH,
    DataParallelPlace,
    data_parallel_place,
    data_parallel_size,
)
from hf_protocol import DataProto, fields


def check_head(role: str, config: EngineConfig, head: str) -> None:
    """Raise naming the fix unless ``config`` builds a model with ``head``."""
    if config.model.head != head:
        raise ConfigurationError(
            f"{role} needs model.head={head!r}, got {config.model.head!r}; set model.head="
            f"{head!r} in this role's engine config"
        )


ENGINE_DISPATCH = make_nd_compute_dataproto_dispatch_fn(ENGINE_MESH)
"""Dispatch mode of the roles' ``DataProto`` methods: one shard per data-parallel replica."""


def build_engine(config: EngineConfig, lora: LoRAConfig | None = None) -> TrainingEngine:
    """The engine ``config.backend`` names (``fsdp`` unless the config says otherwise),
    with ``lora`` adapters when enabled (FSDP only)."""
    backend = config.backend
    if lora is not None:
        check_lora_backend(lora, config, "build_engine")
    if backend == "fsdp":
        return FSDPEngine(config, lora)
    if backend == "megatron":
        # Imported only when asked for: megatron-core is an optional extra.
        engine_class = importlib.import_module("hf_engines.megatron").MegatronEngine
        engine: TrainingEngine = engine_class(config)
        return engine
    raise ConfigurationError(f"backend={backend!r} is not one of 'fsdp', 'megatron'")


class EngineWorker(Worker):
    """A worker that owns one training engine; ``init_model`` builds it on every rank.

    The engine is built lazily (not in ``__init__``) so the driver can create all groups
    first and then initialise models in the order memory allows, as verl users expect.
    """

    def __init__(self, engine_config: EngineConfig) -> None:
        super().__init__()
        self._engine_config = engine_config
        self._engine: TrainingEngine | None = None
        self._place: DataParallelPlace | None = None
        self._lora: LoRAConfig | None = None  # set by the roles that train adapters

    @property
    def engine(self) -> TrainingEngine:
        """The engine; an error naming the fix before ``init_model`` ran."""
        if self._engine is None:
            raise self._not_initialised()
        return self._engine

    def _not_initialised(self) -> RuntimeError:
        return RuntimeError(
            f"{type(self).__name__} rank {self.rank} has no model yet; call "
            "init_model() on the worker group first"
        )

    @property
    def data_parallel(self) -> DataParallelPlace:
        """This rank's data-parallel replica (known once ``init_model`` built the engine)."""
        if self._place is None:
            raise self._not_initialised()
        return self._place

    @property
    def data_parallel_size(self) -> int:
        """Data-parallel replicas of this group under the engine config (before building)."""
        return data_parallel_size(self._engine_config, self.world_size)

    def _before_init(self) -> None:
        """Checks that need the group's size; roles override to add theirs."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Join the group's process group and build the engine (collective)."""
        self._before_init()
        config = self._engine_config
        part = config.megatron if config.backend == "megatron" else config.fsdp
        init_distributed(self.rank, self.world_size, self.local_rank, part.device)
        self._engine = build_engine(self._engine_config, self._lora)
        if self._place is None:  # a second init_model keeps the (same) registered layout
            place = data_parallel_place(config, self.rank, self.world_size)
            self._register_dispatch_collect_info(ENGINE_MESH, place.rank, place.is_collect)
            self._place = place

    @register(Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> tuple[int, bool]:
        """This rank's ``(dp_rank, is_collect)``; the layout exists once the engine does."""
        if mesh_name == ENGINE_MESH and self._place is None:
            raise self._not_initialised()
        return super()._query_dispatch_info(mesh_name)

    @register(Dispatch.ONE_TO_ALL)
    def offload(self) -> None:
        """Move parameters and optimizer state to CPU memory (e.g. while rollout runs) and
        give the host memory freed so far back to the system (on a CPU run the only thing
        there is to free: :func:`~hf_controller.release_host_memory`)."""
        self.engine.offload()
        release_host_memory()

    @register(Dispatch.ONE_TO_ALL)
    def onload(self) -> None:
        """Bring parameters and optimizer state back to the compute device."""
        self.engine.onload()

    def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The engine's ``(name, full tensor)`` iterator, HF names (in-process weight sync).

        Collective: every rank must consume it, so a fused rollout role calls it on all ranks.
        """
        return self.engine.iter_full_params()


class TrainableEngineWorker(EngineWorker):
    """An engine worker that trains, so it also saves, loads and exports its model."""

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Save model, optimizer, scheduler, step and RNG state to ``path`` (shared storage)."""
        self.engine.save_checkpoint(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> int:
        """Restore a checkpoint (any number of ranks at save time); return the global step."""
        self.engine.load_checkpoint(path)
        return self.engine.global_step

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(
        self,
        path: str,
        dtype: str | None = None,
        max_shard_size: str | int = "5GB",
        adapter_only: bool = False,
    ) -> None:
        """Write a Hugging Face model directory that ``from_pretrained`` loads: sharded
        safetensors in ``dtype`` (default: the dtype trained in, LoRA merged in), tokenizer
        alongside; with ``adapter_only`` the LoRA adapter alone in peft's layout."""
        if not adapter_only:
            self.engine.export_hf(path, dtype, max_shard_size)
            return
        if not isinstance(self.engine, FSDPEngine) or self.engine.lora is None:
            raise ValueError(
                f"export_hf(adapter_only=True): {type(self).__name__} trains no LoRA adapter "
                "(set actor.lora.rank > 0), so export the whole model (adapter_only=False)"
            )
        self.engine.export_adapter(path)

    @register(Dispatch.ONE_TO_ALL)
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self.engine.global_step


def metrics_proto(metrics: dict[str, list[float]]) -> DataProto:
    """An empty-batch DataProto carrying ``metrics`` in ``meta_info`` (what updates return)."""
    return DataProto(meta_info={fields.METRICS: metrics})
