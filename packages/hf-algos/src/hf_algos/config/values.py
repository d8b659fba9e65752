"""The check of one value that every section makes: positive (or, where allowed, zero)."""

from __future__ import annotations

from hf_controller import ConfigurationError


def require_positive(name: str, value: float, allow_zero: bool = False) -> None:
    """Raise :class:`~hf_controller.ConfigurationError` naming ``name`` unless ``value`` is
    ``> 0`` (``>= 0`` with ``allow_zero``). The one positive-value check of the sections and
    of the checks here, so every section words its errors alike."""
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigurationError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")
