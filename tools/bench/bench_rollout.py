"""Rollout throughput: hf-rollout's native backend vs transformers ``generate`` vs vLLM (CPU).

Claim (issue #5): on the same tiny local model on this CPU, the native backend generates at
least 2x the tokens/s of transformers ``generate`` at batch 16; vLLM's CPU build is reported
side by side when it is importable.

What is measured: a tiny random Qwen2 (``hf_rollout.testing`` qwen2 with hidden 64, 2 heads of
32 (the smallest head size vLLM's CPU attention has a kernel for), 1 KV head, 2 layers, vocab
128) saved to a temporary directory; prompts of 4-12 random tokens,
left-padded; sampling at temperature 1 with no top-k / top-p and no eos, so every row
generates exactly ``--new-tokens`` tokens in every engine (generated tokens/s = rows x new
tokens / wall time of one call). Each case is run once to warm up, then ``--repeats`` times;
the table shows the median. Both engines run in this process with the same torch thread
count (``--threads``). A second table times the quickstart's call shape (128 prompts x 7 new
tokens) per call, against its budget of 0.03 s.

Usage::

    python tools/bench/bench_rollout.py [--output docs/benchmarks.md]
    /work/venvs/vllm/bin/python tools/bench/bench_rollout.py   # with vLLM in that venv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_support import machine_line, write_section
from transformers import AutoModelForCausalLM

from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.testing import build_tiny_model, make_prompts, random_prompt_ids

SECTION_KEY = "rollout_throughput"
SECTION_TITLE = "## Rollout throughput: native vs transformers generate vs vLLM (CPU)"
PAD = 0
BENCH_MODEL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}
"""Overrides of the tiny qwen2 config: head size 32, so vLLM's CPU build can run it too."""


@dataclass(frozen=True)
class Timing:
    """Median wall time of one call and the tokens it generated."""

    seconds: float
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second."""
        return self.tokens / self.seconds


def progress(message: str) -> None:
    """A progress line on stderr (stdout holds the report)."""
    print(f"[bench_rollout] {message}", file=sys.stderr, flush=True)


def time_calls(call: Callable[[], int], repeats: int) -> Timing:
    """Run ``call`` (returning its generated token count) once to warm up, then time it."""
    tokens = call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = call()
        times.append(time.perf_counter() - start)
    return Timing(statistics.median(times), tokens)


def generated_tokens(out: DataProto) -> int:
    """Response tokens a rollout generated in its output batch ``out``."""
    assert out.batch is not None, "a rollout's output carries tensors"
    return int(out.batch["response_mask"].sum())


def run_native(model_dir: Path, prompts: list[list[int]], new_tokens: int, repeats: int) -> Timing:
    """hf-rollout's native backend."""
    engine = NativeRollout(RolloutConfig(model_path=str(model_dir), pad_token_id=PAD))
    batch = make_prompts(prompts, PAD)
    # eos_token_id=-1 matches no token: every row runs the full length, as in the others.
    sampling = SamplingConfig(max_new_tokens=new_tokens, eos_token_id=-1, seed=0)

    def call() -> int:
        return generated_tokens(engine.generate(batch, sampling))

    return time_calls(call, repeats)


