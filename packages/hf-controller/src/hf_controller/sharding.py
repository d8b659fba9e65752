"""Splitting arguments over data-parallel ranks and gathering results back.

The controller knows no DataProto: any argument offering ``chunk(n)`` is split
into ``n`` balanced parts, and results offering a static ``concat(items)`` are
joined (a TensorDict is split on its batch dimension and joined with
``torch.cat``). With ``pad_to_equal`` every part gets the same number of rows
(leading rows are repeated) and the padding is cut from the gathered result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hf_controller.futures import is_future, is_tensordict

T = TypeVar("T")


def split_balanced(items: Sequence[T], parts: int) -> list[Sequence[T]]:
    """``parts`` consecutive slices of ``items`` whose sizes differ by at most one.

    10 items in 4 parts -> 3/3/2/2. The building block of a ``chunk(n)`` method for
    any sequence-backed batch type (see ``recipes/parallel_map``).
    """
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts must be a positive integer (e.g. a world size), got {parts!r}")
    base, extra = divmod(len(items), parts)
    slices, start = [], 0
    for index in range(parts):
        size = base + (1 if index < extra else 0)
        slices.append(items[start : start + size])
        start += size
    return slices


def is_shardable(value: Any) -> bool:
    """True for values the DP modes split: they offer ``chunk(n)``."""
    return callable(getattr(value, "chunk", None))


@dataclass
class Padding:
    """Rows added to make a batch divisible by the world size; removed after the call."""

    original_length: int
    pad_size: int


def pad_to_multiple(value: Any, multiple: int) -> tuple[Any, Padding]:
    """Append copies of leading rows until ``len(value)`` divides ``multiple``.

    Needs ``len``, slicing and a static ``concat`` on the value's type.
    """
    length = len(value)
    pad_size = -length % multiple
    if pad_size == 0:
        return value, Padding(length, 0)
    if length == 0:
        raise ValueError("cannot pad an empty batch to equal shards: there are no rows to repeat")
    pieces = [value]
    remaining = pad_size
    while remaining > 0:
        take = min(remaining, length)
        pieces.append(value[0:take])
        remaining -= take
    return type(value).concat(pieces), Padding(length, pad_size)


def shard(
    value: Any, world_size: int, pad_to_equal: bool = False
) -> tuple[list[Any], Padding | None]:
    """``world_size`` parts of a shardable value (balanced, order kept), and any padding."""
    padding = None
    if pad_to_equal and not is_future(value):
        value, padding = pad_to_multiple(value, world_size)
    if is_tensordict(value):  # TensorDict.chunk is torch.chunk's split: uneven, maybe short
        sizes = [len(part) for part in split_balanced(range(len(value)), world_size)]
        parts = value.split(sizes)
    else:
        parts = value.chunk(world_size)
    if len(parts) != world_size:
        raise ValueError(
            f"{type(value).__name__}.chunk({world_size}) returned {len(parts)} parts; the "
            f"controller needs exactly one part per worker"
        )
    return list(parts), padding


def unpad(result: Any, padding: Padding | None) -> Any:
    """Drop the rows that :func:`pad_to_multiple` added, if any."""
    if padding is None or padding.pad_size == 0:
        return result
    if len(result) != padding.original_length + padding.pad_size:
        raise ValueError(
            f"cannot remove padding: the method returned {len(result)} rows for "
            f"{padding.original_length + padding.pad_size} input rows; pad_to_equal needs one "
            f"output row per input row"
        )
    return result[0 : padding.original_length]


def check_per_rank_lists(args: Sequence[Any], kwargs: dict[str, Any], world_size: int) -> None:
    """For ALL_TO_ALL / DP_COMPUTE: each argument must be a list with one entry per rank."""
    for name, value in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]:
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            size = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
            raise ValueError(
                f"{name} must be a list with one entry per worker ({world_size}), got {size}"
            )
