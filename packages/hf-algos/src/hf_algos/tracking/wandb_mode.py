"""Which Weights & Biases mode a run uses (``trainer.wandb_mode``).

``auto`` streams to W&B when this machine has an API key configured (the
``WANDB_API_KEY`` variable, or the ``~/.netrc`` entry that ``wandb login`` writes) and
writes offline files otherwise (sync them later with ``wandb sync``). ``online``,
``offline`` and ``disabled`` are used as given. The decision reads only the environment
and the netrc file: it never touches the network.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

WandbMode = Literal["auto", "online", "offline", "disabled"]
"""Values of ``trainer.wandb_mode``."""
WANDB_MODES: tuple[str, ...] = ("auto", "online", "offline", "disabled")
"""Every accepted ``trainer.wandb_mode``."""
_DEFAULT_HOST = "api.wandb.ai"


def wandb_api_host(environ: Mapping[str, str] | None = None) -> str:
    """The W&B server host: that of ``WANDB_BASE_URL``, or ``api.wandb.ai``."""
    env = os.environ if environ is None else environ
    base = env.get("WANDB_BASE_URL")
    return (urlparse(base).hostname or _DEFAULT_HOST) if base else _DEFAULT_HOST


def wandb_key_source(environ: Mapping[str, str] | None = None) -> str | None:
    """Where a W&B API key is configured (a short description), or ``None`` if nowhere.

    Looks at ``WANDB_API_KEY``, then the netrc file (``NETRC`` or ``~/.netrc``) for the
    host of :func:`wandb_api_host`, as ``wandb login`` stores it.
    """
    env = os.environ if environ is None else environ
    if env.get("WANDB_API_KEY", "").strip():
        return "WANDB_API_KEY is set"
    path = Path(env["NETRC"]) if env.get("NETRC") else Path.home() / ".netrc"
    host = wandb_api_host(env)
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    if entry is not None and entry[2]:
        return f"{path} has a key for {host} (wandb login)"
    return None


def resolve_wandb_mode(
    mode: str, environ: Mapping[str, str] | None = None
) -> tuple[Literal["online", "offline", "disabled"], str]:
    """The mode to pass to ``wandb.init`` for ``trainer.wandb_mode=mode``, and why.

    * ``online`` / ``offline`` / ``disabled``: as given (an explicit choice wins).
    * ``auto``: ``WANDB_MODE`` when that variable is set (W&B's own switch); otherwise
      ``online`` when a key is configured (:func:`wandb_key_source`), else ``offline``.
    """
    if mode not in WANDB_MODES:
        raise ValueError(
            f"trainer.wandb_mode={mode!r} is not one of {list(WANDB_MODES)}; use 'auto' to go "
            f"online when an API key is configured and offline when not"
        )
    if mode != "auto":
        return mode, f"trainer.wandb_mode={mode}"  # type: ignore[return-value]  # checked above
    env = os.environ if environ is None else environ
    from_env = env.get("WANDB_MODE", "").strip().lower()
    if from_env in ("online", "offline", "disabled"):
        return from_env, f"WANDB_MODE={from_env}"  # type: ignore[return-value]
    if from_env in ("dryrun", "run"):  # W&B's older spellings
        return ("offline" if from_env == "dryrun" else "online"), f"WANDB_MODE={from_env}"
    source = wandb_key_source(env)
    if source is not None:
        return "online", f"auto: {source}"
    return "offline", (
        "auto: no API key configured (set WANDB_API_KEY or run `wandb login` to stream; "
        "`wandb sync` uploads the offline files later)"
    )
