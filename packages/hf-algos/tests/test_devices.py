"""GPU settings mean GPU: verl's ``n_gpus_per_node`` and ``trainer.device=cuda`` ask for
GPUs, a GPU run where there is none is refused with the fix, and no engine trains on the
CPU when the config asked for a GPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_algos.trainers.roles.placement import require_gpus, worker_pool
from hf_algos.trainers.roles.workers import engine_on_device
from hf_controller import ConfigurationError
from hf_engines.config import FSDPConfig

from .test_cli import hybridflow

MODEL = [
    "+actor.engine.model.hf_config.model_type=llama",
    f"data.tokenizer_path={Path(__file__).parent}",
]
BASE = [*MODEL, "rollout.n=4", "data.train_batch_size=4", "actor.ppo_mini_batch_size=16"]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


def load(*overrides: str) -> RLConfig:
    return load_config(RLConfig, overrides=[*BASE, *overrides])


def test_verl_gpu_keys_select_gpus() -> None:
    verl = load("trainer.n_gpus_per_node=8", "trainer.nnodes=2")
    assert (verl.trainer.use_gpu, verl.trainer.n_workers) == (True, 16)
    assert load("trainer.device=cuda").trainer.use_gpu is True
    assert load("trainer.device=cpu").trainer.use_gpu is False
    # said outright, the CPU wins: n_gpus_per_node then counts CPU processes per node
    on_cpu = load("trainer.n_gpus_per_node=2", "trainer.device=cpu")
    assert (on_cpu.trainer.use_gpu, on_cpu.trainer.n_workers) == (False, 2)
    with pytest.raises(
        ConfigurationError, match=r"trainer.device='npu' .* \['cpu', 'cuda', 'gpu'\]"
    ):
        load("trainer.device=npu")
    with pytest.raises(ConfigurationError, match=r"set the same key trainer\.use_gpu"):
        load("trainer.device=cuda", "trainer.use_gpu=false")


def test_engines_compute_where_the_trainer_says() -> None:
    engine = load().actor.engine
    assert engine.fsdp.device == "auto"
    assert engine_on_device(engine, load().trainer, "actor.engine").fsdp.device == "cpu"
    gpu = load("trainer.use_gpu=true").trainer
    assert engine_on_device(engine, gpu, "actor.engine").fsdp.device == "cuda"
    pinned = dataclasses.replace(engine, fsdp=FSDPConfig(device="cpu"))
    with pytest.raises(
        ConfigurationError,
        match=r"critic.engine.fsdp.device='cpu' contradicts trainer.use_gpu=true; set "
        r"critic.engine.fsdp.device='cuda'",
    ):
        engine_on_device(pinned, gpu, "critic.engine")


@NO_CUDA
def test_a_gpu_run_without_a_gpu_is_refused_with_the_fix(ray_session: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"sees no CUDA device .* trainer.use_gpu=false"):
        require_gpus(True, "local", 1, 1.0)
    gpu = load("trainer.n_gpus_per_node=2").trainer
    with pytest.raises(ConfigurationError, match=r"2 x 1 GPUs, but the Ray cluster has no GPU"):
        worker_pool(gpu, gpu.n_workers, "hf_test_gpu", gpu.gpus_per_worker)
    require_gpus(False, "ray", 2, 1.0)  # a CPU run asks nothing of the cluster


@NO_CUDA
def test_hybridflow_with_a_verl_gpu_script_exits_2_naming_the_fix(tmp_path: Path) -> None:
    run = hybridflow(
        "grpo",
        "--config-name",
        "quickstart",
        f"vars.workdir={tmp_path}",
        "trainer.backend=local",
        "trainer.device=cuda",
        cwd=tmp_path,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "trainer.use_gpu=true, but this process sees no CUDA device" in run.stderr
    assert "Traceback" not in run.stderr
