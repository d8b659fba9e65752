"""The Megatron weight stream on N gloo ranks, run by test_megatron_weight_stream.py.

Usage: ``python megatron_stream_scenarios.py MODEL_DIR OUT_DIR TP PP``. Every rank iterates
``iter_full_params()`` (collective) and records, after each yielded tensor, the bytes of
the tensors the stream itself still holds (the consumer drops each one at once); rank 0
also keeps a copy of every tensor. Each rank writes ``OUT_DIR/rank<r>.pt``.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hf_engines import EngineConfig, config_from_dict
from hf_engines.megatron import MegatronEngine


def measure_stream(params: Iterable[tuple[str, torch.Tensor]], keep: bool) -> dict[str, Any]:
    """Consume ``params``; return the names, copies (with ``keep``) and the peak of the
    bytes of yielded tensors still alive after the consumer dropped them (storage counted
    once: a tied ``lm_head`` is the embedding)."""
    yielded: list[tuple[weakref.ref[torch.Tensor], int, int]] = []
    names: list[str] = []
    copies: dict[str, torch.Tensor] = {}
    peak = 0
    for name, tensor in params:
        names.append(name)
        if keep:
            copies[name] = tensor.detach().clone()
        yielded.append((weakref.ref(tensor), tensor.data_ptr(), tensor.nbytes))
        del tensor
        alive = {ptr: size for ref, ptr, size in yielded if ref() is not None}
        peak = max(peak, sum(alive.values()))
    return {"names": names, "params": copies, "peak_live_bytes": peak}


def main() -> None:
    """Build the engine with the sizes named on the command line and measure its stream."""
    model_dir, out_dir, tp, pp = sys.argv[1:5]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    config = config_from_dict(
        EngineConfig,
        {
            "backend": "megatron",
            "model": {"path": model_dir},
            "megatron": {
                "tensor_model_parallel_size": int(tp),
                "pipeline_model_parallel_size": int(pp),
            },
        },
    )
    engine = MegatronEngine(config)
    rank = dist.get_rank()
    result = measure_stream(engine.iter_full_params(), keep=rank == 0)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
