"""Activation memory per rank of one forward + backward, without and with Ulysses SP.

One sequence of ``T`` tokens (half prompt, half response) through a small random
Llama-style model (hidden 256, 4 layers, 8 heads, 4 key/value heads, vocab 1024), on CPU
with gloo:

- **sp=1**: one rank, the FSDP engine's own forward (``forward_micro_batch``, the row as
  it is: no padding to skip);
- **sp=2**: two ranks, the Ulysses path (``forward_sequence_parallel``), each rank with
  one such row as well. The engine runs the group's micro-batches one rank's at a time, so
  one pass is measured: rank 0's row split over both ranks, each holding ``T/2`` tokens
  and attending over all ``T`` with half the heads.

Both score the response tokens (log-probs + entropy) and back-propagate their sum.
Measured per rank:

- **saved activations**: bytes of the tensors autograd keeps for backward
  (``torch.autograd.graph.saved_tensors_hooks``; each storage counted once, weights
  excluded). This is the activation memory, independent of the allocator and of what
  else the machine runs;
- **peak RSS delta**: the process's peak resident memory (``ru_maxrss``) minus its RSS
  just before the forward; it includes transient buffers (attention workspaces, the
  all-to-all buffers) and allocator slack.

Run from the repository root (one process per measurement, ranks via ``launch_ranks``)::

    python tools/bench/bench_ulysses_memory.py --tokens 2048 8192 --output sp_bench.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

MODEL: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 16384,
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _one_sequence(tokens: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Model inputs and responses of one ``tokens``-long row (no padding)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, MODEL["vocab_size"], (1, tokens), generator=generator)
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(tokens).unsqueeze(0),
    }
    return inputs, ids[:, tokens // 2 :]


def measure(model_dir: str, tokens: int, sp: int) -> dict[str, float]:
    """This rank's saved-activation bytes and peak RSS delta of one forward + backward."""
    from hf_engines import EngineConfig, FSDPConfig, ModelConfig
    from hf_engines.fsdp.forward import forward_micro_batch
    from hf_engines.fsdp.sp_forward import forward_sequence_parallel
    from hf_engines.fsdp.ulysses import enable_ulysses, sequence_parallel_group
    from hf_engines.models import build_hf_model

    config = EngineConfig(
        model=ModelConfig(path=model_dir),
        fsdp=FSDPConfig(ulysses_sequence_parallel_size=sp),
    )
    model = build_hf_model(config.model)
    group = sequence_parallel_group(sp, "cpu")
    if group is not None:
        enable_ulysses(model, config)
    inputs, responses = _one_sequence(tokens)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    before = _rss_bytes()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        if group is None:
            outputs = forward_micro_batch(model, inputs, responses, False, 1.0, "trim")
        else:
            # The engine's pass for rank 0's row (every rank has one; the engine runs one
            # pass per rank's micro-batch, each freed by its backward before the next).
            mine = dist.get_rank() == 0
            outputs = forward_sequence_parallel(
                model, inputs, responses, False, 1.0, group, contribute=mine
            )
        loss = outputs["log_probs"].sum() + outputs["entropy"].sum()
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"saved_mib": sum(saved.values()) / 2**20, "rss_mib": (peak - before) / 2**20}


def run_rank(model_dir: str, tokens: int, sp: int, out: str) -> None:
    """One rank of a measurement (run by :func:`launch`)."""
    from hf_engines.testing import join_launched_group

    torch.set_num_threads(1)
    join_launched_group()
    result = measure(model_dir, tokens, sp)
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def launch(model_dir: str, tokens: int, sp: int) -> dict[str, float]:
    """Measure at ``sp`` ranks; the largest value over the ranks."""
    from hf_engines.testing import launch_ranks

    with tempfile.TemporaryDirectory() as out:
        args = ["--rank", model_dir, str(tokens), str(sp), out]
        launch_ranks(__file__, sp, args, timeout=1200.0)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(sp)]
    return {key: max(rank[key] for rank in ranks) for key in ranks[0]}


def report(results: dict[tuple[int, int], dict[str, float]], command: str) -> str:
    """The markdown table of ``results`` by ``(tokens, sp)``."""
    lines = [
        "## Ulysses sequence parallelism: activation memory per rank",
        "",
        f"Command: `{command}`. Machine: 2 cores, loaded by parallel work (CPU, gloo).",
        f"Model: random Llama, {json.dumps(MODEL)}; one sequence per step, half response.",
        "",
        "| tokens | sp | saved activations / rank (MiB) | peak RSS delta / rank (MiB) |",
        "|---:|---:|---:|---:|",
    ]
    for (tokens, sp), value in sorted(results.items()):
        lines.append(f"| {tokens} | {sp} | {value['saved_mib']:.1f} | {value['rss_mib']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Measure every ``--tokens`` length at sp=1 and sp=2 and print (or write) the table."""
    if sys.argv[1:2] == ["--rank"]:
        run_rank(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--output", type=Path, help="markdown file to write")
    args = parser.parse_args()
    from hf_protocol.testing import save_tiny_model

    results = {}
    with tempfile.TemporaryDirectory() as root:
        model_dir = str(save_tiny_model(Path(root, "model"), {"model_type": "llama", **MODEL}))
        for tokens in args.tokens:
            for sp in (1, 2):
                results[tokens, sp] = launch(model_dir, tokens, sp)
                print(tokens, sp, results[tokens, sp], flush=True)
    text = report(results, "python " + " ".join(sys.argv))
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
