"""DataProtoFuture between two real Ray actors: the driver never holds the data."""

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hf_protocol import DataProto, DataProtoFuture


class Producer:
    """Stands in for a worker group's rank: returns a slice of rollout data."""

    def generate(self, rank: int, rows: int) -> DataProto:
        return DataProto.from_dict(
            {"responses": torch.full((rows, 1024), rank, dtype=torch.int64)},
            {"uid": [f"{rank}-{i}" for i in range(rows)]},
            {"metrics": {"gen_time": float(rank)}},
        )


class Consumer:
    """Receives a future and reports what it resolved to."""

    def consume(self, future: DataProtoFuture) -> dict[str, Any]:
        data = future.get()
        return {
            "rows": len(data),
            "first_uid": data.non_tensor_batch["uid"][0] if len(data) else None,
            "sum": int(data.batch["responses"].sum()),
            "metrics": data.meta_info.get("metrics"),
        }


@pytest.fixture
def driver_never_deserializes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any DataProto unpickled in this (the driver's) process fails the test."""

    def refuse(self: DataProto, state: dict[str, Any]) -> None:
        raise AssertionError("the driver fetched a DataProto it should only have forwarded")

    monkeypatch.setattr(DataProto, "__setstate__", refuse)
    yield


def test_future_chained_between_actors_skips_the_driver(
    ray_cluster: Any, driver_never_deserializes: None
) -> None:
    ray = ray_cluster
    producers = [ray.remote(Producer).remote() for _ in range(2)]
    consumers = [ray.remote(Consumer).remote() for _ in range(3)]
    refs = [
        p.generate.remote(rank, rows)
        for rank, (p, rows) in enumerate(zip(producers, [4, 3], strict=True))
    ]

    future = DataProtoFuture.concat(refs)
    parts = future.chunk(3)  # 7 rows on 3 consumers: 3/2/2, resolved inside the consumers
    reports = ray.get([c.consume.remote(part) for c, part in zip(consumers, parts, strict=True)])

    assert [r["rows"] for r in reports] == [3, 2, 2]
    assert [r["first_uid"] for r in reports] == ["0-0", "0-3", "1-1"]
    assert sum(r["sum"] for r in reports) == 3 * 1024  # the three rank-1 rows
    assert reports[0]["metrics"] == {"gen_time": [0.0, 1.0]}
    with pytest.raises(ray.exceptions.RaySystemError, match="driver fetched"):
        ray.get(refs[0])  # proves the guard is live in this process


def test_get_in_driver_and_type_errors(ray_cluster: Any) -> None:
    ray = ray_cluster
    refs = [ray.put(DataProto.from_dict({"x": torch.arange(3)}))]
    assert DataProtoFuture.concat(refs).get().batch["x"].tolist() == [0, 1, 2]  # type: ignore[index]
    with pytest.raises(TypeError, match=r"resolve to DataProto, got \['int'\]"):
        DataProtoFuture.concat([ray.put(5)]).get()


def test_chunk_arguments_are_checked(ray_cluster: Any) -> None:
    future = DataProtoFuture.concat([ray_cluster.put(DataProto.from_dict({"x": torch.arange(3)}))])
    with pytest.raises(ValueError, match="got 0"):
        future.chunk(0)
    with pytest.raises(ValueError, match="already a chunk"):
        future.chunk(2)[0].chunk(2)
    with pytest.raises(ValueError, match="at least one"):
        DataProtoFuture.concat([])


def test_ray_is_imported_lazily() -> None:
    import subprocess
    import sys

    code = "import sys, hf_protocol; assert 'ray' not in sys.modules, 'ray imported'; print('ok')"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "ok", result.stderr
