"""Where a trainer's worker processes go (its Ray pools), and starting them early.

Torch-free on purpose: the ``hybridflow`` command calls :func:`start_workers_early` with
the composed config, before anything imports torch. In a background thread it waits for
Ray (started by :func:`hf_controller.start_ray_in_background`), reserves the training pool
and starts its worker processes (:meth:`~hf_controller.RayResourcePool.prestart`), which
import the worker modules while the driver imports its own and loads its data. The first
:func:`~hf_algos.trainers.roles.groups.build_role_groups` whose layout matches takes that pool
(:func:`take_early_pool`) and builds its workers in those processes. Without an early
start, or with another layout, nothing changes: the pool is made when the groups are.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hf_controller import ConfigurationError, RayResourcePool, cluster_nodes, ensure_ray

if TYPE_CHECKING:
    from hf_algos.config.trainer import TrainerSection

WORKER_MODULES: tuple[str, ...] = ("hf_algos.trainers.roles.groups", "hf_rollout.workers")
"""What a worker process imports before its class arrives: the modules of the trainers'
worker classes (torch, transformers and the engines come with them)."""


@dataclass(frozen=True)
class PoolLayout:
    """The training pool a trainer config asks for (``trainer.*``)."""

    n_workers: int
    nnodes: int
    use_gpu: bool
    cpus_per_worker: float | None
    gpus_per_worker: float

    @classmethod
    def of(cls, trainer: TrainerSection | Any) -> PoolLayout:
        """The layout of a :class:`~hf_algos.config.TrainerSection` (or of an
        OmegaConf ``trainer`` node with the same keys)."""
        return cls(
            n_workers=int(trainer.n_workers),
            nnodes=int(trainer.nnodes),
            use_gpu=bool(trainer.use_gpu),
            cpus_per_worker=(
                None if trainer.cpus_per_worker is None else float(trainer.cpus_per_worker)
            ),
            gpus_per_worker=float(trainer.gpus_per_worker),
        )


GPU_FIX = (
    "To train on the CPU, set trainer.use_gpu=false (and drop verl's trainer.n_gpus_per_node "
    "and trainer.device=cuda; trainer.n_workers gives the processes)"
)


def require_gpus(use_gpu: bool, backend: str, workers: int, gpus_per_worker: float) -> None:
    """Refuse a GPU run where there is no GPU, instead of training on the CPU.

    ``backend="ray"``: the Ray cluster (started or joined) must have GPUs at all; a cluster
    with some but too few is named by the pool's own placement check. ``backend="local"``:
    this process must see a CUDA device. Raises :class:`ConfigurationError` with the fix.
    """
    if not use_gpu:
        return
    if backend == "local":
        import torch

        if not torch.cuda.is_available():
            raise ConfigurationError(
                f"trainer.use_gpu=true, but this process sees no CUDA device (torch "
                f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). {GPU_FIX}"
            )
        return
    nodes = cluster_nodes()
    if sum(node.gpus for node in nodes) == 0:
        where = ", ".join(f"{node.address}: {node.cpus:g} CPUs" for node in nodes)
        raise ConfigurationError(
            f"trainer.use_gpu=true asks for {workers} x {gpus_per_worker:g} GPUs, but the Ray "
            f"cluster has no GPU ({where}). {GPU_FIX}; to train on GPUs, join a cluster "
            "whose nodes have them (RAY_ADDRESS)"
        )


def worker_pool(
    trainer: TrainerSection | PoolLayout, workers: int, name: str, gpus_per_worker: float
) -> RayResourcePool:
    """``workers`` processes in total, ``workers / nnodes`` on each of ``nnodes`` nodes
    (GPU runs refused at once on a cluster without GPUs: :func:`require_gpus`)."""
    ensure_ray()
    require_gpus(trainer.use_gpu, "ray", workers, gpus_per_worker)
    return RayResourcePool(
        [workers // trainer.nnodes] * trainer.nnodes,
        use_gpu=trainer.use_gpu,
        name_prefix=name,
        cpus_per_worker=trainer.cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
    )


class _EarlyStart:
    """The background start of one training pool's worker processes."""

    def __init__(self, layout: PoolLayout) -> None:
        self.layout = layout
        self.pool: RayResourcePool | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hf-workers-early", daemon=True)

    def _run(self) -> None:
        try:
            ensure_ray()
            pool = worker_pool(
                self.layout, self.layout.n_workers, "hf_early_train", self.layout.gpus_per_worker
            )
            pool.prestart(WORKER_MODULES)
            self.pool = pool
        except BaseException as error:  # raised by take_early_pool, in the driver's thread
            self.error = error
        finally:
            self.done.set()


_early: _EarlyStart | None = None
_lock = threading.Lock()


def start_workers_early(layout: PoolLayout) -> None:
    """Reserve the training pool of ``layout`` and start its worker processes, in the
    background (Ray must be starting or started: :func:`hf_controller.start_ray_in_background`).

    Returns at once; a second call before the pool is taken does nothing.
    """
    global _early
    with _lock:
        if _early is not None:
            return
        _early = _EarlyStart(layout)
        _early.thread.start()


def take_early_pool(trainer: TrainerSection) -> RayResourcePool | None:
    """The pool :func:`start_workers_early` prepared, if its layout is ``trainer``'s (once).

    Waits for the background start and raises its error (e.g. a layout the cluster cannot
    hold, named as when the groups reserve their pool). A pool of another layout is released
    (its bundles and processes given back) and ``None`` returned: the caller then makes its
    pool as usual.
    """
    global _early
    with _lock:
        early, _early = _early, None
    if early is None:
        return None
    early.done.wait()
    if early.error is not None:
        raise early.error
    assert early.pool is not None
    if early.layout != PoolLayout.of(trainer):
        early.pool.release()
        return None
    return early.pool
