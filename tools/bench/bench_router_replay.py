"""Router replay (R3): the rollout-vs-actor log-prob gap on the same samples, with and
without replaying the rollout's expert choices in the actor's forward.

A tiny random Qwen3-MoE (4 experts, top-2, 2 layers, ``hf_rollout.testing``'s wide
initialisation) samples responses with the native rollout, which records each token's
experts (``routed_experts``). The actor (plain transformers, float32) then scores the same
samples twice: routing by its own router, and replaying the recorded routing
(``hf_protocol.routing.replay_routing``). Mismatch sources, each a row:

* ``none``: both float32, same weights (only decode-vs-full-forward numerics differ);
* ``bf16 rollout``: the rollout runs in bfloat16, the actor in float32, same weights;
* ``router drift s``: the actor's router weights get Gaussian noise of ``s`` times their
  standard deviation (a stand-in for an optimizer step between rollout and update, as in
  off-policy or asynchronous training); the rollout runs in float32;
* both together.

Reported per row: the mean and max ``|actor - rollout|`` log-prob over response tokens, and
the share of (token, layer) expert choices that differ from the recorded ones. With
``--megatron`` the same actor weights are also scored by the Megatron engine (one gloo rank
in this process, ``compute_log_prob`` with and without ``routed_experts``), a second table
(no flipped-choice columns: megatron's routers are not recorded). Run from the repository
root::

    .venv/bin/python tools/bench/bench_router_replay.py --output /tmp/router_replay.md
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from hf_protocol import DataProto, fields
from hf_protocol.routing import ROUTED_EXPERTS, RoutingRecorder, replay_routing
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.testing import build_tiny_model, make_prompts, random_prompt_ids


def rollout(model: Path, dtype: str, prompts: int, n: int, tokens: int) -> DataProto:
    """Sampled responses with their rollout log-probs and recorded routing."""
    engine = NativeRollout(RolloutConfig(model_path=str(model), dtype=dtype, max_model_len=128))
    batch = make_prompts(random_prompt_ids(prompts, seed=1))
    return engine.generate(batch, SamplingConfig(n=n, max_new_tokens=tokens, seed=3))


def actor_model(model: Path, drift: float) -> torch.nn.Module:
    """The float32 actor, its router weights nudged by ``drift`` x their std."""
    actor = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.add_(torch.randn(param.shape, generator=generator) * param.std() * drift)
    return actor


def score(actor: torch.nn.Module, batch: DataProto, replay: bool) -> dict[str, float]:
    """Gap statistics of one actor forward over the rollout's samples."""
    tensors = batch.batch
    assert tensors is not None
    routed = tensors[ROUTED_EXPERTS]
    recorder = RoutingRecorder(actor)
    inputs = {
        "input_ids": tensors[fields.INPUT_IDS],
        "attention_mask": tensors[fields.ATTENTION_MASK],
        "position_ids": tensors[fields.POSITION_IDS],
    }
    with torch.no_grad():
        if replay:
            with replay_routing(actor, routed):
                logits = actor(**inputs).logits
        else:
            logits = actor(**inputs).logits
    used = recorder.pop().reshape(routed.shape)
    recorder.close()
    responses = tensors[fields.RESPONSES]
    log_probs = torch.log_softmax(logits[:, -responses.shape[1] - 1 : -1].float(), dim=-1)
    log_probs = log_probs.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    known = (routed >= 0).all(dim=-1)
    flipped = (used.sort(dim=-1).values != routed.sort(dim=-1).values).any(dim=-1)
    return {**gap(log_probs, batch), "flipped": float(flipped[known].float().mean())}


def gap(log_probs: torch.Tensor, batch: DataProto) -> dict[str, float]:
    """Mean and max ``|log_probs - rollout log-probs|`` over the response tokens."""
    tensors = batch.batch
    assert tensors is not None
    mask = tensors[fields.RESPONSE_MASK].bool()
    difference = (log_probs - tensors[fields.ROLLOUT_LOG_PROBS])[mask].abs()
    return {"mean": float(difference.mean()), "max": float(difference.max())}


