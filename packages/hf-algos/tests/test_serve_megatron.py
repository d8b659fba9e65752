"""A ``hybridflow serve`` training client on the Megatron engine, driven by the tinker SDK:
its first ``forward_backward`` has plain transformers' summed loss and gradient norm, and
the client learns. (The FSDP engine's client is covered by test_serve_sdk.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")
tinker = pytest.importorskip("tinker", reason="needs the serve extra (the tinker SDK)")
from tinker import types  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from hf_algos.serve.server import running_server  # noqa: E402

from .serve_helpers import serve_config  # noqa: E402

pytestmark = [pytest.mark.second_lane, pytest.mark.timeout(600)]

SEQUENCE = [5, 17, 29, 41, 53, 65, 77, 89, 101, 113]


def reference(model_dir: Path) -> tuple[float, float]:
    """Plain transformers: the summed next-token NLL of SEQUENCE and its gradient norm."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([SEQUENCE])
    log_probs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    loss = -log_probs.gather(-1, ids[0, 1:, None]).sum()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return float(loss), float(torch.nn.utils.get_total_norm(grads))


def test_a_megatron_client_matches_transformers_and_learns(
    ray_session: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = serve_config(
        tiny_model_dir,
        tmp_path,
        "actor.engine.backend=megatron",
        "actor.engine.fsdp.param_dtype=float32",
        "trainer.backend=ray",
    )
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(SEQUENCE[:-1]),
        loss_fn_inputs={"target_tokens": SEQUENCE[1:], "weights": [1.0] * (len(SEQUENCE) - 1)},
    )
    loss, grad_norm = reference(tiny_model_dir)
    with running_server(config) as url:
        service = tinker.ServiceClient(base_url=url, api_key="tml-test")
        trainer = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=0)
        trainer = trainer.result()
        losses = []
        for step in range(12):
            result = trainer.forward_backward([datum], "cross_entropy").result()
            optim = trainer.optim_step(types.AdamParams(learning_rate=3e-2)).result()
            losses.append(result.metrics["loss:sum"])
            if step == 0:
                assert losses[0] == pytest.approx(loss, rel=1e-5)
                assert optim.metrics["optim/grad_norm:mean"] == pytest.approx(grad_norm, rel=1e-4)
        service.close("success").result()
    assert losses[-1] < 0.5 * losses[0], losses
