"""The training optimizer of both engines: AdamW, or Muon on the hidden matrices with AdamW.

:func:`build_optimizer` reads :class:`~hf_engines.config.OptimConfig`. With
``optim.name='adamw'`` it returns a plain ``torch.optim.AdamW`` over every trainable
parameter (what the engines always built). With ``optim.name='muon'`` it returns a
:class:`MuonWithAdamW`: the 2-D weight matrices inside the transformer blocks (attention
and MLP projections, or the LoRA adapters of a LoRA run) are stepped by
:class:`FullMatrixMuon` (torch's ``Muon`` update), everything else (embeddings, output or
value head, norms, biases) by AdamW with the configured settings.

:class:`MuonWithAdamW` is one ``torch.optim.Optimizer`` whose ``param_groups`` and
``state`` are those of its two parts, so the LR scheduler, ``zero_grad``, gradient clipping,
``state_dict`` / ``load_state_dict`` and DCP's ``get_state_dict`` / ``set_state_dict`` see
every parameter as with a single optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

# torch's own Muon math (torch.optim._muon): the Newton-Schulz orthogonalization and the
# per-shape learning-rate adjustment, reused so the update is exactly torch's.
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz
from torch.optim.optimizer import StateDict

from hf_controller import ConfigurationError
from hf_engines.config import OptimConfig

MUON_ADJUST_LR = "match_rms_adamw"
"""torch ``Muon``'s ``adjust_lr_fn``: scales each matrix's step by 0.2 x sqrt(max(rows,
cols)) so the update's RMS matches AdamW's, and the same ``lr`` and schedule suit both."""


def build_optimizer(
    model: torch.nn.Module,
    config: OptimConfig,
    blocks: Iterable[torch.nn.Module] | None = None,
    foreach: bool | None = None,
    params: Sequence[torch.nn.Parameter] | None = None,
) -> torch.optim.Optimizer:
    """The optimizer ``config`` names, over the trainable parameters of ``model``.

    ``params`` narrows it to those parameters (a distributed optimizer's share).

    ``blocks`` are the transformer blocks whose 2-D parameters Muon steps (default: the
    Hugging Face model's own, :func:`hf_engines.models.transformer_blocks`); unused with
    ``adamw``. ``foreach`` is AdamW's option (``None``: torch's choice) unless
    ``config.fused`` asks for the fused kernel.
    """
    if params is None:
        params = [param for param in model.parameters() if param.requires_grad]
    adamw_options: dict[str, Any] = {
        "betas": config.betas,
        "eps": config.eps,
        **({"fused": True} if config.fused else {"foreach": foreach}),
    }
    if config.name == "adamw":
        return torch.optim.AdamW(
            params, lr=config.lr, weight_decay=config.weight_decay, **adamw_options
        )
    if blocks is None:
        from hf_engines.models import transformer_blocks

        blocks = transformer_blocks(model)  # type: ignore[arg-type]
    muon_params, adamw_params = split_parameters(params, blocks)
    if not muon_params:
        raise ConfigurationError(
            "optim.name='muon' found no trainable 2-D weight matrix inside the model's "
            "transformer blocks for Muon to step; use optim.name='adamw'"
        )
    return MuonWithAdamW(muon_params, adamw_params, config, adamw_options)


@dataclass(frozen=True)
class OptimHyper:
    """AdamW hyper-parameters for one optimizer step, given per call (Tinker's
    ``AdamParams``); an engine's ``optim_step(hyper)`` uses them instead of
    ``optim.*`` and the LR schedule for that step."""

    learning_rate: float
    """The step's learning rate (the LR schedule is not consulted)."""
    beta1: float = 0.9
    """AdamW's first-moment decay."""
    beta2: float = 0.95
    """AdamW's second-moment decay."""
    eps: float = 1e-12
    """AdamW's denominator epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW's: each weight shrinks by ``lr * weight_decay``)."""
    grad_clip_norm: float = 0.0
    """Clip the global gradient norm to this value; 0: no clipping."""

    def __post_init__(self) -> None:
        _check_hyper("learning_rate", self.learning_rate, ">= 0", self.learning_rate >= 0)
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            _check_hyper(name, value, "in [0, 1)", 0 <= value < 1)
        _check_hyper("eps", self.eps, "> 0", self.eps > 0)
        _check_hyper("weight_decay", self.weight_decay, ">= 0", self.weight_decay >= 0)
        _check_hyper("grad_clip_norm", self.grad_clip_norm, ">= 0", self.grad_clip_norm >= 0)

    @property
    def max_grad_norm(self) -> float | None:
        """The clipping threshold, ``None`` for no clipping (``grad_clip_norm`` 0)."""
        return self.grad_clip_norm or None


def _check_hyper(name: str, value: float, rule: str, valid: bool) -> None:
    """Raise a ``ValueError`` naming ``name``, ``value`` and ``rule`` unless ``valid``
    (a NaN fails every rule)."""
    if not valid:
        raise ValueError(
            f"OptimHyper.{name}={value!r} is invalid; it must be {rule}: pass a finite "
            f"{name} {rule}"
        )


_HYPER_KEYS = ("lr", "betas", "eps", "weight_decay")


@contextmanager
def hyper_params(optimizer: torch.optim.Optimizer, hyper: OptimHyper | None) -> Iterator[None]:
    """Within the block every param group of ``optimizer`` (AdamW) has ``hyper``'s values;
    afterwards the groups' own ``betas``, ``eps``, ``weight_decay`` and ``lr`` are back, so a
    later step without ``hyper`` is the configured one. ``None``: nothing changes."""
    if hyper is None:
        yield
        return
    if any("betas" not in group for group in optimizer.param_groups):
        raise ValueError(
            f"OptimHyper sets AdamW's hyper-parameters, but {type(optimizer).__name__} has a "
            "param group without betas (Muon's); use optim.name='adamw' for per-step "
            "hyper-parameters"
        )
    saved = [{key: group[key] for key in _HYPER_KEYS} for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group.update(
            lr=hyper.learning_rate,
            betas=(hyper.beta1, hyper.beta2),
            eps=hyper.eps,
            weight_decay=hyper.weight_decay,
        )
    try:
        yield
    finally:
        for group, values in zip(optimizer.param_groups, saved, strict=True):
            group.update(values)


def split_parameters(
    params: Sequence[torch.nn.Parameter], blocks: Iterable[torch.nn.Module]
) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """``(muon, adamw)``: the ``params`` that are 2-D and belong to one of ``blocks`` (the
    hidden weight matrices), and the rest, each in ``params``' order.

    A weight tied to one outside the blocks (the embedding and output head) is not in a
    block and goes to AdamW.
    """
    hidden = {id(param) for block in blocks for param in block.parameters()}
    muon: list[torch.nn.Parameter] = []
    adamw: list[torch.nn.Parameter] = []
    for param in params:
        (muon if param.ndim == 2 and id(param) in hidden else adamw).append(param)
    return muon, adamw


class FullMatrixMuon(torch.optim.Muon):
    """torch's ``Muon`` whose update of a DTensor parameter is orthogonalized whole.

    The step is torch's (momentum, Nesterov, Newton-Schulz with torch's code, decoupled
    weight decay, ``adjust_lr_fn``); on plain tensors it is torch's ``Muon`` exactly. For
    an FSDP2 shard (a ``DTensor``) the momentum update stays sharded, the Nesterov update
    is gathered (``full_tensor()``: one all-gather of each matrix per step, the volume of
    one FSDP forward's parameter gather), every rank orthogonalizes the full matrix (the
    Newton-Schulz matmuls are repeated on each rank, not split) and keeps its own shard of
    the result. torch's ``Muon`` applied to the shards directly runs its matmuls through
    DTensor's redistributions (several collectives per iteration) and rounds in bfloat16
    differently from the full matrix; this update equals the single-process one.
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One Muon step on every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        """torch's ``_single_tensor_muon`` for one parameter, orthogonalizing it whole."""
        grad = param.grad
        assert grad is not None
        if grad.ndim != 2:
            raise ValueError(f"Muon steps 2-D matrices; got a gradient of shape {grad.shape}")
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        buffer = state["momentum_buffer"]
        momentum = group["momentum"]
        buffer.lerp_(grad, 1 - momentum)
        update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
        ortho = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
        lr = float(group["lr"])
        param.mul_(1 - lr * group["weight_decay"])
        param.add_(ortho, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], param.shape))


