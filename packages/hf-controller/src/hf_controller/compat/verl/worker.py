"""verl's ``Worker``: hf-controller's worker with verl's mesh queries and helpers.

verl's worker asks its mesh layout in two calls (``_query_dispatch_info`` answers the dp
rank, ``_query_collect_info`` whether the rank's output is gathered); hf-controller's
asks once for both. This worker answers verl's way, copies layouts between workers
(``get_dispatch_collect`` / ``set_dispatch_collect``, how verl fuses workers that share
a mesh) and carries verl's function-running methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hf_controller.compat.verl.errors import VerlCheckError
from hf_controller.decorator import Dispatch, Execute, register
from hf_controller.worker import Worker as NativeWorker


class Worker(NativeWorker):
    """A group member as verl's ``Worker``; subclass it and mark methods with ``@register``.

    ``cuda_visible_devices`` is accepted and ignored: the resource pool gives each worker
    its device (verl reads it for Ray's no-set-visible-devices mode, which HybridFlow does
    not use).
    """

    fused_worker_attr_name = "fused_worker_dict"

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        super().__init__()

    @property
    def fused_worker_dict(self) -> dict[str, Any]:
        """The roles of the fused worker this one belongs to (empty when not fused)."""
        return dict(self.__dict__.get("fused_workers", {}))

    def get_fused_worker_by_name(self, worker_name: str) -> Any | None:
        """The fused sibling role ``worker_name`` (``None`` when there is none)."""
        return self.fused_worker_dict.get(worker_name)

    # ------------------------------------------------------------------ mesh layouts

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:  # type: ignore[override]
        """This rank's dp rank in ``mesh_name``."""
        return int(NativeWorker._query_dispatch_info(self, mesh_name)[0])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        """Whether this rank's output is gathered for ``mesh_name``."""
        return bool(NativeWorker._query_dispatch_info(self, mesh_name)[1])

    def query_collect_info(self, mesh_name: str) -> bool:
        """Whether this rank's output is gathered for ``mesh_name`` (in this process)."""
        return bool(NativeWorker._query_dispatch_info(self, mesh_name)[1])

    def get_dispatch_collect(self) -> dict[str, dict[str, Any]]:
        """Every registered mesh's dp rank and collect flag, as keyword arguments of
        :meth:`set_dispatch_collect`."""
        layouts = self.__dict__.get("_dp_layouts", {})
        return {
            "dispatch_dp_rank": {mesh: dp for mesh, (dp, _) in layouts.items()},
            "collect_dp_rank": {mesh: keep for mesh, (_, keep) in layouts.items()},
        }

    def set_dispatch_collect(
        self,
        mesh_name: str,
        dispatch_dp_rank: dict[str, int],
        collect_dp_rank: dict[str, bool],
    ) -> None:
        """Register, as ``mesh_name``, the one mesh layout that another worker's
        :meth:`get_dispatch_collect` returned (how a fused worker takes on its roles' meshes).
        """
        layouts = self.__dict__.setdefault("_dp_layouts", {})
        if mesh_name in layouts:
            raise VerlCheckError(
                f"mesh {mesh_name!r} is already registered on rank {self.rank} (registered: "
                f"{sorted(layouts)}); set each mesh once"
            )
        if len(dispatch_dp_rank) != 1 or len(collect_dp_rank) != 1:
            # verl keeps the last of several silently; which one is last is an accident
            raise ValueError(
                f"set_dispatch_collect({mesh_name!r}) needs the layout of exactly one mesh, got "
                f"dispatch meshes {sorted(dispatch_dp_rank)} and collect meshes "
                f"{sorted(collect_dp_rank)}; pass a worker that registered one mesh"
            )
        (dp_rank,) = dispatch_dp_rank.values()
        (is_collect,) = collect_dp_rank.values()
        self._register_dispatch_collect_info(mesh_name, dp_rank, is_collect)

    # ------------------------------------------------------------------ running functions

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(
        self, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``func(self, *shard_args, **shard_kwargs)`` on every worker; the group splits
        the data arguments and concatenates the results."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``func(*args, **kwargs)`` on rank 0 alone and return its result."""
        return func(*args, **kwargs)