def run_transformers(
    model_dir: Path, prompts: list[list[int]], new_tokens: int, repeats: int
) -> Timing:
    """transformers ``generate`` with sampling, on the same left-padded prompts."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = make_prompts(prompts, PAD).batch
    assert batch is not None

    def call() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                min_new_tokens=new_tokens,
                max_new_tokens=new_tokens,
                pad_token_id=PAD,
            )
        return int(out.shape[0] * (out.shape[1] - batch["input_ids"].shape[1]))

    return time_calls(call, repeats)


# ---------------------------------------------------------------- vLLM hook (vllm helper)
_VLLM_ENGINES: dict[Path, Any] = {}
"""One vLLM engine per model directory: starting one takes ~30 s, so batch sizes share it."""


def run_vllm(model_dir: Path, prompts: list[list[int]], new_tokens: int, repeats: int) -> Timing:
    """vLLM's CPU build through hf-rollout's vLLM backend, on the same prompts and sampling.

    Temperature 1, no top-k / top-p, no stop token (every row generates ``new_tokens``), the
    full ``VLLMRollout.generate`` path (DataProto in, DataProto with log-probs out). Raises
    ``RuntimeError`` (the column then reads "n/a") when vllm is not importable here or the
    model's head size is one vLLM's CPU attention has no kernel for (it needs >= 32).
    """
    import atexit
    import json
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its log goes to stdout
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        raise RuntimeError(
            f"vllm is not importable here ({error}); make its venv with "
            "`bash tools/setup_vllm_env.sh` and run this script with that venv's python"
        ) from error
    from hf_rollout.backends.vllm import VLLMRollout

    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head_dim < 32:
        raise RuntimeError(
            f"the benchmark model's head size is {head_dim}; vLLM's CPU attention supports "
            "32, 64, 80, 96, 112, 128, 160, 192, 224, 256 and 512 (use e.g. hidden_size 64 "
            "with 2 heads)"
        )
    engine = _VLLM_ENGINES.get(model_dir)
    if engine is None:
        progress("starting vLLM (CPU build)")
        engine = VLLMRollout(
            RolloutConfig(
                backend="vllm",
                model_path=str(model_dir),
                pad_token_id=PAD,
                max_model_len=256,
                seed=0,
                engine_kwargs={"kv_cache_space_gib": 1},
            )
        )
        atexit.register(engine.shutdown)
        _VLLM_ENGINES[model_dir] = engine
    batch = make_prompts(prompts, PAD)
    # eos_token_id=-1 matches no token: every row runs the full length, as in the others.
    sampling = SamplingConfig(max_new_tokens=new_tokens, eos_token_id=-1, seed=0)

    def call() -> int:
        return generated_tokens(engine.generate(batch, sampling))

    return time_calls(call, repeats)


# ---------------------------------------------------------------- report
def measure(args: argparse.Namespace, model_dir: Path) -> tuple[list[str], list[str]]:
    """Rows of the throughput table and notes."""
    rows, notes = [], []
    vllm_problem: str | None = None
    for batch_size in args.batch_sizes:
        prompts = random_prompt_ids(batch_size, 4, 12, seed=batch_size)
        progress(f"batch {batch_size}")
        native = run_native(model_dir, prompts, args.new_tokens, args.repeats)
        hf = run_transformers(model_dir, prompts, args.new_tokens, args.repeats)
        vllm_cell = "n/a"
        if vllm_problem is None:
            try:
                vllm = run_vllm(model_dir, prompts, args.new_tokens, args.repeats)
                vllm_cell = f"{vllm.tokens_per_s:,.0f}"
            except RuntimeError as error:
                vllm_problem = str(error)
                notes.append(f"vLLM not measured: {vllm_problem}")
        rows.append(
            f"| {batch_size} | {native.tokens_per_s:,.0f} | {hf.tokens_per_s:,.0f} | "
            f"{native.tokens_per_s / hf.tokens_per_s:.2f}x | {vllm_cell} |"
        )
    return rows, notes


def quickstart_rows(args: argparse.Namespace, model_dir: Path) -> list[str]:
    """Per-call time of the quickstart's shape: 128 prompts x 7 new tokens."""
    prompts = random_prompt_ids(128, 4, 12, seed=7)
    native = run_native(model_dir, prompts, 7, args.repeats)
    hf = run_transformers(model_dir, prompts, 7, args.repeats)
    return [
        f"| native | {native.seconds * 1000:.1f} ms |",
        f"| transformers generate | {hf.seconds * 1000:.1f} ms |",
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per row")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for all engines")
    parser.add_argument("--output", type=Path, help="write the report block into this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the measurements, print the report, optionally write the docs section."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "qwen2", "qwen2", **BENCH_MODEL)
        rows, notes = measure(args, model_dir)
        quick = quickstart_rows(args, model_dir)
    machine = machine_line(["torch", "transformers", "hf_rollout", "vllm"])
    body = "\n".join(
        [
            f"Machine: {machine}; torch threads: {args.threads}. Tiny Qwen2 (hidden 64, "
            f"2 heads of 32, 1 KV head, 2 layers, vocab 128), {args.new_tokens} new tokens "
            f"per row, median of {args.repeats} calls.",
            "",
            "| batch | native tok/s | transformers generate tok/s | native / transformers "
            "| vLLM (CPU) tok/s |",
            "|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Quickstart call shape (128 prompts x 7 new tokens), time per call (budget 30 ms):",
            "",
            "| engine | per call |",
            "|---|---:|",
            *quick,
            *([""] + [f"- {note}" for note in notes] if notes else []),
        ]
    )
    print(body)
    if args.output is not None:
        write_section(args.output, SECTION_KEY, SECTION_TITLE, body)
        progress(f"wrote results to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
