"""verl's ``RayWorkerGroup``: hf-controller's Ray group with verl's arguments and results.

What differs from the native group, and why it is here rather than there:

* the constructor takes verl's ``bin_pack``, ``device_name`` and
  ``ray_wait_register_center_timeout`` (placement and rendezvous are the pool's and the
  group's own business in hf-controller, so they are accepted and not needed);
* workers are named Ray actors, as verl's are, so ``worker_names`` lists them and
  another process of the job attaches with ``from_detached(worker_names=...)``;
* non-blocking data-parallel calls return a ``DataProtoFuture`` (see ``futures.py``);
* ``ALL_TO_ALL`` methods run by rank 0 alone (``Execute.RANK_ZERO``) get the call's
  arguments as they are, not the first entry of per-rank lists;
* mesh layouts are asked verl's way, in two queries (see ``worker.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hf_controller.compat.verl.futures import as_data_proto_future
from hf_controller.decorator import Dispatch, Execute, MethodSpec
from hf_controller.ray.resource_pool import RayResourcePool
from hf_controller.ray.worker_group import RayWorkerGroup as NativeRayWorkerGroup
from hf_controller.worker_class import ClassWithInitArgs
from hf_controller.worker_group import _group_call


class RayWorkerGroup(NativeRayWorkerGroup):
    """A group of Ray actors as verl's ``RayWorkerGroup`` (see the module docs)."""

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: ClassWithInitArgs | None = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        worker_env: dict[str, str] | None = None,
        device_name: str = "cuda",
        ray_wait_register_center_timeout: int = 300,
        **kwargs: Any,
    ) -> None:
        self.device_name = device_name
        super().__init__(
            resource_pool,
            ray_cls_with_init,
            name_prefix=name_prefix,
            detached=detached,
            worker_names=worker_names,
            worker_env=worker_env,
            named=worker_names is None,
            **kwargs,
        )

    def _bind_worker_methods(self, user_class: type, prefix: str = "") -> list[str]:
        bound = super()._bind_worker_methods(user_class, prefix)
        for name in bound:
            remote_name, spec = self._bound[name]
            if _passes_arguments_to_rank_zero(spec):
                spec = dataclasses.replace(spec, dispatch_mode=Dispatch.ONE_TO_ALL)
                self._bound[name] = (remote_name, spec)
            self._group_methods[name] = _returning_data_proto_future(
                _group_call(name, remote_name, spec)
            )
        return bound

    def _mesh_answers(self, mesh_name: str) -> list[tuple[int, bool]]:
        answers = self._query_dispatch_info(mesh_name)  # type: ignore[attr-defined]
        if all(isinstance(a, (tuple, list)) for a in answers):  # a native worker's answers
            return [(int(a[0]), bool(a[1])) for a in answers]
        collect = self._query_collect_info(mesh_name)  # type: ignore[attr-defined]
        return [(int(d), bool(c)) for d, c in zip(answers, collect, strict=True)]


def _passes_arguments_to_rank_zero(spec: MethodSpec) -> bool:
    """verl runs an ``ALL_TO_ALL`` method with ``Execute.RANK_ZERO`` on rank 0 with the
    call's own arguments; replicating them (ONE_TO_ALL) and keeping rank 0's is the same."""
    return spec.dispatch_mode is Dispatch.ALL_TO_ALL and spec.execute_mode is Execute.RANK_ZERO


def _returning_data_proto_future(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` whose non-blocking data-parallel result is a ``DataProtoFuture``."""

    def verl_call(group: Any, *args: Any, **kwargs: Any) -> Any:
        return as_data_proto_future(call(group, *args, **kwargs))

    verl_call.__name__ = call.__name__
    verl_call.__qualname__ = call.__qualname__
    verl_call.__doc__ = call.__doc__
    return verl_call
