"""Pickling: tensors leave as out-of-band buffers, never through torch.save."""

import pickle
from collections.abc import Callable

import numpy as np
import pytest
import torch

from hf_protocol import DataProto
from hf_protocol.testing import assert_dataproto_equal
from hf_protocol.transport import COPY_ON_RECEIVE_ENV


def test_protocol_5_sends_each_tensor_out_of_band(make_batch: Callable[..., DataProto]) -> None:
    data = make_batch(length=64, seq_len=128)
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    tensor_bytes = sum(t.numel() * t.element_size() for t in data.batch.values())  # type: ignore[union-attr]
    out_of_band = sum(memoryview(b).nbytes for b in buffers)
    assert out_of_band >= tensor_bytes  # every tensor byte travels outside the pickle stream
    assert len(payload) < tensor_bytes / 10
    restored = pickle.loads(payload, buffers=buffers)
    assert_dataproto_equal(restored, data)


def test_received_tensors_share_the_buffer_memory() -> None:
    data = DataProto.from_dict({"x": torch.arange(1000, dtype=torch.float32)})
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    restored = pickle.loads(payload, buffers=buffers)
    received = restored.batch["x"]  # type: ignore[index]
    assert received.data_ptr() == np.frombuffer(buffers[0], dtype=np.uint8).ctypes.data


def test_copy_on_receive_detaches_from_the_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COPY_ON_RECEIVE_ENV, "1")
    data = DataProto.from_dict({"x": torch.arange(1000, dtype=torch.float32)})
    buffers: list[pickle.PickleBuffer] = []
    restored = pickle.loads(
        pickle.dumps(data, protocol=5, buffer_callback=buffers.append), buffers=buffers
    )
    received = restored.batch["x"]  # type: ignore[index]
    assert received.data_ptr() != np.frombuffer(buffers[0], dtype=np.uint8).ctypes.data
    assert torch.equal(received, data.batch["x"])  # type: ignore[index]


def test_in_band_pickle_round_trips_every_dtype_and_layout() -> None:
    strided = torch.arange(20).reshape(4, 5)[:, ::2]
    data = DataProto.from_dict(
        {
            "bf16": torch.randn(4, 3).to(torch.bfloat16),
            "mask": torch.tensor([True, False, True, True]),
            "strided": strided,
            "grad": torch.ones(4, requires_grad=True),
            "empty": torch.zeros(4, 0),
        },
        {"s": ["a", "b", "c", "d"]},
        {"metrics": {"x": [1.0]}},
    )
    for protocol in (2, 4, 5):
        assert_dataproto_equal(pickle.loads(pickle.dumps(data, protocol=protocol)), data)


def test_pickle_does_not_use_torch_save(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.save must not be used for transport")

    monkeypatch.setattr(torch, "save", forbidden)
    data = DataProto.from_dict({"x": torch.zeros(3)})
    assert_dataproto_equal(pickle.loads(pickle.dumps(data, protocol=5)), data)


def test_state_from_another_version_is_refused() -> None:
    data = DataProto.from_dict({"x": torch.zeros(2)})
    state = data.__getstate__()
    state["version"] = 99
    with pytest.raises(ValueError, match="state version 99"):
        DataProto.__new__(DataProto).__setstate__(state)
