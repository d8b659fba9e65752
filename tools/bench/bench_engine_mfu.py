"""Training tokens/s and MFU of the FSDP2 engine on one CUDA GPU, vs plain transformers loops.

The model is Qwen2.5-0.5B-sized (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate
4864, vocab 151936, tied embeddings), randomly initialised from its config (no download).
Contenders, each training its own copy on the same batch with the same loss (token-mean
NLL of the response tokens), AdamW and gradient clipping at 1.0, one micro-batch size:

- **engine**: ``FSDPEngine.train_step`` at 1 rank on an NCCL group: fp32 master weights,
  FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``;
- **engine + checkpointing**: the same with ``fsdp.activation_checkpointing``;
- **engine, no reshard**: the same with ``fsdp.reshard_after_forward=False``;
- **engine, gradients reduced every micro-batch**: ``fsdp.gradient_sync`` before it
  defaulted, at ``dp_shard`` 1, to one reduction after the last micro-batch;
- **engine, fused AdamW / 4 blocks per unit / one unit (``blocks_per_unit=0``) without
  resharding, with and without fused AdamW**: the host-overhead variants
  (``optim.fused``, ``fsdp.blocks_per_unit``, ``fsdp.reshard_after_forward``);
- **MegatronEngine, TP=1, bf16**: ``MegatronEngine.train_step`` at 1 rank with
  ``model.dtype=bfloat16`` (megatron-core's local layers, parameters and AdamW state in bf16, as
  the plain pure-bf16 loop below), so the GPU run times the engine the trainers use for
  ``backend: megatron`` next to FSDP2 (stage ``megatron_mfu`` of tools/gpu/run_stages.py);
- **plain autocast**: ``AutoModelForCausalLM`` in fp32 + ``torch.autocast(bfloat16)`` +
  ``torch.optim.AdamW`` (the same fp32-master mixed precision, written by hand);
- **plain bf16**: the model and AdamW state entirely in bf16 (no fp32 master copy).

FLOPs per token are ``6 * N`` with ``N`` the unique parameter count: the tied embedding
matrix is counted once, as the LM head's matmul (the embedding lookup costs no FLOPs);
the attention-score FLOPs (``12 * layers * hidden * seq`` per token, PaLM's convention)
are reported in a second MFU column. MFU divides by ``--peak-tflops`` (default 989.4,
the H100 SXM dense bf16 peak); the bf16 matmul rate measured on this GPU is printed too.

Run from the repository root on a CUDA machine (needs hf-protocol and hf-engines
importable)::

    python tools/bench/bench_engine_mfu.py --json results.json

``--device cpu --layers 2 --hidden 64 ...`` runs the same code small on a CPU (gloo) to
check it; MFU is then not reported. A narrow, deep model with several micro-batches on the
CPU is a stand-in for the GPU's launch-bound step, where host work decides the time
(docs/benchmarks.md, "FSDP2 host overhead on the CPU")::

    python tools/bench/bench_engine_mfu.py --device cpu --hidden 64 --layers 24 --heads 2 \
        --kv-heads 1 --intermediate 128 --vocab 1024 --rows 8 --micro-batch 2 --prompt 8 \
        --response 24 --steps 10
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from hf_engines import (
    EngineConfig,
    FSDPEngine,
    LossOutput,
    ModelOutputs,
    config_from_dict,
    mini_batch_total,
)
from hf_engines.micro_batch import batch_tensors
from hf_engines.workers import init_distributed
from hf_protocol import DataProto

StepFn = Callable[[], float]


@dataclass
class Result:
    """One contender's timings (seconds per optimizer step, median over timed steps)."""

    name: str
    step_s: float
    tokens_per_s: float
    mfu_6n: float | None
    mfu_with_attention: float | None
    first_loss: float
    last_loss: float
    peak_memory_gib: float | None


def qwen_config(args: argparse.Namespace) -> dict[str, Any]:
    """The Hugging Face config dict of the benchmarked model."""
    return {
        "model_type": "qwen2",
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "intermediate_size": args.intermediate,
        "vocab_size": args.vocab,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    }


