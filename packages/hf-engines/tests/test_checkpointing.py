"""The backend-neutral checkpoint helpers: RNG state, optimizer-state moves, HF directories."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import pytest
import torch

from hf_controller import ConfigurationError
from hf_engines.checkpointing import (
    CorruptCheckpointError,
    UnsafeCheckpointError,
    load_state_file,
    move_optimizer_state,
    rng_state,
    set_rng_state,
)
from hf_engines.distributed import resolve_compute_device


def test_rng_state_round_trip_replays_the_same_draws() -> None:
    saved = rng_state()
    first = (torch.rand(3), random.random())
    set_rng_state(saved)
    again = (torch.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and first[1] == again[1]


def test_move_optimizer_state_moves_every_tensor() -> None:
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([param], lr=0.1)
    param.grad = torch.ones(2)
    optimizer.step()
    move_optimizer_state(optimizer, torch.device("meta"))
    tensors = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    assert tensors and all(t.device.type == "meta" for t in tensors)


def test_resolve_compute_device_names_the_section_without_cuda() -> None:
    assert resolve_compute_device("cpu", "fsdp") == torch.device("cpu")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    expected = r"megatron\.device asks for CUDA.*megatron\.device='cpu'"
    with pytest.raises(RuntimeError, match=expected):
        resolve_compute_device("cuda", "megatron")


def test_a_cuda_engine_without_cuda_fails_before_its_process_group() -> None:
    from hf_engines.workers.distributed import pick_backend

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert pick_backend("auto") == pick_backend("cpu") == "gloo"
    with pytest.raises(RuntimeError, match=r"device is 'cuda', but this process sees no CUDA"):
        pick_backend("cuda")


class _RunsCodeOnLoad:
    """Unpickling this calls ``os.system``: what a crafted checkpoint would carry."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


def test_load_state_file_refuses_a_pickled_callable(tmp_path: Path) -> None:
    good = tmp_path / "extra_state_rank0.pt"
    torch.save({"rng": rng_state(), "global_step": 3, "w": torch.ones(2)}, good)
    assert load_state_file(good)["global_step"] == 3
    crafted = tmp_path / "crafted.pt"
    torch.save({"global_step": 3, "payload": _RunsCodeOnLoad()}, crafted)
    with pytest.raises(UnsafeCheckpointError, match=r"crafted\.pt.*system"):
        load_state_file(crafted)


def _dcp_round_trip(directory: Path) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    return model, optimizer


def test_dcp_loads_through_the_safe_reader_and_refuses_crafted_metadata(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from hf_engines.fsdp.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, check_metadata

    saved, _ = _dcp_round_trip(tmp_path / "dcp")
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.load(
        {"model": model_state, "optim": optim_state},
        storage_reader=SafeFileSystemReader(tmp_path / "dcp"),
        planner=SafeLoadPlanner(),
    )
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    assert torch.equal(model.weight, saved.weight)
    assert optimizer.state_dict()["param_groups"][0]["lr"] == 0.1

    metadata = tmp_path / "dcp" / ".metadata"
    metadata.write_bytes(pickle.dumps(_RunsCodeOnLoad()))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata.*system"):
        check_metadata(metadata)
    with pytest.raises(CheckpointException, match="refused to load"):  # DCP wraps it per rank
        dcp.load(
            {"model": model_state},
            storage_reader=SafeFileSystemReader(tmp_path / "dcp"),
            planner=SafeLoadPlanner(),
        )


def test_a_truncated_state_file_is_damaged_not_unsafe(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.pt"
    torch.save({"global_step": 3, "w": torch.ones(64)}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CorruptCheckpointError, match=r"trainer_state\.pt' \(200 bytes\)"):
        load_state_file(path)
    assert issubclass(CorruptCheckpointError, ConfigurationError)  # one line, exit 2


def test_a_truncated_dcp_checkpoint_is_named_not_blamed_as_code(tmp_path: Path) -> None:
    from hf_engines.fsdp.safe_dcp import check_metadata, check_storage_sizes

    _dcp_round_trip(tmp_path / "dcp")
    metadata_file = tmp_path / "dcp" / ".metadata"
    metadata = check_metadata(metadata_file)
    check_storage_sizes(tmp_path / "dcp", metadata)  # whole: passes
    data = next((tmp_path / "dcp").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(CorruptCheckpointError, match=rf"{data.name}' has 100 bytes.*needs"):
        check_storage_sizes(tmp_path / "dcp", metadata)
    metadata_file.write_bytes(metadata_file.read_bytes()[:1000])
    with pytest.raises(CorruptCheckpointError, match=r"\.metadata' \(1000 bytes\) is truncated"):
        check_metadata(metadata_file)
