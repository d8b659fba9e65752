"""Multi-turn episodes: prefix reuse (each turn prefills only its new tokens) vs re-prefill.

Claim (issue #16): with ``RolloutConfig.prefix_cache_rows`` on, the native engine extends the
cached conversation each turn instead of prefilling it whole, so a 5-turn episode batch takes
less time, and the samples are the same.

What is measured: ``hf_rollout.multiturn.run_agent_loop`` over ``--episodes`` episodes
(one per prompt, ``n=1``) of ``--turns`` turns each, on a random-weight Qwen2 built locally
(``--hidden``, ``--layers``; vocab 128, one character per token). Every turn the model samples
exactly ``--new-tokens`` tokens (temperature 1, no stop token) and a fixed environment replies
with ``--reply-tokens`` tokens; prompts are random ids of ``--prompt-tokens`` (one row per
value: a short task, and a long system prompt / tool list as agents send). Both columns run
in this process on the same engine settings, one engine each; the kept cache is cleared
before every episode batch, so no batch reuses another's. A column's figure is the median
wall time of ``--repeats`` episode batches (after one warm-up), repeats round-robin over the
columns. "prefilled" counts the prompt tokens each column ran a prefill forward over;
"cache" is the kept cache's size after the last turn (its largest point: one entry per
episode). The two columns' samples are compared token for token.

Usage (from the repository root, dev venv)::

    python tools/bench/bench_multiturn.py [--output docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from bench_support import machine_line, write_section

from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.multiturn import AgentLoopConfig, StepResult, run_agent_loop
from hf_rollout.testing import build_tiny_model, make_prompts, random_prompt_ids

SECTION_KEY = "multiturn_prefix_reuse"
SECTION_TITLE = "## Multi-turn episodes: prefix reuse vs re-prefill (native, CPU)"
PAD = 0
COLUMNS = {"re-prefill": 0, "prefix reuse": 1}
"""Column name -> ``prefix_cache_rows`` per episode (0: off)."""


class CharCodec:
    """One token per character, ids below 128 (the model's vocabulary)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return [ord(char) % 128 for char in text]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``."""
        return "".join(chr(i) for i in ids)


class FixedReplyEnvironment:
    """Replies ``width`` characters every turn and never ends an episode itself."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.turn = 0

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        """Start an episode."""
        self.turn = 0

    def step(self, model_text: str) -> StepResult:
        """A ``width``-character tool reply; the loop's ``max_turns`` ends the episode."""
        self.turn += 1
        return StepResult(("<tool " + str(self.turn) + ">" + "x" * self.width)[: self.width])


@dataclass
class Column:
    """One contender at one prompt length, and what its repeats measured."""

    name: str
    engine: NativeRollout
    seconds: list[float] = field(default_factory=list)
    prefilled: int = 0
    cache_bytes: int = 0
    responses: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None


def run_episodes(column: Column, prompts: DataProto, args: argparse.Namespace) -> float:
    """One episode batch on ``column``'s engine; returns its wall time in seconds."""
    cache = column.engine.prefix_cache
    if cache is not None:
        cache.clear()
        before = cache.prompt_tokens - cache.hit_tokens
    # eos_token_id=-1 matches no token: every turn samples exactly --new-tokens tokens.
    sampling = SamplingConfig(max_new_tokens=args.new_tokens, eos_token_id=-1, seed=0)
    loop = AgentLoopConfig(max_turns=args.turns, max_response_tokens=10_000)
    start = time.perf_counter()
    out = run_agent_loop(
        column.engine, prompts, lambda: FixedReplyEnvironment(args.reply_tokens),
        CharCodec(), sampling, loop,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    assert out.batch is not None
    column.responses = out.batch["responses"]
    column.log_probs = out.batch["rollout_log_probs"]
    rows, prompt = len(out), args_prompt_tokens(prompts)
    if cache is not None:
        column.prefilled = cache.prompt_tokens - cache.hit_tokens - before
        column.cache_bytes = cache.nbytes
    else:  # every turn prefills the prompt and the whole conversation so far
        per_turn = args.new_tokens + args.reply_tokens
        column.prefilled = rows * sum(prompt + turn * per_turn for turn in range(args.turns))
    return seconds


def args_prompt_tokens(prompts: DataProto) -> int:
    """Real tokens of the first prompt (all prompts of a row have the same length)."""
    assert prompts.batch is not None
    return int(prompts.batch["attention_mask"][0].sum())


def measure(model: Path, prompt_tokens: int, args: argparse.Namespace) -> list[Column]:
    """Both columns at one prompt length, ``--repeats`` times each, round-robin."""
    prompts = make_prompts(
        random_prompt_ids(args.episodes, prompt_tokens, prompt_tokens, seed=prompt_tokens), PAD
    )
    columns = []
    for name, rows_per_episode in COLUMNS.items():
        config = RolloutConfig(
            model_path=str(model),
            pad_token_id=PAD,
            max_model_len=4096,
            prefix_cache_rows=rows_per_episode * args.episodes,
        )
        columns.append(Column(name, NativeRollout(config)))
    for column in columns:
        run_episodes(column, prompts, args)  # warm-up
    for _ in range(args.repeats):
        for column in columns:
            column.seconds.append(run_episodes(column, prompts, args))
    return columns


def report(results: dict[int, list[Column]], args: argparse.Namespace) -> str:
    """The markdown table: median seconds per episode batch, speed-up, prefill and cache."""
    lines = [
        "| prompt tokens | re-prefill (s) | prefix reuse (s) | speed-up | tokens prefilled "
        "(re-prefill / reuse) | kept cache | same samples | max log-prob diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for prompt_tokens, (full, reused) in results.items():
        full_s, reused_s = statistics.median(full.seconds), statistics.median(reused.seconds)
        assert full.responses is not None and reused.responses is not None
        assert full.log_probs is not None and reused.log_probs is not None
        same = torch.equal(full.responses, reused.responses)
        drift = float((full.log_probs - reused.log_probs).abs().max())
        lines.append(
            f"| {prompt_tokens} | {full_s:.3f} | {reused_s:.3f} | {full_s / reused_s:.2f}x | "
            f"{full.prefilled} / {reused.prefilled} | {reused.cache_bytes / 2**20:.2f} MiB | "
            f"{'yes' if same else 'NO'} | {drift:.1e} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=30, help="sampled per turn")
    parser.add_argument("--reply-tokens", type=int, default=20, help="environment reply")
    parser.add_argument("--prompt-tokens", default="64,512", help="comma-separated lengths")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--output", type=Path, help="write the block into this markdown file")
    parser.add_argument("--section", default=SECTION_KEY)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Measure both columns at every prompt length, print the table, optionally write it."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(
            Path(tmp) / "model", "qwen2", hidden_size=args.hidden,
            intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
            num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=1,
        )  # fmt: skip
        results = {
            length: measure(model, length, args)
            for length in (int(v) for v in args.prompt_tokens.split(","))
        }
    command = " ".join(
        ["python tools/bench/bench_multiturn.py", shlex.join(argv or sys.argv[1:])]
    ).strip()
    body = (
        f"`{command}`; measured on {machine_line(['torch', 'transformers'])}; torch threads "
        f"{args.threads}; load average (1 min) {load_before[0]:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after. {args.episodes} episodes x {args.turns} turns, "
        f"{args.new_tokens} sampled + {args.reply_tokens} tool tokens per turn, random Qwen2 "
        f"(hidden {args.hidden}, {args.layers} layers, 1 KV head, fp32); median of "
        f"{args.repeats} episode batches.\n\n" + report(results, args)
    )
    print(body)
    if args.output is not None:
        write_section(args.output, args.section, SECTION_TITLE, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
