"""``dtype: auto``: bf16 compute where the hardware has it and the checkpoint takes it, fp32
otherwise, with the reason; explicit dtypes are kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_controller import ConfigurationError
from hf_engines.config import EngineConfig, FSDPConfig, ModelConfig
from hf_engines.precision import (
    checkpoint_dtype,
    choose_compute_dtype,
    cpu_flags,
    with_compute_dtype,
)

THIS_CPU = {"fpu", "avx2", "avx512f", "avx512bw", "avx512_vnni"}  # no bf16 arithmetic
SAPPHIRE_RAPIDS = THIS_CPU | {"amx_tile", "amx_bf16", "amx_int8", "avx512_bf16"}
ZEN4 = THIS_CPU | {"avx512_bf16"}
TINY = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 64}  # fmt: skip


@pytest.mark.parametrize(
    ("device", "flags", "ckpt", "cuda_bf16", "dtype", "reason"),
    [
        ("cpu", SAPPHIRE_RAPIDS, "bfloat16", False, "bfloat16", "has amx_bf16, avx512_bf16"),
        ("cpu", ZEN4, "float32", False, "bfloat16", "has avx512_bf16 (checkpoint float32)"),
        ("cpu", ZEN4, None, False, "bfloat16", "dtype not given"),
        ("cpu", THIS_CPU, "bfloat16", False, "float32", "no AMX or AVX512_BF16"),
        ("cpu", {"amx_tile"}, None, False, "float32", "(flags: amx_tile)"),  # tiles, no bf16
        ("cpu", set(), None, False, "float32", "(flags: no avx512/amx flags)"),
        ("cpu", SAPPHIRE_RAPIDS, "float16", False, "float32", "checkpoint's dtype is float16"),
        ("cuda", set(), "bfloat16", True, "bfloat16", "this GPU computes bf16 natively"),
        ("cuda", SAPPHIRE_RAPIDS, "float32", False, "float32", "this GPU has no native bf16"),
        ("cuda", set(), "float16", True, "float32", "set bfloat16 explicitly to override"),
    ],
)
def test_auto_is_bf16_only_with_native_bf16_and_a_bf16_safe_checkpoint(
    device: str, flags: set[str], ckpt: str | None, cuda_bf16: bool, dtype: str, reason: str
) -> None:
    choice = choose_compute_dtype(device, flags, ckpt, cuda_bf16)
    assert choice.dtype == dtype
    assert reason in choice.reason
    assert choice.line().startswith(f"dtype auto -> {dtype}: ")


def test_the_line_names_the_avx512_flags_this_cpu_has() -> None:
    line = choose_compute_dtype("cpu", THIS_CPU, "float32").line()
    assert line == (
        "dtype auto -> float32: this CPU has no AMX or AVX512_BF16 (flags: avx512_vnni "
        "avx512bw avx512f), where bf16 matrix products run slower than fp32"
    )


def test_cpu_flags_come_from_the_first_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu amx_bf16 avx512f\nflags\t: other\n")
    assert cpu_flags(cpuinfo) == {"fpu", "amx_bf16", "avx512f"}
    assert cpu_flags(tmp_path / "absent") == frozenset()
    (tmp_path / "arm").write_text("Features\t: fp asimd bf16\n")
    assert cpu_flags(tmp_path / "arm") == frozenset()


def test_checkpoint_dtype_reads_either_key() -> None:
    assert checkpoint_dtype({"dtype": "bfloat16"}) == "bfloat16"
    assert checkpoint_dtype({"torch_dtype": "torch.float16"}) == "float16"
    assert checkpoint_dtype({"model_type": "llama"}) is None
    assert checkpoint_dtype(None) is None


def test_an_engine_resolves_auto_and_keeps_explicit_dtypes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "dtype": "float16"}))
    fp16_model = EngineConfig(
        model=ModelConfig(path=str(tmp_path)), fsdp=FSDPConfig(param_dtype="auto")
    )
    resolved, choice = with_compute_dtype(fp16_model, "cpu")
    assert choice is not None and resolved.fsdp.param_dtype == "float32" == choice.dtype
    assert "float16" in choice.reason
    assert resolved.model == fp16_model.model  # master weights keep model.dtype
    explicit = EngineConfig(
        model=ModelConfig(hf_config=TINY), fsdp=FSDPConfig(param_dtype="bfloat16")
    )
    assert with_compute_dtype(explicit, "cpu") == (explicit, None)
    random_init = EngineConfig(
        model=ModelConfig(hf_config=TINY), fsdp=FSDPConfig(param_dtype="auto")
    )
    resolved, choice = with_compute_dtype(random_init, "cpu")
    assert choice is not None and resolved.fsdp.param_dtype == choice.dtype
    assert resolved.fsdp.param_dtype in ("float32", "bfloat16")


def test_model_dtype_auto_points_to_the_compute_dtype() -> None:
    with pytest.raises(ConfigurationError, match=r"model.dtype='auto' .* fsdp.param_dtype"):
        ModelConfig(hf_config=TINY, dtype="auto")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"fsdp.param_dtype='bf16' is not one of 'auto'"):
        FSDPConfig(param_dtype="bf16")  # type: ignore[arg-type]


def test_an_fsdp_engine_given_auto_computes_in_the_resolved_dtype(
    tiny_models: dict[str, Path], one_rank: None
) -> None:
    from hf_engines.fsdp import FSDPEngine
    from hf_engines.precision import resolve_auto_dtype

    model = ModelConfig(path=str(tiny_models["llama"]))
    engine = FSDPEngine(EngineConfig(model=model, fsdp=FSDPConfig(param_dtype="auto")))
    expected = resolve_auto_dtype("cpu", {"dtype": "float32"}).dtype
    assert engine.config.fsdp.param_dtype == expected
    assert {p.dtype for p in engine.model.parameters()} == {torch.float32}  # master weights
