"""verl's DataProto names over hf-protocol (rename only, for now)."""

from hf_protocol import (
    DataProto,
    DataProtoFuture,
    pad_dataproto_to_divisor,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)

__all__ = [
    "DataProto",
    "DataProtoFuture",
    "pad_dataproto_to_divisor",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]
