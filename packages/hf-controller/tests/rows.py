"""A tiny shardable batch for tests: a list of rows with ``chunk`` and ``concat``.

Real objects, no torch: they exercise the controller's DP modes exactly as a
DataProto does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hf_controller import split_balanced


class Rows:
    """An ordered list of values that splits into balanced parts."""

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = list(values)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, item: slice) -> Rows:
        return Rows(self.values[item])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rows) and other.values == self.values

    def __repr__(self) -> str:
        return f"Rows({self.values})"

    def chunk(self, chunks: int) -> list[Rows]:
        return [Rows(part) for part in split_balanced(self.values, chunks)]

    @staticmethod
    def concat(items: Sequence[Rows]) -> Rows:
        return Rows([v for item in items for v in item.values])
