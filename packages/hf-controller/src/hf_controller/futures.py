"""Futures that travel between worker groups and are resolved inside workers.

A non-blocking call on a data-parallel method returns one object ref per worker,
wrapped in a :class:`GroupFuture`. That output can be passed straight to another
group: the dispatcher chunks the future, and each receiving worker resolves its
chunk in ``materialize`` before the method runs. ``hf_protocol.DataProtoFuture``
has the same interface and is handled the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class FutureLike(Protocol):
    """Anything that holds object refs (``futures``) and resolves them with ``get()``."""

    futures: list[Any]

    def get(self) -> Any:
        """Fetch and assemble the value."""
        ...


_IS_FUTURE_TYPE: dict[type, bool] = {}


def is_future(value: Any) -> bool:
    """True for :class:`FutureLike` values; decided once per type (this runs on every call)."""
    kind = type(value)
    known = _IS_FUTURE_TYPE.get(kind)
    if known is None:
        known = _IS_FUTURE_TYPE[kind] = callable(getattr(kind, "get", None)) and hasattr(
            value, "futures"
        )
    return known


def materialize(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Replace every future among the arguments by its value (runs inside the worker)."""
    if not any(map(is_future, args)) and not any(map(is_future, kwargs.values())):
        return args, kwargs
    new_args = tuple(a.get() if is_future(a) else a for a in args)
    new_kwargs = {k: v.get() if is_future(v) else v for k, v in kwargs.items()}
    return new_args, new_kwargs


def is_tensordict(value: Any) -> bool:
    """True for a ``tensordict.TensorDict`` (told by module, so tensordict need not be
    installed): DP modes split it along its batch dimension and join it with ``torch.cat``."""
    return type(value).__module__.split(".")[0] == "tensordict"


def concat_parts(parts: Sequence[Any]) -> Any:
    """Concatenate per-worker results with their own type's ``concat`` classmethod
    (TensorDicts, which have none, with ``torch.cat``)."""
    if not parts:
        raise ValueError("nothing to concatenate: the group returned no results")
    if is_tensordict(parts[0]):
        import torch

        return torch.cat(list(parts))
    concat = getattr(type(parts[0]), "concat", None)
    if concat is None:
        raise TypeError(
            f"cannot gather results of type {type(parts[0]).__name__}: a DP_COMPUTE_PROTO "
            f"method must return objects offering a static concat(items) (e.g. DataProto)"
        )
    return concat(list(parts))


def _pick_chunk(value: Any, index: int, chunks: int) -> Any:
    return value.chunk(chunks)[index]


@dataclass
class GroupFuture:
    """Object refs from a worker group whose values concatenate into one result.

    The torch-free twin of ``hf_protocol.DataProtoFuture``: the same ``chunk`` /
    ``get`` interface for any result type offering ``chunk`` and ``concat``.
    """

    futures: list[Any]
    collect_fn: Callable[[Sequence[Any]], Any] = concat_parts
    dispatch_fn: Callable[[Any], Any] | None = None

    @staticmethod
    def concat(data: Sequence[Any]) -> GroupFuture:
        """A future for the concatenation of the values behind the refs ``data``."""
        if not data:
            raise ValueError("GroupFuture.concat needs at least one object ref")
        return GroupFuture(futures=list(data))

    def chunk(self, chunks: int) -> list[GroupFuture]:
        """``chunks`` futures; future ``i`` resolves to part ``i`` of the balanced split."""
        if self.dispatch_fn is not None:
            raise ValueError("cannot chunk a future that is already a chunk; chunk the original")
        return [
            GroupFuture(self.futures, self.collect_fn, partial(_pick_chunk, index=i, chunks=chunks))
            for i in range(chunks)
        ]

    def get(self) -> Any:
        """Fetch the refs in the calling process, concatenate, then pick this chunk."""
        import ray

        value = self.collect_fn(ray.get(self.futures))
        return self.dispatch_fn(value) if self.dispatch_fn is not None else value