def orthogonalize(
    update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float
) -> torch.Tensor:
    """torch Muon's Newton-Schulz orthogonalization of ``update`` (bfloat16 result).

    A ``DTensor`` is gathered, orthogonalized whole on every rank, and returned as a
    ``DTensor`` with the input's placements, each rank keeping its own shard (no second
    collective).
    """
    if not isinstance(update, DTensor):
        return _zeropower_via_newtonschulz(update, coefficients, steps, eps)
    full = _zeropower_via_newtonschulz(update.full_tensor(), coefficients, steps, eps)
    return distribute_tensor(full, update.device_mesh, update.placements, src_data_rank=None)


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon on the hidden matrices and AdamW on the rest, as one optimizer.

    ``param_groups`` is the Muon group followed by the AdamW group (the same dicts the two
    parts step with), and both parts share ``state``: a scheduler setting ``lr`` on every
    group, ``zero_grad``, ``state_dict`` and DCP's optimizer state dicts cover both.
    """

    def __init__(
        self,
        muon_params: Sequence[torch.nn.Parameter],
        adamw_params: Sequence[torch.nn.Parameter],
        config: OptimConfig,
        adamw_options: dict[str, Any],
    ) -> None:
        self.muon = FullMatrixMuon(
            muon_params,
            lr=config.lr,
            weight_decay=config.weight_decay,
            momentum=config.muon_momentum,
            ns_steps=config.muon_ns_steps,
            adjust_lr_fn=MUON_ADJUST_LR,
        )
        """Steps the hidden 2-D matrices."""
        self.adamw = (
            torch.optim.AdamW(
                adamw_params, lr=config.lr, weight_decay=config.weight_decay, **adamw_options
            )
            if adamw_params
            else None
        )
        """Steps the other parameters; ``None`` when there are none (e.g. LoRA adapters)."""
        groups = [group for part in self._parts() for group in part.param_groups]
        super().__init__(groups, {"lr": config.lr})
        self._share()

    def _parts(self) -> list[torch.optim.Optimizer]:
        return [self.muon] if self.adamw is None else [self.muon, self.adamw]

    def _share(self) -> None:
        """Point each part at its slice of ``param_groups`` and at the shared ``state``."""
        start = 0
        for part in self._parts():
            count = len(part.param_groups)
            part.param_groups = self.param_groups[start : start + count]
            part.state = self.state
            start += count

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Step Muon, then AdamW (``closure``, if given, is evaluated once)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self._parts():
            part.step()
        return loss

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Load as ``torch.optim.Optimizer`` does, then re-link the parts to the new groups
        and state (loading replaces both)."""
        super().load_state_dict(state_dict)
        self._share()