def megatron_score(actor: torch.nn.Module, batch: DataProto) -> tuple[dict[str, float], ...]:
    """Gap statistics of the Megatron engine (one rank, float32) holding ``actor``'s
    weights: routing by its own routers, then replaying the recorded routing."""
    from hf_engines import EngineConfig, MicroBatchConfig, ModelConfig
    from hf_engines.megatron import MegatronEngine

    tensors = batch.batch
    assert tensors is not None
    plain = DataProto(
        batch=tensors.exclude(ROUTED_EXPERTS),
        non_tensor_batch=dict(batch.non_tensor_batch),
        meta_info=dict(batch.meta_info),
    )
    assert isinstance(actor, PreTrainedModel), "the actor is a transformers model"
    with tempfile.TemporaryDirectory() as directory:
        actor.save_pretrained(directory)
        engine = MegatronEngine(
            EngineConfig(
                backend="megatron",
                model=ModelConfig(path=directory),
                micro_batch=MicroBatchConfig(micro_batch_size=32),
            )
        )
        own, _ = engine.compute_log_prob(plain)
        replayed, _ = engine.compute_log_prob(batch)
    return gap(own, batch), gap(replayed, batch)


def main() -> None:
    """Run every mismatch source and print (or write) a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--megatron", action="store_true", help="also score with Megatron")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_tiny_model(Path(tempfile.mkdtemp()) / "moe", "qwen3_moe")
    cases = [("none (float32 both)", "float32", 0.0), ("bf16 rollout", "bfloat16", 0.0)]
    cases += [(f"router drift {s}", "float32", s) for s in (0.01, 0.05, 0.2)]
    cases += [("bf16 rollout + router drift 0.05", "bfloat16", 0.05)]
    batches = {dtype: rollout(model, dtype, args.prompts, args.n, args.tokens) for dtype in
               ("float32", "bfloat16")}  # fmt: skip
    reference = batches["float32"].batch
    assert reference is not None
    tokens = int(reference[fields.RESPONSE_MASK].sum())
    lines = [
        f"Tiny Qwen3-MoE (4 experts, top-2, 2 layers), {args.prompts} prompts x {args.n} "
        f"samples x <= {args.tokens} tokens ({tokens} response tokens in float32).",
        "",
        "| mismatch source | mean gap, own routing | mean gap, replay | max gap, own | "
        "max gap, replay | choices flipped, own | flipped, replay |",
        "|---|---|---|---|---|---|---|",
    ]
    megatron = ["", "Megatron engine actor (1 rank, float32), the same samples and weights:", ""]
    megatron += ["| mismatch source | mean gap, own routing | mean gap, replay | max gap, own | "
                 "max gap, replay |", "|---|---|---|---|---|"]  # fmt: skip
    if args.megatron:
        torch.distributed.init_process_group(
            "gloo", store=torch.distributed.HashStore(), rank=0, world_size=1
        )
    for label, dtype, drift in cases:
        actor = actor_model(model, drift)
        own, replayed = score(actor, batches[dtype], False), score(actor, batches[dtype], True)
        lines.append(
            f"| {label} | {own['mean']:.2e} | {replayed['mean']:.2e} | {own['max']:.2e} | "
            f"{replayed['max']:.2e} | {own['flipped']:.2%} | {replayed['flipped']:.2%} |"
        )
        if args.megatron:
            own, replayed = megatron_score(actor, batches[dtype])
            megatron.append(
                f"| {label} | {own['mean']:.2e} | {replayed['mean']:.2e} | {own['max']:.2e} | "
                f"{replayed['max']:.2e} |"
            )
    text = "\n".join(lines + (megatron if args.megatron else [])) + "\n"
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
