"""Helpers for tests, benchmarks and examples: tiny local models and prompt batches.

Nothing here touches a model hub: models are built from a config with random weights.
The weights are initialised wider than transformers' default (``initializer_range=0.2``)
so that greedy decoding of a tiny model does not just repeat one token, which would make
"same output" checks weak.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from hf_controller.worker import master_address
from hf_protocol import DataProto, fields, left_pad
from hf_protocol.testing import save_tiny_model, tiny_decoder_config

_WIDE_INIT: dict[str, Any] = {"initializer_range": 0.2}
"""Overrides of every family (see the module docstring for why)."""
_FAMILY_OVERRIDES: dict[str, dict[str, Any]] = {"qwen3": {"head_dim": 16}}
"""Per-family overrides of :data:`hf_protocol.testing.TINY_DECODER_CONFIGS`."""


def tiny_model_config(family: str = "qwen2", **overrides: Any) -> dict[str, Any]:
    """The config dict of a tiny ``family`` model.

    ``family`` is a key of :data:`hf_protocol.testing.TINY_DECODER_CONFIGS`; this package's
    overrides (wider initialisation; ``head_dim`` 16 for qwen3) apply, then ``overrides``.
    """
    return tiny_decoder_config(
        family, **{**_WIDE_INIT, **_FAMILY_OVERRIDES.get(family, {}), **overrides}
    )


def build_tiny_model(
    directory: str | os.PathLike[str], family: str = "qwen2", seed: int = 0, **overrides: Any
) -> Path:
    """Save a randomly initialised tiny ``family`` causal LM to ``directory``; return it.

    The same seed gives the same weights; ``overrides`` change config fields.
    """
    return save_tiny_model(directory, tiny_model_config(family, **overrides), seed)


def random_prompt_ids(
    batch_size: int,
    min_length: int = 2,
    max_length: int = 8,
    vocab_size: int = 128,
    low: int = 3,
    seed: int = 0,
) -> list[list[int]]:
    """``batch_size`` token lists of random length in ``[min_length, max_length]``.

    Ids are drawn from ``[low, vocab_size)`` so small ids stay free for pad / eos / stop.
    """
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_length, max_length + 1, (batch_size,), generator=generator)
    return [
        torch.randint(low, vocab_size, (int(n),), generator=generator).tolist() for n in lengths
    ]


def make_prompts(token_lists: list[list[int]], pad_token_id: int = 0) -> DataProto:
    """A prompt batch: left-padded ``input_ids``, ``attention_mask``, ``position_ids``."""
    input_ids, attention_mask, position_ids = left_pad(token_lists, pad_token_id)
    return DataProto.from_dict(
        tensors={
            fields.INPUT_IDS: input_ids,
            fields.ATTENTION_MASK: attention_mask,
            fields.POSITION_IDS: position_ids,
        }
    )


def run_ranks(
    target: Callable[..., None],
    world: int,
    *args: Any,
    timeout_s: float = 90.0,
    ctx: Any = None,
) -> dict[int, Any]:
    """Run ``target(rank, world, port, results, *args)`` in ``world`` spawned processes.

    ``port`` is a free port on loopback for a ``torch.distributed`` rendezvous; each rank
    puts ``(rank, payload, error)`` on ``results`` (``error`` a traceback string or None).
    Returns ``{rank: payload}``; a rank that reports an error fails the caller with its
    traceback. ``ctx`` is the ``spawn`` context, to pass when ``args`` hold its Events.
    """
    ctx = ctx or mp.get_context("spawn")
    results = ctx.Queue()
    _, port = master_address()
    procs = [
        ctx.Process(target=target, args=(rank, world, port, results, *args))
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    out: dict[int, Any] = {}
    try:
        for _ in procs:
            rank, payload, error = results.get(timeout=timeout_s)
            if error is not None:
                raise AssertionError(f"rank {rank} of {world} failed:\n{error}")
            out[rank] = payload
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():  # a rank stuck after another failed: do not orphan it
                proc.kill()
    return out
