"""hf-protocol: the DataProto batch container exchanged between HybridFlow worker groups."""

from hf_protocol.data_proto import DataProto, DataProtoItem
from hf_protocol.distributed import all_gather_data_proto
from hf_protocol.future import DataProtoFuture
from hf_protocol.padding import pad_dataproto_to_divisor, unpad_dataproto
from hf_protocol.unions import union_numpy_dict, union_tensor_dict

__version__ = "0.1.0"

__all__ = [
    "DataProto",
    "DataProtoFuture",
    "DataProtoItem",
    "all_gather_data_proto",
    "pad_dataproto_to_divisor",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]