def param_count(config: PretrainedConfig) -> tuple[int, int]:
    """(unique parameters, embedding parameters) of the model, built on the meta device."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())  # tied weights are yielded once
    return total, model.get_input_embeddings().weight.numel()


def make_batch(args: argparse.Namespace) -> DataProto:
    """``--rows`` full rows (no padding): a ``--prompt``-token prompt and a response."""
    generator = torch.Generator().manual_seed(0)
    length = args.prompt + args.response
    ids = torch.randint(1, args.vocab, (args.rows, length), generator=generator)
    mask = torch.ones_like(ids)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": torch.arange(length).expand(args.rows, length).clone(),
            "responses": ids[:, args.prompt :].clone(),
            "response_mask": torch.ones(args.rows, args.response, dtype=torch.int64),
        },
        meta_info={"temperature": 1.0},
    )


def nll_loss(outputs: ModelOutputs, micro_batch: DataProto) -> LossOutput:
    """This micro-batch's share of the mini-batch's token-mean NLL of the responses."""
    mask = batch_tensors(micro_batch)["response_mask"].to(outputs["log_probs"].device).float()
    tokens = mini_batch_total(micro_batch, "tokens", mask.sum())
    loss = -(outputs["log_probs"] * mask).sum() / tokens
    return loss, {}


def engine_step(
    args: argparse.Namespace,
    batch: DataProto,
    fsdp: dict[str, Any] | None = None,
    optim: dict[str, Any] | None = None,
) -> StepFn:
    """A step function over a fresh FSDPEngine (bf16 params, fp32 reduce and master);
    ``fsdp`` and ``optim`` override its ``fsdp.*`` and ``optim.*`` settings."""
    config = config_from_dict(
        EngineConfig,
        {
            "model": {"hf_config": qwen_config(args), "seed": 0},
            "optim": {"lr": 1e-5, "grad_clip": 1.0, **(optim or {})},
            "micro_batch": {"micro_batch_size": args.micro_batch},
            "fsdp": {
                "device": args.device,
                "param_dtype": "bfloat16",
                "reduce_dtype": "float32",
                **(fsdp or {}),
            },
        },
    )
    engine = FSDPEngine(config)
    return lambda: engine.train_step(batch, nll_loss)["loss"]


def megatron_step(args: argparse.Namespace, batch: DataProto) -> StepFn:
    """A step function over a fresh MegatronEngine at TP=PP=1, parameters in bf16."""
    from hf_engines.megatron import MegatronEngine

    config = config_from_dict(
        EngineConfig,
        {
            "backend": "megatron",
            "model": {"hf_config": qwen_config(args), "seed": 0, "dtype": "bfloat16"},
            "optim": {"lr": 1e-5, "grad_clip": 1.0},
            "micro_batch": {"micro_batch_size": args.micro_batch},
            "megatron": {"device": args.device, "layer_spec": "local"},
        },
    )
    engine = MegatronEngine(config)
    return lambda: engine.train_step(batch, nll_loss)["loss"]


def plain_step(args: argparse.Namespace, batch: DataProto, pure_bf16: bool) -> StepFn:
    """A step function of a hand-written transformers + torch.optim.AdamW loop."""
    device = torch.device(args.device)
    config = AutoConfig.for_model(**qwen_config(args))
    torch.manual_seed(0)
    dtype = torch.bfloat16 if pure_bf16 else torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    source = batch_tensors(batch)
    names = list(source.keys())  # iterating a TensorDict yields rows, not keys
    tensors = {key: torch.as_tensor(source[key]).to(device) for key in names}
    rows, response = tensors["responses"].shape
    micro = args.micro_batch
    autocast = not pure_bf16  # bf16 autocast runs on CPUs too

    def step() -> float:
        total = 0.0
        for start in range(0, rows, micro):
            part = {key: value[start : start + micro] for key, value in tensors.items()}
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                logits = model(
                    input_ids=part["input_ids"],
                    attention_mask=part["attention_mask"],
                    position_ids=part["position_ids"],
                    use_cache=False,
                    logits_to_keep=response + 1,
                ).logits[:, :-1]
            log_probs = torch.log_softmax(logits.float(), dim=-1)
            token = log_probs.gather(-1, part["responses"].unsqueeze(-1)).squeeze(-1)
            mask = part["response_mask"].float()
            loss = -(token * mask).sum() / mask.sum()
            (loss * (part["responses"].shape[0] / rows)).backward()
            total += float(loss.detach()) * part["responses"].shape[0] / rows
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    return step


def synchronize(device: str) -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def measure(
    name: str, make: Callable[[], StepFn], args: argparse.Namespace, flops_per_token: tuple
) -> Result:
    """Build one contender, warm it up, time ``--steps`` steps and free it."""
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step = make()
    losses = [step() for _ in range(args.warmup)]
    times = []
    for _ in range(args.steps):
        synchronize(args.device)
        start = time.perf_counter()
        losses.append(step())
        synchronize(args.device)
        times.append(time.perf_counter() - start)
    if args.profile:
        profile_step(name, step, args.device)
    step_s = statistics.median(times)
    tokens = args.rows * (args.prompt + args.response)
    rate = tokens / step_s
    peak = args.peak_tflops * 1e12 if args.device == "cuda" else None
    memory = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    del step
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return Result(
        name=name,
        step_s=step_s,
        tokens_per_s=rate,
        mfu_6n=None if peak is None else flops_per_token[0] * rate / peak,
        mfu_with_attention=None if peak is None else flops_per_token[1] * rate / peak,
        first_loss=losses[0],
        last_loss=losses[-1],
        peak_memory_gib=memory,
    )


def profile_step(name: str, step: StepFn, device: str) -> None:
    """Print the 15 operators with the most self time over one step (``--profile``)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step()
        synchronize(device)
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(f"--- profile of one step: {name}")
    print(prof.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=60))


