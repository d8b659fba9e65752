"""hf-controller dispatching hf-protocol DataProtos: uneven batches, padding, futures."""

from typing import Any

import numpy as np
import pytest
import torch

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
)
from hf_protocol import DataProto, DataProtoFuture
from hf_protocol.testing import assert_dataproto_equal


class RolloutWorker(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def score(self, batch: DataProto) -> DataProto:
        values = batch.batch["x"].float() * 2
        ranks = np.full(len(batch), self.rank)
        return DataProto.from_dict(
            {"score": values}, {"rank": ranks}, {"metrics": {"rows": len(batch)}}
        )

    @register(Dispatch.DP_COMPUTE_PROTO, pad_to_equal=True)
    def shard_sizes(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict({"size": torch.full((len(batch),), len(batch))})

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def generate(self, prompts: DataProto) -> DataProto:
        return DataProto.from_dict({"responses": prompts.batch["x"] + 100})


class TrainerWorker(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def consume(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict({"seen": batch.batch["responses"].clone()})


@pytest.fixture(scope="module")
def rollout(ray_session: Any) -> RayWorkerGroup:
    return RayWorkerGroup(RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(RolloutWorker))


def test_ten_rows_on_four_workers(rollout: RayWorkerGroup) -> None:
    batch = DataProto.from_dict({"x": torch.arange(10)})
    out = rollout.score(batch)
    assert out.batch["score"].tolist() == [2.0 * i for i in range(10)]
    assert out.non_tensor_batch["rank"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    assert out.meta_info["metrics"] == {"rows": [3, 3, 2, 2]}


def test_pad_to_equal_removes_padding(rollout: RayWorkerGroup) -> None:
    out = rollout.shard_sizes(DataProto.from_dict({"x": torch.arange(10)}))
    assert out.batch["size"].tolist() == [3] * 10


def test_future_feeds_another_group_without_the_driver(
    rollout: RayWorkerGroup, ray_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(TrainerWorker)
    )

    def refuse(self: DataProto, state: dict[str, Any]) -> None:
        raise AssertionError("the driver unpickled a DataProto it only forwards")

    prompts = DataProto.from_dict({"x": torch.arange(9)})
    future = rollout.generate(prompts)  # refs from 4 workers: 3/2/2/2 rows
    monkeypatch.setattr(DataProto, "__setstate__", refuse)
    handles = trainer.execute_all_async("consume", future.chunk(2))  # resolved in the workers
    monkeypatch.undo()
    parts = ray_session.get(handles)
    assert_dataproto_equal(
        DataProto.concat(parts), DataProto.from_dict({"seen": torch.arange(9) + 100})
    )


def test_user_built_dataproto_future_is_materialized_in_workers(
    rollout: RayWorkerGroup, ray_session: Any
) -> None:
    trainer = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(TrainerWorker)
    )
    refs = [
        ray_session.put(DataProto.from_dict({"responses": torch.arange(5) + i * 5}))
        for i in range(2)
    ]
    out = trainer.consume(DataProtoFuture.concat(refs))
    assert out.batch["seen"].tolist() == list(range(10))
