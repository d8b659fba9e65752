"""DataProto.to_tensordict / from_tensordict: one TensorDict holding all three parts."""

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hf_protocol import DataProto
from hf_protocol.testing import assert_dataproto_equal


def _batch() -> DataProto:
    return DataProto.from_dict(
        tensors={"ids": torch.arange(6).reshape(3, 2), "mask": torch.ones(3, 2, dtype=torch.bool)},
        non_tensors={
            "uid": ["a", "b", "c"],
            "turn_scores": [[], [0.5, 0.8], [0.9]],
            "info": [{"acc": 1.0}, {"acc": 0.0}, {"acc": 1.0}],
            "num_turns": np.array([2, 4, 1], dtype=np.int32),
        },
        meta_info={"global_steps": 42, "temperature": 0.7},
    )


def test_to_tensordict_lays_out_columns_and_meta_info() -> None:
    data = _batch()
    td = data.to_tensordict()
    assert td.batch_size == torch.Size([3])
    assert td.get("ids") is data.batch["ids"]  # type: ignore[index]
    assert isinstance(td.get("uid"), NonTensorStack) and td["uid"] == ["a", "b", "c"]
    assert td.get("turn_scores").tolist() == [[], [0.5, 0.8], [0.9]]
    assert isinstance(td.get("global_steps"), NonTensorData) and td["global_steps"] == 42


def test_round_trip_keeps_every_part() -> None:
    data = _batch()
    back = DataProto.from_tensordict(data.to_tensordict())
    assert_dataproto_equal(back, data)
    assert back.non_tensor_batch["num_turns"].dtype == np.int32
    assert back.non_tensor_batch["info"].dtype == object


def test_from_tensordict_adds_given_meta_info_and_accepts_plain_tensordicts() -> None:
    plain = TensorDict({"x": torch.zeros(4)}, batch_size=[4])
    data = DataProto.from_tensordict(plain, meta_info={"step": 1})
    assert len(data) == 4 and data.non_tensor_batch == {} and data.meta_info == {"step": 1}


def test_meta_only_and_non_tensor_only_dataprotos_convert() -> None:
    meta_only = DataProto(meta_info={"step": 3})
    td = meta_only.to_tensordict()
    assert td.batch_size == torch.Size([]) and td["step"] == 3
    assert DataProto.from_tensordict(td).meta_info == {"step": 3}
    labels = DataProto.from_dict(non_tensors={"labels": ["x", "y"]})
    back = DataProto.from_tensordict(labels.to_tensordict())
    assert back.non_tensor_batch["labels"].tolist() == ["x", "y"]


def test_conversion_errors_name_the_key() -> None:
    clash = DataProto.from_dict({"step": torch.zeros(2)}, meta_info={"step": 1})
    with pytest.raises(ValueError, match=r"\['step'\]"):
        clash.to_tensordict()
    nested = TensorDict({"inner": TensorDict({"x": torch.zeros(2)}, [2])}, batch_size=[2])
    with pytest.raises(TypeError, match="'inner'"):
        DataProto.from_tensordict(nested)
    with pytest.raises(ValueError, match="num_batch_dims=2"):
        DataProto.from_tensordict(TensorDict({}, batch_size=[]), num_batch_dims=2)
    with pytest.raises(TypeError, match="needs a TensorDict"):
        DataProto.from_tensordict({"x": torch.zeros(2)})  # type: ignore[arg-type]