def matmul_tflops() -> float:
    """bf16 TFLOP/s of an 8192^3 matrix product on this GPU (mean of 10 after 3 warm-ups)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 10 / (time.perf_counter() - start) / 1e12


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options (defaults: Qwen2.5-0.5B shape, 32 rows of 1024 tokens)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--rows", type=int, default=32, help="rows per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
    parser.add_argument("--response", type=int, default=960, help="response tokens per row")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 peak")
    parser.add_argument(
        "--only", nargs="*", help="run only the contenders whose names contain one of these"
    )
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--profile", action="store_true", help="print a profile of one step")
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    """Run every contender and print a markdown table."""
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark needs one (or pass --device cpu)")
    init_distributed(0, 1, 0, device=args.device)
    config = AutoConfig.for_model(**qwen_config(args))
    params, embedding = param_count(config)
    seq = args.prompt + args.response
    flops = (6 * params, 6 * params + 12 * args.layers * args.hidden * seq)
    batch = make_batch(args)
    one_unit = {"blocks_per_unit": 0, "reshard_after_forward": False}
    engine_variants: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "FSDPEngine (bf16 mixed precision)": ({}, {}),
        "FSDPEngine, gradients reduced every micro-batch": (
            {"gradient_sync": "every_micro_batch"},
            {},
        ),
        "FSDPEngine + activation checkpointing": ({"activation_checkpointing": True}, {}),
        "FSDPEngine, reshard_after_forward=False": ({"reshard_after_forward": False}, {}),
        "FSDPEngine, fused AdamW": ({}, {"fused": True}),
        "FSDPEngine, 4 blocks per unit": ({"blocks_per_unit": 4}, {}),
        "FSDPEngine, one unit, no reshard": (one_unit, {}),
        "FSDPEngine, one unit, no reshard, fused AdamW": (one_unit, {"fused": True}),
    }
    contenders: dict[str, Callable[[], StepFn]] = {
        name: functools.partial(engine_step, args, batch, fsdp, optim)
        for name, (fsdp, optim) in engine_variants.items()
    }
    contenders["MegatronEngine, TP=1, bf16"] = lambda: megatron_step(args, batch)
    contenders["plain transformers, fp32 + autocast bf16"] = lambda: plain_step(args, batch, False)
    contenders["plain transformers, pure bf16"] = lambda: plain_step(args, batch, True)
    chosen = {
        name: make
        for name, make in contenders.items()
        if not args.only or any(part.lower() in name.lower() for part in args.only)
    }
    results = [measure(name, make, args, flops) for name, make in chosen.items()]
    info = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "matmul_tflops": matmul_tflops() if args.device == "cuda" else None,
        "params": params,
        "embedding_params": embedding,
        "tokens_per_step": args.rows * seq,
        "args": vars(args),
    }
    print(json.dumps(info))
    print(
        "| contender | s / step | tokens/s | MFU (6N) | MFU (6N + attn) | loss 1st -> last "
        "| peak GiB |"
    )
    print("|---|---:|---:|---:|---:|---|---:|")
    for r in results:
        mfu = "-" if r.mfu_6n is None else f"{100 * r.mfu_6n:.1f}%"
        mfu_attn = "-" if r.mfu_with_attention is None else f"{100 * r.mfu_with_attention:.1f}%"
        memory = "-" if r.peak_memory_gib is None else f"{r.peak_memory_gib:.1f}"
        print(
            f"| {r.name} | {r.step_s:.3f} | {r.tokens_per_s:,.0f} | {mfu} | {mfu_attn} | "
            f"{r.first_loss:.4f} -> {r.last_loss:.4f} | {memory} |"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"info": info, "results": [asdict(r) for r in results]}, handle, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
