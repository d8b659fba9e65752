"""The Megatron engine's weight stream (``iter_full_params``) from TP / PP shards.

With tensor parallelism 2 and pipeline parallelism 2 (2 gloo ranks on the CPU) the stream
yields exactly the Hugging Face state dict of the one-rank model, in its order, and no rank
ever holds more than about one decoder layer of gathered tensors: the stream is what the
weight sync pushes to the rollout, and it must not put the whole model on one rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")

from transformers import AutoModelForCausalLM

from hf_engines.testing import launch_ranks
from hf_protocol.testing import save_tiny_model, tiny_decoder_config

pytestmark = pytest.mark.second_lane

SCENARIO = Path(__file__).with_name("megatron_stream_scenarios.py")
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
LAYERS = 6  # enough layers that one layer is a small part of the model


def stream(model_dir: Path, out: Path, tp: int, pp: int) -> list[dict]:
    """Run the scenario on 2 ranks; every rank's result."""
    out.mkdir()
    launch_ranks(SCENARIO, 2, [str(model_dir), str(out), str(tp), str(pp)], 240.0, QUIET)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def live_bound(state: dict[str, torch.Tensor], tied: bool) -> int:
    """Bytes of yielded tensors a per-layer stream may still hold: one decoder layer (its
    HF tensors are converted together) or the largest other tensor and, when ``lm_head`` is
    tied, the embedding kept to be yielded again as ``lm_head``. (Its megatron-layout
    buffer of the layer being converted, at most one more layer, is not counted.)"""
    layers: dict[str, int] = {}
    for name, tensor in state.items():
        if name.startswith("model.layers."):
            layer = name.split(".")[2]
            layers[layer] = layers.get(layer, 0) + tensor.nbytes
    largest = max(t.nbytes for t in state.values())
    embedding = state["model.embed_tokens.weight"].nbytes if tied else 0
    return max(max(layers.values()), largest) + embedding


def broadcast_slack(state: dict[str, torch.Tensor], pp: int) -> int:
    """Bytes a finished collective may still hold for a moment after the caller resumed.

    Along the pipeline a tensor is handed on as the buffer ``dist.broadcast`` wrote, and
    gloo's worker threads (2 by default) drop their reference to a finished collective's
    buffers only after waking the caller; on a loaded machine the stream may be a few
    tensors further before they do. (Tensor-parallel tensors are new tensors: ``torch.cat``
    of the gathered shards, or a local copy when not split.)
    """
    return 2 * max(t.nbytes for t in state.values()) if pp > 1 else 0


@pytest.mark.parametrize(
    ("family", "tp", "pp"), [("llama", 2, 1), ("llama", 1, 2), ("qwen2", 2, 1)]
)
def test_stream_is_the_hf_state_dict_gathered_per_layer(
    family: str, tp: int, pp: int, tmp_path: Path
) -> None:
    config = tiny_decoder_config(family, num_hidden_layers=LAYERS)
    model_dir = save_tiny_model(tmp_path / family, config)
    reference = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    ranks = stream(model_dir, tmp_path / "out", tp, pp)

    assert ranks[0]["names"] == list(reference)  # every name once, in the HF order
    assert ranks[1]["names"] == list(reference)
    for name, tensor in reference.items():
        assert torch.equal(ranks[0]["params"][name], tensor), name

    tied = bool(config.get("tie_word_embeddings", False))
    total = sum(t.nbytes for n, t in reference.items() if not (tied and n == "lm_head.weight"))
    bound = live_bound(reference, tied) + broadcast_slack(reference, pp)
    assert bound < total / 2  # the bound means something: far below the whole model
    for rank in ranks:
        assert 0 < rank["peak_live_bytes"] <= bound, (rank["peak_live_bytes"], bound, total)
