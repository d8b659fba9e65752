"""hf-protocol: the DataProto batch container exchanged between HybridFlow worker groups.

Also the batch contract: :mod:`hf_protocol.fields` names the fields, :mod:`hf_protocol.layout`
pads prompts and responses into them.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

from hf_protocol import fields
from hf_protocol.data_proto import DataProto, DataProtoItem
from hf_protocol.distributed import all_gather_data_proto
from hf_protocol.future import DataProtoFuture
from hf_protocol.layout import (
    PromptTensors,
    build_prompt_response_batch,
    continue_position_ids,
    left_pad,
    position_ids_from_mask,
    right_pad,
)
from hf_protocol.padding import pad_dataproto_to_divisor, unpad_dataproto
from hf_protocol.unions import union_numpy_dict, union_tensor_dict

try:  # the installed distribution's version, so it cannot drift from pyproject.toml
    __version__ = _distribution_version("hf-protocol")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [
    "DataProto",
    "DataProtoFuture",
    "DataProtoItem",
    "PromptTensors",
    "all_gather_data_proto",
    "build_prompt_response_batch",
    "continue_position_ids",
    "fields",
    "left_pad",
    "pad_dataproto_to_divisor",
    "position_ids_from_mask",
    "right_pad",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]
