"""A readable, size-aware text form of a DataProto (its ``repr``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hf_protocol.columns import describe_array, describe_tensor, tensor_columns

if TYPE_CHECKING:
    from hf_protocol.data_proto import DataProto


def format_dataproto(data: DataProto) -> str:
    """One line with length and size, then one line per column and the meta_info keys.

    ::

        DataProto(len=8, nbytes=1.2 KiB)
          batch:
            input_ids: int64[8, 16] cpu
          non_tensor_batch:
            uid: object[8]
          meta_info: {temperature=1.0}
    """
    lines = [f"DataProto(len={len(data)}, nbytes={human_bytes(data.nbytes)})"]
    if data.batch is not None:
        lines.append("  batch:")
        lines += [f"    {k}: {describe_tensor(v)}" for k, v in tensor_columns(data.batch).items()]
    if data.non_tensor_batch:
        lines.append("  non_tensor_batch:")
        lines += [f"    {k}: {describe_array(v)}" for k, v in data.non_tensor_batch.items()]
    if data.meta_info:
        lines.append(f"  meta_info: {short_meta(data.meta_info)}")
    return "\n".join(lines)


def human_bytes(count: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def short_meta(meta: dict[str, Any]) -> str:
    """Scalars shown by value, anything else by type name, each cut to 40 characters."""
    parts = []
    for key, value in meta.items():
        text = repr(value) if isinstance(value, (int, float, str, bool)) else type(value).__name__
        parts.append(f"{key}={text[:40]}")
    return "{" + ", ".join(parts) + "}"
