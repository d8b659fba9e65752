"""``hybridflow serve`` driven by the official ``tinker`` SDK (0.38), on a tiny local model.

The SDK is the client nobody here wrote: it speaks the wire protocol (protobuf
forward/backward, futures polled through ``retrieve_future``, sessions and heartbeats)
and these tests only call its public API. The server runs on a background thread of this
process with the local backend (the worker groups in process), so a test takes seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

tinker = pytest.importorskip("tinker", reason="needs the serve extra (the tinker SDK)")
from tinker import types  # noqa: E402

from hf_algos.serve.server import running_server  # noqa: E402

from .serve_helpers import serve_config  # noqa: E402

pytestmark = pytest.mark.timeout(600)

API_KEY = "tml-hybridflow-test"
SEQUENCE = [5, 17, 29, 41, 53, 65, 77, 89, 101, 113]
"""The 'document' the SL loop memorises (token ids of the tiny model's vocabulary)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[str]:
    root = tmp_path_factory.mktemp("serve")
    config = serve_config(
        tiny_model_dir,
        root / "state",
        "actor.engine.micro_batch.micro_batch_size=8",
        "serve.poll_wait_s=2",
        "serve.max_models=8",
    )
    with running_server(config) as url:
        yield url
    # the in-process workers' process group ended with the server: later tests can start one
    assert not torch.distributed.is_initialized()


@pytest.fixture(scope="module")
def client(server: str, tiny_model_dir: Path) -> Iterator[Any]:
    service = tinker.ServiceClient(base_url=server, api_key=API_KEY)
    yield service
    service.close("success").result()


@pytest.fixture(scope="module")
def trainer(client: Any, tiny_model_dir: Path) -> Any:
    return client.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()


def datum(tokens: list[int]) -> Any:
    """A next-token datum over ``tokens`` (every position weighted 1)."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def test_the_sdk_learns_a_sequence_and_samples_it(trainer: Any, tiny_model_dir: Path) -> None:
    info = trainer.get_info()
    assert info.model_data.tokenizer_id == str(tiny_model_dir.resolve())
    losses = []
    # lr 1e-2: the loss falls smoothly (44.8 -> 0.05 in 40 steps). At 3e-2 it oscillated,
    # and on another CPU's float rounding it stopped at 7.0 or memorised a wrong token.
    for _ in range(40):
        result = trainer.forward_backward([datum(SEQUENCE)], "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        losses.append(result.metrics["loss:sum"])
        (output,) = result.loss_fn_outputs
        logprobs = output["logprobs"].tolist()
        assert len(logprobs) == len(SEQUENCE) - 1
        assert math.isclose(-sum(logprobs), losses[-1], rel_tol=1e-4)
    assert losses[-1] < 0.1 * losses[0], losses
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(SEQUENCE[:3])
    params = types.SamplingParams(max_tokens=len(SEQUENCE) - 3, temperature=0.0)
    (sequence,) = sampler.sample(prompt, 1, params).result().sequences
    assert sequence.tokens == SEQUENCE[3:]
    assert len(sequence.logprobs) == len(sequence.tokens)
    assert all(lp <= 0 for lp in sequence.logprobs)


def test_forward_is_the_log_probs_without_a_step(trainer: Any) -> None:
    first = trainer.forward([datum(SEQUENCE)], "cross_entropy").result()
    again = trainer.forward([datum(SEQUENCE)], "cross_entropy").result()
    assert first.metrics["loss:sum"] == pytest.approx(again.metrics["loss:sum"], abs=1e-6)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo"])
def test_the_rl_losses_return_log_probs_and_a_loss(trainer: Any, loss_fn: str) -> None:
    tokens = SEQUENCE[:6]
    forward = trainer.forward([datum(tokens)], "cross_entropy").result()
    current = forward.loss_fn_outputs[0]["logprobs"].tolist()
    rl = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": current,  # the sampler's: ratio 1
            "advantages": [1.0] * (len(tokens) - 1),
        },
    )
    result = trainer.forward_backward([rl], loss_fn).result()
    trainer.optim_step(types.AdamParams(learning_rate=0.0)).result()
    # ratio 1, advantage 1: importance_sampling and ppo are -sum(1), cispo -sum(logprobs)
    expected = -sum(current) if loss_fn == "cispo" else -(len(tokens) - 1.0)
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)


def test_prompt_log_probs_are_the_forward_log_probs(trainer: Any) -> None:
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = SEQUENCE[:5]
    logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    forward = trainer.forward([datum(prompt)], "cross_entropy").result()
    assert logprobs[0] is None
    assert logprobs[1:] == pytest.approx(forward.loss_fn_outputs[0]["logprobs"].tolist(), abs=1e-5)


def test_state_saves_and_restores(trainer: Any) -> None:
    saved = trainer.save_state("before").result()
    assert saved.path.endswith("/weights/before")
    before = trainer.forward([datum(SEQUENCE)], "cross_entropy").result().metrics["loss:sum"]
    trainer.forward_backward([datum(SEQUENCE[::-1])], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    moved = trainer.forward([datum(SEQUENCE)], "cross_entropy").result().metrics["loss:sum"]
    assert moved != pytest.approx(before, abs=1e-4)
    trainer.load_state(saved.path).result()
    restored = trainer.forward([datum(SEQUENCE)], "cross_entropy").result().metrics["loss:sum"]
    assert restored == pytest.approx(before, abs=1e-5)


def test_a_new_client_starts_from_a_saved_state(client: Any, trainer: Any) -> None:
    """``create_training_client_from_state[_with_optimizer]``: a new client of the same
    kind, with the saved weights (and optimizer state, or a fresh optimizer)."""
    saved = trainer.save_state("for-new-clients").result()
    want = trainer.forward([datum(SEQUENCE)], "cross_entropy").result().metrics["loss:sum"]
    for with_optimizer in (True, False):
        create = (
            client.create_training_client_from_state_with_optimizer
            if with_optimizer
            else client.create_training_client_from_state
        )
        restored = create(saved.path).result()
        assert not restored.get_info().is_lora
        got = restored.forward([datum(SEQUENCE)], "cross_entropy").result().metrics["loss:sum"]
        assert got == pytest.approx(want, abs=1e-5)
        restored.forward_backward([datum(SEQUENCE)], "cross_entropy").result()
        step = restored.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        assert math.isfinite(step.metrics["optim/grad_norm:mean"])


def test_a_named_sampler_path_makes_a_sampling_client(client: Any, trainer: Any) -> None:
    path = trainer.save_weights_for_sampler("named").result().path
    assert path.startswith("tinker://") and path.endswith("/sampler_weights/named")
    sampler = client.create_sampling_client(model_path=path).result()
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    result = sampler.sample(types.ModelInput.from_ints(SEQUENCE[:2]), 3, params).result()
    assert len(result.sequences) == 3
    assert all(0 < len(s.tokens) <= 4 for s in result.sequences)


def test_a_bad_loss_is_an_error_naming_it(server: str, tiny_model_dir: Path) -> None:
    service = tinker.ServiceClient(base_url=server, api_key=API_KEY)
    try:
        model = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()
        bad = types.Datum(
            model_input=types.ModelInput.from_ints([1, 2, 3]),
            loss_fn_inputs={"target_tokens": [2, 3, 4]},  # cross_entropy also needs weights
        )
        with pytest.raises(Exception, match="weights"):
            model.forward_backward([bad], "cross_entropy").result()
    finally:
        service.close("success").result()


def test_a_lora_client_trains_its_adapters(client: Any, tiny_model_dir: Path) -> None:
    lora = client.create_lora_training_client(base_model=str(tiny_model_dir), rank=4).result()
    info = lora.get_info()
    assert info.is_lora and info.lora_rank == 4
    losses = []
    for _ in range(10):
        result = lora.forward_backward([datum(SEQUENCE)], "cross_entropy").result()
        lora.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        losses.append(result.metrics["loss:sum"])
    assert losses[-1] < losses[0] - 1.0, losses  # the adapters moved the model
    # the sampler gets the adapters merged: its greedy token's log-prob is the trainer's
    sampler = lora.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=1, temperature=0.0)
    prompt = types.ModelInput.from_ints(SEQUENCE[:1])
    (sequence,) = sampler.sample(prompt, 1, params).result().sequences
    scored = lora.forward([datum([SEQUENCE[0], *sequence.tokens])], "cross_entropy").result()
    trainer_logprob = scored.loss_fn_outputs[0]["logprobs"].tolist()[0]
    assert sequence.logprobs[0] == pytest.approx(trainer_logprob, abs=1e-4)
