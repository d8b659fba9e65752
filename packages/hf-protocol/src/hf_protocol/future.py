"""DataProtoFuture: a DataProto that is still being computed, held as Ray object refs.

A worker group called with ``blocking=False`` returns one object ref per worker.
Wrapping them in a DataProtoFuture lets the driver hand that output straight to
another worker group: each receiving worker resolves the refs itself, so the data
moves between workers through Ray's object store and never through the driver.

Ray is imported only when :meth:`DataProtoFuture.get` runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from hf_protocol.data_proto import DataProto


def _pick_chunk(data: DataProto, index: int, chunks: int) -> DataProto:
    return data.chunk(chunks)[index]


@dataclass
class DataProtoFuture:
    """Object refs whose values, gathered by ``collect_fn`` and then shaped by
    ``dispatch_fn``, make one DataProto.

    ``futures`` are Ray ``ObjectRef``s, each resolving to a DataProto.
    """

    collect_fn: Callable[[list[DataProto]], DataProto]
    futures: list[Any]
    dispatch_fn: Callable[[DataProto], DataProto] | None = None

    @staticmethod
    def concat(data: Sequence[Any]) -> DataProtoFuture:
        """A future for the concatenation of the DataProtos behind the refs ``data``."""
        if not data:
            raise ValueError("DataProtoFuture.concat needs at least one object ref")
        return DataProtoFuture(collect_fn=DataProto.concat, futures=list(data))

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """``chunks`` futures; future ``i`` resolves to ``self.get().chunk(chunks)[i]``."""
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValueError(
                f"chunks must be a positive integer (e.g. the worker group's world size), "
                f"got {chunks!r}"
            )
        if self.dispatch_fn is not None:
            raise ValueError(
                "cannot chunk a DataProtoFuture that is already a chunk; chunk the original"
            )
        return [
            DataProtoFuture(
                collect_fn=self.collect_fn,
                futures=self.futures,
                dispatch_fn=partial(_pick_chunk, index=i, chunks=chunks),
            )
            for i in range(chunks)
        ]

    def get(self) -> DataProto:
        """Fetch the refs (in the calling process), collect them and apply ``dispatch_fn``."""
        import ray

        values = ray.get(self.futures)
        wrong = [type(v).__name__ for v in values if not isinstance(v, DataProto)]
        if wrong:
            raise TypeError(
                f"DataProtoFuture refs must resolve to DataProto, got {wrong}; wrap only the "
                f"outputs of methods that return a DataProto."
            )
        output = self.collect_fn(values)
        return self.dispatch_fn(output) if self.dispatch_fn is not None else output
