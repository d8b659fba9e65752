"""``optim.name``: AdamW (the default) or Muon on the hidden matrices with AdamW on the rest.

In-process tests on a plain tiny Qwen2 (the parameter split, the update against torch's
``Muon`` and AdamW, the schedule, ``state_dict`` round trips, the config checks), then two
launches of optim_scenarios.py: FSDP2 at 2 ranks, then at 1 rank (which also resumes the
2-rank checkpoint and runs the Megatron engine).
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_controller import ConfigurationError
from hf_engines import EngineConfig, LoRAConfig, ModelConfig, OptimConfig, config_from_dict
from hf_engines.models import build_hf_model
from hf_engines.optim import MuonWithAdamW, build_optimizer, orthogonalize
from hf_engines.schedule import build_lr_scheduler
from hf_engines.testing import launch_ranks

SCENARIOS = Path(__file__).with_name("optim_scenarios.py")
QUIET = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore",
}
LAUNCH_TIMEOUT = 240.0
HIDDEN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _model(tiny_models: dict[str, Path], head: str = "causal_lm") -> torch.nn.Module:
    return build_hf_model(ModelConfig(path=str(tiny_models["qwen2"]), head=head))


def _names(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> list[str]:
    by_id = {id(param): name for name, param in model.named_parameters()}
    return [by_id[id(param)] for param in params]


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    """``steps`` optimizer steps on one fixed batch; the losses before each."""
    ids = torch.randint(0, 100, (4, 12), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


# ---------------------------------------------------------------------- config


def test_adamw_is_the_default(tiny_models: dict[str, Path]) -> None:
    assert OptimConfig().name == "adamw"
    optimizer = build_optimizer(_model(tiny_models), OptimConfig())
    assert type(optimizer) is torch.optim.AdamW


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"name": "sgd"}, r"optim.name='sgd' is not one of 'adamw', 'muon'"),
        ({"muon_momentum": 1.0}, r"optim.muon_momentum=1.0 must be in \[0, 1\)"),
        ({"muon_ns_steps": 0}, r"optim.muon_ns_steps=0 must be an integer in \[1, 99\]"),
    ],
)
def test_bad_values_are_refused(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        config_from_dict(OptimConfig, options)


def test_megatron_refuses_muon_with_tensor_parallel(tiny_models: dict[str, Path]) -> None:
    settings: dict[str, Any] = {
        "backend": "megatron",
        "model": {"path": str(tiny_models["qwen2"])},
        "optim": {"name": "muon"},
        "megatron": {"tensor_model_parallel_size": 2},
    }
    with pytest.raises(ConfigurationError, match="tensor_model_parallel_size=1") as error:
        config_from_dict(EngineConfig, settings)
    assert "optim.name='muon'" in str(error.value) and "optim.name='adamw'" in str(error.value)
    settings["megatron"] = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2}
    assert config_from_dict(EngineConfig, settings).optim.name == "muon"


# ---------------------------------------------------------------------- the split


def test_hidden_matrices_go_to_muon_the_rest_to_adamw(tiny_models: dict[str, Path]) -> None:
    model = _model(tiny_models)
    optimizer = build_optimizer(model, OptimConfig(name="muon"))
    assert isinstance(optimizer, MuonWithAdamW) and optimizer.adamw is not None
    muon = _names(model, optimizer.muon.param_groups[0]["params"])
    adamw = _names(model, optimizer.adamw.param_groups[0]["params"])
    layers = model.config.num_hidden_layers
    assert sorted(muon) == sorted(
        f"model.layers.{i}.{'self_attn' if p.endswith('proj') and p[0] in 'qkvo' else 'mlp'}"
        f".{p}.weight"
        for i in range(layers)
        for p in HIDDEN
    )
    # the (tied) embedding, the norms and Qwen2's q/k/v biases
    assert "model.embed_tokens.weight" in adamw and "model.norm.weight" in adamw
    assert sum(".bias" in name for name in adamw) == 3 * layers
    assert len(muon) + len(adamw) == len(list(model.parameters()))
    assert optimizer.param_groups == [*optimizer.muon.param_groups, *optimizer.adamw.param_groups]
    assert optimizer.muon.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"


def test_value_head_goes_to_adamw(tiny_models: dict[str, Path]) -> None:
    model = _model(tiny_models, head="value")
    optimizer = build_optimizer(model, OptimConfig(name="muon"))
    assert isinstance(optimizer, MuonWithAdamW) and optimizer.adamw is not None
    assert "score.weight" in _names(model, optimizer.adamw.param_groups[0]["params"])


def test_lora_adapters_go_to_muon(tiny_models: dict[str, Path]) -> None:
    from hf_engines.lora import apply_lora

    model = _model(tiny_models)
    apply_lora(model, LoRAConfig(rank=4, target_modules=("q_proj", "v_proj")))
    optimizer = build_optimizer(model, OptimConfig(name="muon", lr=1e-3))
    assert isinstance(optimizer, MuonWithAdamW) and optimizer.adamw is None
    names = _names(model, optimizer.muon.param_groups[0]["params"])
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    losses = _train(model, optimizer, 5)
    assert losses[-1] < losses[0], losses


# ---------------------------------------------------------------------- the update


def test_update_equals_torch_muon_on_plain_tensors() -> None:
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(24, 10, generator=generator)
    grads = [torch.randn(24, 10, generator=generator) for _ in range(3)]
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    config = OptimConfig(name="muon", lr=0.05, weight_decay=0.1, muon_ns_steps=4)
    mine = MuonWithAdamW([ours], [], config, {}).muon
    reference = torch.optim.Muon(
        [theirs], lr=0.05, weight_decay=0.1, ns_steps=4, adjust_lr_fn="match_rms_adamw"
    )
    for grad in grads:
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        mine.step()
        reference.step()
    assert torch.equal(ours, theirs)


def test_orthogonalized_update_has_unit_singular_values() -> None:
    grad = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    singular = torch.linalg.svdvals(orthogonalize(grad, (3.4445, -4.7750, 2.0315), 5, 1e-7).float())
    assert singular.min() > 0.5 and singular.max() < 1.5, singular


def test_muon_steps_the_matrices_adamw_the_rest(tiny_models: dict[str, Path]) -> None:
    """One step from the same weights and gradients: the hidden matrices move differently
    from AdamW's step, every other parameter exactly as AdamW moves it."""
    adamw_model, muon_model = _model(tiny_models), _model(tiny_models)
    _train(adamw_model, build_optimizer(adamw_model, OptimConfig(lr=1e-2)), 1)
    _train(muon_model, build_optimizer(muon_model, OptimConfig(name="muon", lr=1e-2)), 1)
    adamw_params = dict(adamw_model.named_parameters())
    for name, param in muon_model.named_parameters():
        hidden = name.endswith(tuple(f"{p}.weight" for p in HIDDEN))
        assert torch.equal(param, adamw_params[name]) != hidden, name


