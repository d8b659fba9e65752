"""verl's non-blocking results: a ``DataProtoFuture`` for every data-parallel call.

hf-controller returns a :class:`~hf_controller.GroupFuture` from a non-blocking
data-parallel call, since it needs no DataProto; verl code checks for a
``DataProtoFuture``. With ``hf-controller[protocol]`` installed the compat group hands
back hf-protocol's ``DataProtoFuture`` instead, resolving to whatever the workers
returned (a DataProto, or a TensorDict joined with ``torch.cat``).
"""

from __future__ import annotations

import functools
from typing import Any

from hf_controller.futures import GroupFuture


@functools.lru_cache(maxsize=1)
def _future_class() -> type | None:
    """A ``DataProtoFuture`` whose ``get`` also joins TensorDicts (``None`` without
    hf-protocol installed)."""
    try:
        from hf_protocol import DataProtoFuture
    except ImportError:  # hf-controller without [protocol]: GroupFutures stay
        return None

    class VerlDataProtoFuture(DataProtoFuture):
        """A ``DataProtoFuture`` over the refs of one group call, of any joinable parts
        (DataProto or TensorDict)."""

        def chunk(self, chunks: int) -> list[Any]:
            """``chunks`` futures of this class; future ``i`` resolves to part ``i``."""
            return [
                VerlDataProtoFuture(part.collect_fn, part.futures, part.dispatch_fn)
                for part in super().chunk(chunks)
            ]

        def get(self) -> Any:
            """Fetch the refs, join them in rank order and apply ``dispatch_fn``."""
            import ray

            output = self.collect_fn(ray.get(self.futures))
            return self.dispatch_fn(output) if self.dispatch_fn is not None else output

    return VerlDataProtoFuture


def as_data_proto_future(result: Any) -> Any:
    """``result`` with a :class:`GroupFuture` turned into a ``DataProtoFuture`` (when
    hf-protocol is installed); any other result as it is."""
    if not isinstance(result, GroupFuture):
        return result
    future_class = _future_class()
    if future_class is None:
        return result
    return future_class(result.collect_fn, result.futures, result.dispatch_fn)
