"""``train_step`` split into ``forward_backward`` + ``optim_step`` (a Tinker-style client
accumulates gradients over several calls, then steps with its own AdamW values).

FSDP2 in this process on one gloo rank (tiny Qwen2); the Megatron engine on one launched
gloo rank (split_scenarios.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from hf_engines import (
    EngineConfig,
    FSDPConfig,
    FSDPEngine,
    MicroBatchConfig,
    ModelConfig,
    OptimConfig,
    OptimHyper,
)
from hf_engines.models import build_hf_model
from hf_engines.testing import launch_ranks, make_toy_batch, toy_nll_loss, toy_sum_nll_loss

SCENARIOS = Path(__file__).with_name("split_scenarios.py")
QUIET = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore",
}
TOLERANCE = 1e-6
# eps well above the gradients' rounding: Adam's first steps divide a gradient by its own
# size, so a rounding difference in a near-zero gradient would move its weight by ~lr.
OPTIM = OptimConfig(lr=1e-3, eps=1e-4, warmup_steps=2)


def _config(tiny_models: dict[str, Path], gradient_sync: str = "auto") -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(path=str(tiny_models["qwen2"])),
        optim=OPTIM,
        micro_batch=MicroBatchConfig(micro_batch_size=2),
        fsdp=FSDPConfig(gradient_sync=gradient_sync),  # type: ignore[arg-type]
    )


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def _weights(engine: FSDPEngine) -> dict[str, torch.Tensor]:
    return {name: _full(param) for name, param in engine.model.named_parameters()}


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, atol=atol, rtol=0, msg=name)


def test_train_step_is_forward_backward_then_optim_step(
    tiny_models: dict[str, Path], one_rank: None
) -> None:
    config = _config(tiny_models)
    whole, split = FSDPEngine(config), FSDPEngine(config)
    for step in range(2):
        batch = make_toy_batch(8, seed=10 + step)
        want = whole.train_step(batch, toy_nll_loss)
        got = split.forward_backward(batch, toy_nll_loss)
        assert set(got) == {"loss", "nll"}
        got.update(split.optim_step())
        assert got == want
    assert split.global_step == whole.global_step == 2
    _assert_same(_weights(split), _weights(whole), atol=0.0)


@pytest.mark.parametrize("gradient_sync", ["every_micro_batch", "last_micro_batch"])
def test_forward_backward_calls_accumulate(
    tiny_models: dict[str, Path], one_rank: None, gradient_sync: str
) -> None:
    """Halves of a batch, then one step, equal the whole batch (a summed loss)."""
    config = _config(tiny_models, gradient_sync)
    whole, split = FSDPEngine(config), FSDPEngine(config)
    batch = make_toy_batch(8, seed=3)
    want = whole.forward_backward(batch, toy_sum_nll_loss)
    want.update(whole.optim_step())
    losses = [split.forward_backward(half, toy_sum_nll_loss)["loss"] for half in batch.chunk(2)]
    got = split.optim_step()
    assert sum(losses) == pytest.approx(want["loss"], rel=1e-6)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    assert got["lr"] == want["lr"]
    _assert_same(_weights(split), _weights(whole), atol=TOLERANCE)


def test_optim_step_with_hyper_is_torch_adamw(tiny_models: dict[str, Path], one_rank: None) -> None:
    """The given values, decoupled weight decay, no clipping (``grad_clip_norm`` 0) and no
    schedule, as ``torch.optim.AdamW`` on a plain copy fed the engine's gradients."""
    config = _config(tiny_models)
    config = replace(config, optim=replace(OPTIM, grad_clip=1e-3))  # ignored with hyper
    engine = FSDPEngine(config)
    plain = build_hf_model(config.model)
    hyper = OptimHyper(learning_rate=3e-3, beta1=0.8, beta2=0.9, eps=1e-4, weight_decay=0.1)
    reference = torch.optim.AdamW(
        plain.parameters(), lr=3e-3, betas=(0.8, 0.9), eps=1e-4, weight_decay=0.1
    )
    params = dict(plain.named_parameters())
    for step in range(2):
        engine.forward_backward(make_toy_batch(8, seed=20 + step), toy_sum_nll_loss)
        for name, param in engine.model.named_parameters():
            assert param.grad is not None, name
            params[name].grad = _full(param.grad)
        result = engine.optim_step(hyper)
        reference.step()
        reference.zero_grad(set_to_none=True)
        assert result["lr"] == 3e-3
        assert result["grad_norm"] > 1e-3  # clipping would have changed the step
    want = {name: param.detach() for name, param in plain.named_parameters()}
    _assert_same(_weights(engine), want, atol=TOLERANCE)
    group = engine.optimizer.param_groups[0]  # the configured values are back
    assert group["betas"] == OPTIM.betas and group["eps"] == OPTIM.eps


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("learning_rate", -1.0, ">= 0"),
        ("beta1", 1.0, "in [0, 1)"),
        ("beta2", -0.1, "in [0, 1)"),
        ("eps", 0.0, "> 0"),
        ("weight_decay", -0.5, ">= 0"),
        ("grad_clip_norm", float("nan"), ">= 0"),
    ],
)
def test_optim_hyper_names_the_bad_value(field: str, value: float, rule: str) -> None:
    values = {"learning_rate": 1e-4, field: value}
    with pytest.raises(ValueError) as error:
        OptimHyper(**values)
    message = str(error.value)
    assert f"OptimHyper.{field}={value!r}" in message and rule in message, message
    assert OptimHyper(learning_rate=0.0).max_grad_norm is None


@pytest.mark.second_lane
@pytest.mark.timeout(600)
def test_megatron_forward_backward_calls_accumulate(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Two ``forward_backward`` calls on halves + ``optim_step`` equal one ``train_step``
    over the whole batch (a summed loss), on the Megatron engine."""
    pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")
    launch_ranks(SCENARIOS, 1, [str(tiny_models["qwen2"]), str(tmp_path)], 300.0, QUIET)
    result = torch.load(tmp_path / "rank0.pt", weights_only=False)
    _assert_same(result["split"], result["whole"], atol=TOLERANCE)
    assert sum(result["half_losses"]) == pytest.approx(result["whole_metrics"]["loss"], rel=1e-6)
    assert result["step"]["grad_norm"] == pytest.approx(
        result["whole_metrics"]["grad_norm"], rel=1e-6
    )
    assert result["global_step"] == 1


def test_reset_optimizer_makes_the_next_step_a_fresh_optimizers(
    tiny_models: dict[str, Path], one_rank: None
) -> None:
    """After ``reset_optimizer`` a step equals the first step of a new engine on the same
    weights: AdamW's moments and step count are forgotten (the steps take their values
    from ``OptimHyper``, so the LR schedule's position does not matter)."""
    config = _config(tiny_models)
    hyper = OptimHyper(learning_rate=1e-3, eps=1e-4)
    trained, fresh = FSDPEngine(config), FSDPEngine(config)
    batch = make_toy_batch(8, seed=5)
    trained.forward_backward(batch, toy_sum_nll_loss)
    trained.optim_step(hyper)
    trained.reset_optimizer()
    assert not trained.optimizer.state
    with torch.no_grad():
        for mine, theirs in zip(fresh.model.parameters(), trained.model.parameters(), strict=True):
            mine.copy_(theirs)
    for engine in (trained, fresh):
        engine.forward_backward(batch, toy_sum_nll_loss)
        engine.optim_step(hyper)
    _assert_same(_weights(trained), _weights(fresh), atol=TOLERANCE)
