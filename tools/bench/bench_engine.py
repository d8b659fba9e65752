"""Training tokens/s of the FSDP2 engine at 1 rank vs a plain transformers + torch.optim loop.

Both train the same randomly initialised Llama-style model (saved once, loaded by both)
on the same padded batch, with the same loss (token-mean negative log-likelihood of the
response tokens), AdamW and gradient clipping at 1.0. One optimizer step is one
forward + backward over the whole batch (the engine gets one micro-batch of all rows).

- **plain**: ``AutoModelForCausalLM`` + ``torch.optim.AdamW``; the forward asks for the
  logits of the response positions only (``logits_to_keep``), as the engine does, so the
  comparison is about the engine, not about that trick.
- **engine (padding off)**: ``FSDPEngine.train_step`` on a 1-rank gloo group, running the
  padded batch like the plain loop does.
- **engine (trim)** / **engine (pack)**: the same with ``model.remove_padding`` set, so the
  padding columns (trim) or all padding tokens (pack) are skipped.

Tokens/s counts the real (attention-mask) tokens of the batch, the same for every
contender. Both wall-clock time and the CPU time of this process are measured; with one
torch thread (the default) CPU time is what the step costs whatever else the machine
runs, so it is the fairer number on a shared machine. After ``--warmup`` untimed steps
each, ``--steps`` timed steps run in rounds: every round steps each contender once, in a
shuffled order, so drift spreads over all of them; medians are reported. Each contender
trains its own copy of the model; the first-step losses show they compute the same thing.

Run from the repository root::

    python tools/bench/bench_engine.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, cast

import torch
import torch.distributed as dist
from bench_support import machine_line, write_section
from transformers import AutoConfig, AutoModelForCausalLM

from hf_engines import EngineConfig, FSDPEngine, LossOutput, ModelOutputs, mini_batch_total
from hf_engines.config import MicroBatchConfig, ModelConfig, OptimConfig
from hf_engines.micro_batch import batch_tensors
from hf_engines.testing import make_toy_batch
from hf_protocol import DataProto

LR = 1e-4
RemovePadding = Literal["auto", "pack", "trim", "off"]


def nll_loss(outputs: ModelOutputs, micro_batch: DataProto) -> LossOutput:
    """This micro-batch's share of the token-mean NLL of the mini-batch's response tokens."""
    mask = batch_tensors(micro_batch)["response_mask"].float()
    tokens = mini_batch_total(micro_batch, "tokens", mask.sum())
    loss = -(outputs["log_probs"] * mask).sum() / tokens
    return loss, {}


@dataclass
class Contender:
    """One way of training: a step function and its measured step times."""

    name: str
    step: Callable[[], float]
    times: list[float] = field(default_factory=list)
    """Wall-clock seconds per step."""
    cpu_times: list[float] = field(default_factory=list)
    """CPU seconds this process spent per step (robust to other load on the machine)."""
    first_loss: float = float("nan")


def build_model(directory: Path, hidden: int, layers: int, vocab: int) -> Path:
    """Save a random Llama-style model (fixed seed) for every contender to load."""
    config = AutoConfig.for_model(
        "llama",
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 8 * 8,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        vocab_size=vocab,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    return directory


def plain_contender(model_dir: Path, batch: DataProto) -> Contender:
    """A plain single-process transformers + torch.optim training step."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    tensors = batch_tensors(batch)
    responses, mask = tensors["responses"], tensors["response_mask"].float()
    length = responses.shape[1]

    def step() -> float:
        logits = model(
            input_ids=tensors["input_ids"],
            attention_mask=tensors["attention_mask"],
            position_ids=tensors["position_ids"],
            use_cache=False,
            logits_to_keep=length + 1,
        ).logits[:, :-1]
        log_probs = torch.log_softmax(logits.float(), -1).gather(-1, responses.unsqueeze(-1))
        loss = -(log_probs.squeeze(-1) * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return Contender("plain transformers + AdamW", step)


def engine_contender(config: EngineConfig, batch: DataProto, mode: str) -> Contender:
    """``FSDPEngine.train_step`` with ``model.remove_padding=mode``."""
    # The config checks the choice (and names the valid ones) when it is built.
    remove_padding = cast(RemovePadding, mode)
    engine = FSDPEngine(replace(config, model=replace(config.model, remove_padding=remove_padding)))

    def step() -> float:
        return engine.train_step(batch, nll_loss)["loss"]

    return Contender(f"FSDPEngine, 1 rank (padding {mode})", step)


def measure(contenders: list[Contender], warmup: int, steps: int, seed: int) -> None:
    """Warm up, then time ``steps`` steps of each contender in shuffled rounds."""
    for contender in contenders:
        contender.first_loss = contender.step()
        for _ in range(warmup - 1):
            contender.step()
    order = random.Random(seed)
    for _ in range(steps):
        shuffled = list(contenders)
        order.shuffle(shuffled)
        for contender in shuffled:
            start, cpu_start = time.perf_counter(), time.process_time()
            contender.step()
            contender.cpu_times.append(time.process_time() - cpu_start)
            contender.times.append(time.perf_counter() - start)


def report(contenders: list[Contender], tokens: int, padded: int, args: argparse.Namespace) -> str:
    """The markdown block for docs/benchmarks.md."""
    plain = statistics.median(contenders[0].times)
    plain_cpu = statistics.median(contenders[0].cpu_times)
    lines = [
        f"Machine: {machine_line(['torch', 'transformers'])}; torch threads: {args.threads}.",
        f"Model: Llama-style, hidden {args.hidden}, {args.layers} layers, vocab {args.vocab} "
        f"(random weights). Batch: {args.batch} rows, prompts up to {args.prompt} and "
        f"responses up to {args.response} tokens: {tokens} real tokens in {padded} padded "
        f"positions. {args.steps} timed steps each (after {args.warmup} warm-up), medians.",
        "",
        "| contender | CPU s / step | tokens / CPU s | CPU time vs plain | wall s / step "
        "| tokens/s (wall) | wall vs plain | first-step loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for contender in contenders:
        wall, cpu = statistics.median(contender.times), statistics.median(contender.cpu_times)
        lines.append(
            f"| {contender.name} | {cpu:.3f} | {tokens / cpu:,.0f} | {cpu / plain_cpu:.2f}x | "
            f"{wall:.3f} | {tokens / wall:,.0f} | {wall / plain:.2f}x | "
            f"{contender.first_loss:.5f} |"
        )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    """Command-line options (defaults are what docs/benchmarks.md shows)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=192)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default="off,trim,pack")
    parser.add_argument("--output", type=Path, help="markdown file to write the results into")
    return parser.parse_args()


def main() -> None:
    """Build the model and batch, run the contenders, print (and write) the table."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    batch = make_toy_batch(args.batch, args.prompt, args.response, args.vocab, seed=1)
    tokens = int(batch_tensors(batch)["attention_mask"].sum())
    padded = batch_tensors(batch)["attention_mask"].numel()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", args.hidden, args.layers, args.vocab)
        config = EngineConfig(
            model=ModelConfig(path=str(model_dir)),
            optim=OptimConfig(lr=LR, weight_decay=0.01, grad_clip=1.0),
            micro_batch=MicroBatchConfig(micro_batch_size=args.batch),
        )
        contenders = [plain_contender(model_dir, batch)]
        contenders += [engine_contender(config, batch, m) for m in args.modes.split(",")]
        measure(contenders, args.warmup, args.steps, seed=0)
    body = report(contenders, tokens, padded, args)
    print(body)
    if args.output is not None:
        title = "## Training throughput: FSDP2 engine vs a plain transformers loop"
        write_section(args.output, "engine_throughput", title, body)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
