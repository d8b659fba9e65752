"""The FLOP counts of bench_flops.py (pure functions) and a tiny run of the whole bench."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "tools" / "bench"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import bench_flops  # noqa: E402
from bench_flops import Shape, causal_context_sum, generation_flops, update_flops  # noqa: E402

SHAPE = Shape(n_blocks=1000, n_head=200, layers=2, d_attn=8)


def test_a_causal_token_at_position_t_attends_to_t_keys() -> None:
    assert causal_context_sum(4) == 1 + 2 + 3 + 4
    assert causal_context_sum(6, start=4) == 5 + 6
    assert causal_context_sum(0) == 0


def test_an_update_is_three_forwards_with_the_head_at_the_response_only() -> None:
    # one row, prompt 3 + response 2: 5 positions through the blocks, 2 through the head
    forward = 2 * 1000 * 5 + 2 * 200 * 2 + 4 * 2 * 8 * (1 + 2 + 3 + 4 + 5)
    assert update_flops(SHAPE, 1, 3, 2) == 3 * forward
    assert update_flops(SHAPE, 4, 3, 2) == 4 * 3 * forward
    # a trained response token costs 6 N, plus attention: the per-token headline
    no_attention = Shape(1000, 200, 0, 8)
    assert update_flops(no_attention, 1, 0, 1) == 6 * no_attention.n


def test_generation_feeds_back_every_token_but_the_last() -> None:
    # prompt 3, 2 new tokens: positions 1..4 through the blocks, the head twice
    forward = 2 * 1000 * 4 + 2 * 200 * 2 + 4 * 2 * 8 * (1 + 2 + 3 + 4)
    assert generation_flops(SHAPE, 1, 3, 2) == forward
    assert generation_flops(SHAPE, 3, 3, 2) == 3 * forward
    # a generated token costs 2 N, plus attention
    no_attention = Shape(1000, 200, 0, 8)
    assert (
        generation_flops(no_attention, 1, 1, 2) - generation_flops(no_attention, 1, 1, 1)
        == 2 * no_attention.n
    )
    assert bench_flops.gemm_flops(3) == 54


def test_n_counts_blocks_and_the_head_once_whether_tied_or_not() -> None:
    from transformers import LlamaConfig

    dims = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, vocab_size=100)  # fmt: skip
    tied = bench_flops.model_shape(LlamaConfig(**dims, tie_word_embeddings=True))
    untied = bench_flops.model_shape(LlamaConfig(**dims, tie_word_embeddings=False))
    # per layer: q, o 16x16; k, v 16x8; MLP 3 x 16x32; two norms of 16; final norm 16
    blocks = 2 * (2 * 256 + 2 * 128 + 3 * 512 + 2 * 16) + 16
    assert tied == untied == Shape(blocks, 1600, 2, 16)


def test_bf16_phases_run_only_where_the_cpu_computes_bf16() -> None:
    assert bench_flops.phases_to_run(None, frozenset({"avx2"})) == ["float32"]
    both = ["float32", "bfloat16"]
    assert bench_flops.phases_to_run(None, frozenset({"amx_bf16"})) == both
    assert bench_flops.phases_to_run(["bfloat16"], frozenset()) == ["bfloat16"]


def test_a_tiny_run_prints_the_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "flops.md"
    argv = ["--sizes", "64", "--repeats", "1", "--precisions", "float32", "--rows", "2",
            "--prompt", "4", "--response", "4", "--gen-rows", "2", "--new-tokens", "3",
            "--output", str(out)]  # fmt: skip
    assert bench_flops.main(argv) == 0
    block = out.read_text()
    assert block.startswith("`python tools/bench/bench_flops.py --sizes 64")
    assert "| float32 | " in block and "| bfloat16 | " in block
    assert "Model: tiny Llama (N = " in block
    assert block.strip() == capsys.readouterr().out.strip()
