"""``auto`` compute precision: bf16 where the hardware computes it natively and the model
takes it, else fp32.

The rule is one pure function, :func:`choose_compute_dtype`, of the device, the CPU's
flags and the checkpoint's own dtype; :func:`resolve_auto_dtype` gathers those inputs on
this machine. Only the compute dtype is chosen: parameters, their gradients' reduction
and the optimizer state keep their own dtypes (fp32 master weights under FSDP2's mixed
precision). Light: torch is imported only to ask a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hf_engines.config import EngineConfig, hf_config_dict

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""x86 CPU flags (``/proc/cpuinfo``) of native bf16 matrix arithmetic: AMX tiles (Sapphire
Rapids and later) or AVX512-BF16 dot products (Cooper Lake, Zen 4 and later). Without
either, torch's bf16 matrix products are slower than fp32 ones (on an AVX2 EPYC, 0.4 vs
23 GFLOP/s: ``tools/bench/bench_flops.py``)."""

BF16_SAFE_CHECKPOINTS = ("bfloat16", "float32")
"""Checkpoint dtypes a model computes in bf16 without loss of range: trained in bf16, or
kept in fp32 (GGUF imports are fp32). A float16 checkpoint was trained in fp16, whose
10 mantissa bits bf16 does not keep; ``auto`` leaves it in fp32."""


@dataclass(frozen=True)
class DTypeChoice:
    """What ``auto`` resolved to and why."""

    dtype: Literal["bfloat16", "float32"]
    """The compute dtype chosen."""
    reason: str
    """Why, in words (the CPU flags or GPU, and the checkpoint dtype)."""

    def line(self, key: str = "dtype") -> str:
        """The one log line, e.g. ``fsdp.param_dtype auto -> float32: this CPU has no ...``."""
        return f"{key} auto -> {self.dtype}: {self.reason}"


def choose_compute_dtype(
    device: str,
    cpu_flags: Collection[str],
    checkpoint_dtype: str | None,
    cuda_bf16: bool = False,
) -> DTypeChoice:
    """The compute dtype ``auto`` means on ``device`` (``cpu`` or ``cuda``).

    bf16 when the hardware computes it natively (a CPU with one of :data:`BF16_CPU_FLAGS`
    among ``cpu_flags``; a GPU with ``cuda_bf16``, ``torch.cuda.is_bf16_supported()``) and
    the checkpoint is bf16-safe (``checkpoint_dtype`` in :data:`BF16_SAFE_CHECKPOINTS`, or
    ``None``: a randomly initialised model, or a config that names no dtype); else fp32.
    """
    if checkpoint_dtype is not None and checkpoint_dtype not in BF16_SAFE_CHECKPOINTS:
        return DTypeChoice(
            "float32",
            f"the checkpoint's dtype is {checkpoint_dtype} (bf16-safe: "
            f"{', '.join(BF16_SAFE_CHECKPOINTS)}); set bfloat16 explicitly to override",
        )
    ckpt = f"checkpoint {checkpoint_dtype or 'dtype not given'}"
    if device == "cuda":
        if cuda_bf16:
            return DTypeChoice("bfloat16", f"this GPU computes bf16 natively ({ckpt})")
        return DTypeChoice("float32", f"this GPU has no native bf16 ({ckpt})")
    found = sorted(set(cpu_flags) & set(BF16_CPU_FLAGS))
    if found:
        return DTypeChoice("bfloat16", f"this CPU has {', '.join(found)} ({ckpt})")
    shown = sorted(flag for flag in cpu_flags if flag.startswith(("avx512", "amx")))
    return DTypeChoice(
        "float32",
        "this CPU has no AMX or AVX512_BF16 (flags: "
        f"{' '.join(shown) or 'no avx512/amx flags'}), where bf16 matrix products run slower "
        "than fp32",
    )


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags from the first ``flags`` line of ``cpuinfo`` (Linux x86);
    empty where there is no such file or line (macOS, Windows, ARM)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def checkpoint_dtype(hf_config: Mapping[str, Any] | None) -> str | None:
    """The dtype a Hugging Face config says its weights are in (``dtype``, or the older
    ``torch_dtype`` key); ``None`` when it names none or there is no config."""
    if hf_config is None:
        return None
    value = hf_config.get("dtype") or hf_config.get("torch_dtype")
    return str(value).removeprefix("torch.") if value else None


def resolve_auto_dtype(device: str, hf_config: Mapping[str, Any] | None) -> DTypeChoice:
    """:func:`choose_compute_dtype` for this machine: its CPU flags, and on ``cuda`` whether
    the visible GPU computes bf16; ``hf_config`` is the model's Hugging Face config."""
    cuda_bf16 = False
    if device == "cuda":
        import torch

        cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return choose_compute_dtype(device, cpu_flags(), checkpoint_dtype(hf_config), cuda_bf16)


def with_compute_dtype(
    engine: EngineConfig, device: str
) -> tuple[EngineConfig, DTypeChoice | None]:
    """``engine`` with ``fsdp.param_dtype='auto'`` resolved for ``device`` (``cpu`` /
    ``cuda``) and the model's checkpoint, and the choice made (``None``: nothing was
    ``auto``, ``engine`` is returned as is)."""
    if engine.fsdp.param_dtype != "auto":
        return engine, None
    choice = resolve_auto_dtype(device, hf_config_dict(engine.model))
    fsdp = dataclasses.replace(engine.fsdp, param_dtype=choice.dtype)
    return dataclasses.replace(engine, fsdp=fsdp), choice