def test_loss_decreases_with_muon(tiny_models: dict[str, Path]) -> None:
    model = _model(tiny_models)
    losses = _train(model, build_optimizer(model, OptimConfig(name="muon", lr=1e-2)), 6)
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < losses[0] - 0.5, losses


def test_schedule_sets_every_group(tiny_models: dict[str, Path]) -> None:
    model = _model(tiny_models)
    optimizer = build_optimizer(model, OptimConfig(name="muon", lr=1e-2))
    assert isinstance(optimizer, MuonWithAdamW) and optimizer.adamw is not None
    scheduler = build_lr_scheduler(optimizer, warmup_steps=4)
    for step in range(3):
        expected = 1e-2 * (step + 1) / 4
        for part in (optimizer.muon, optimizer.adamw):
            assert part.param_groups[0]["lr"] == pytest.approx(expected)
        _train(model, optimizer, 1)
        scheduler.step()


def test_state_dict_round_trip_resumes_identically(tiny_models: dict[str, Path]) -> None:
    config = OptimConfig(name="muon", lr=1e-2)
    model = _model(tiny_models)
    optimizer = build_optimizer(model, config)
    _train(model, optimizer, 2)
    saved_model = copy.deepcopy(model.state_dict())
    saved_optim = copy.deepcopy(optimizer.state_dict())
    assert len(saved_optim["state"]) == len(list(model.parameters()))
    expected = _train(model, optimizer, 2)

    resumed = _model(tiny_models)
    resumed.load_state_dict(saved_model)
    resumed_optim = build_optimizer(resumed, config)
    resumed_optim.load_state_dict(saved_optim)
    assert isinstance(resumed_optim, MuonWithAdamW) and resumed_optim.adamw is not None
    # the parts step the loaded groups and state, not the ones loading replaced
    assert resumed_optim.muon.param_groups[0] is resumed_optim.param_groups[0]
    assert resumed_optim.adamw.state is resumed_optim.state
    assert _train(resumed, resumed_optim, 2) == expected
    for (name, a), b in zip(model.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------------- engines


def _launch(parts: str, world_size: int, model: Path, out: Path, *extra: str) -> list[Any]:
    out.mkdir(parents=True)
    args = [parts, str(model), str(out), *extra]
    launch_ranks(SCENARIOS, world_size, args, LAUNCH_TIMEOUT, QUIET)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def _has_megatron() -> bool:
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def runs(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """FSDP2 + LoRA at 2 ranks, then at 1 rank (resuming the 2-rank checkpoint too) with
    the Megatron engine (tensor parallel 1) where megatron-core is installed."""
    root = tmp_path_factory.mktemp("muon-runs")
    model = tiny_models["qwen2"]
    two = _launch("exact,fsdp,lora", 2, model, root / "two")
    ckpt = str(root / "two" / "fsdp" / "ckpt")
    parts = "fsdp,lora,megatron" if _has_megatron() else "fsdp,lora"
    one = _launch(parts, 1, model, root / "one", ckpt)
    return {"two": two, "one": one}


def test_sharded_step_equals_the_full_matrix_step(runs: dict[str, Any]) -> None:
    """On DTensor shards (uneven, tall, wide) the update is the full tensors' bit for bit;
    torch's Muon run on the shards is not (its bfloat16 matmuls go through DTensor)."""
    for rank in runs["two"]:
        assert rank["exact"]["exact"] == [True, True, True]
    assert max(runs["two"][0]["exact"]["torch_max_diff"]) > 0


def test_fsdp_two_ranks_match_one_rank(runs: dict[str, Any]) -> None:
    """Losses as tightly as AdamW's (test_fsdp_engine.py); weights within 2e-3: the ranks'
    gradients differ in float32 rounding, and Muon's bfloat16 Newton-Schulz iteration
    amplifies that in a matrix's small singular directions."""
    two, one = runs["two"][0]["fsdp"], runs["one"][0]["fsdp"]
    assert two["muon_names"] == one["muon_names"] and len(one["muon_names"]) == 2 * len(HIDDEN)
    torch.testing.assert_close(
        torch.tensor(two["losses"]), torch.tensor(one["losses"]), atol=1e-4, rtol=0
    )
    assert two["losses"][-1] < two["losses"][0], two["losses"]
    for name, tensor in one["params"].items():
        torch.testing.assert_close(two["params"][name], tensor, atol=2e-3, rtol=0, msg=name)


@pytest.mark.parametrize("world", ["one", "two"])
def test_fsdp_checkpoint_resumes_exactly(runs: dict[str, Any], world: str) -> None:
    for rank in runs[world]:
        assert rank["fsdp"]["resumed_losses"] == rank["fsdp"]["losses"][1:]


def test_fsdp_checkpoint_resumes_on_another_number_of_ranks(runs: dict[str, Any]) -> None:
    torch.testing.assert_close(
        torch.tensor(runs["one"][0]["fsdp"]["cross_resumed_losses"]),
        torch.tensor(runs["two"][0]["fsdp"]["losses"][1:]),
        atol=1e-4,
        rtol=0,
    )


def test_fsdp_lora_trains_the_adapters_with_muon(runs: dict[str, Any]) -> None:
    two, one = runs["two"][0]["lora"], runs["one"][0]["lora"]
    assert not two["has_adamw"] and len(two["muon_names"]) == 8
    assert all(".lora_A." in n or ".lora_B." in n for n in two["muon_names"])
    torch.testing.assert_close(
        torch.tensor(two["losses"]), torch.tensor(one["losses"]), atol=1e-4, rtol=0
    )


def test_megatron_trains_and_resumes_with_muon(runs: dict[str, Any]) -> None:
    if "megatron" not in runs["one"][0]:
        pytest.skip("needs the megatron extra (megatron-core)")
    result = runs["one"][0]["megatron"]
    assert len(result["muon_names"]) == 8  # linear_qkv, linear_proj, linear_fc1/2 per layer
    assert all(name.startswith("decoder.layers.") for name in result["muon_names"])
    assert result["losses"][-1] < result["losses"][0], result["losses"]
    assert result["resumed_losses"] == result["losses"][1:]
