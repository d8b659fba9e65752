"""Masked reductions over ``(B, R)`` response tensors, shared by estimators and losses.

A mask is 1 (or True) at valid response tokens and 0 at padding. Every function here is
safe on an all-zero mask: it returns 0 (keeping the autograd graph) instead of NaN, since an
engine may run a micro-batch whose tokens all carry zero weight.
"""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set, over ``dim`` (all dims when ``None``).

    Shape: ``values`` and ``mask`` broadcastable, e.g. both ``(B, R)``.
    """
    product = values * mask.to(values.dtype)
    return product.sum() if dim is None else product.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the set entries of ``mask``; 0 where no entry is set.

    Shape: ``values`` and ``mask`` ``(B, R)``; the result is a scalar (``dim=None``) or
    ``values`` reduced over ``dim``.
    """
    count = mask.to(values.dtype)
    count = count.sum() if dim is None else count.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all set entries of ``mask`` (a scalar).

    ``unbiased`` divides by ``n - 1`` (Bessel's correction); with fewer than two entries the
    variance is 0.
    """
    mean = masked_mean(values, mask)
    squares = masked_sum((values - mean) ** 2, mask)
    count = mask.to(values.dtype).sum()
    if unbiased:
        return squares / (count - 1).clamp(min=1.0)
    return squares / count.clamp(min=1.0)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """``(values - mean) / sqrt(var + eps)`` with mean and (unbiased) variance over the mask.

    Shape: ``(B, R)`` in and out. Entries outside the mask are whitened too but carry no
    meaning; multiply by the mask where that matters. ``shift_mean=False`` keeps the mean
    (only scales), as PPO implementations that preserve the advantage sign do.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + eps)
    return whitened if shift_mean else whitened + mean
