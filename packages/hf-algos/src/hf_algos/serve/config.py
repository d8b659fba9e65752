"""``hybridflow serve``'s config: the model's sections (as a trainer's) and ``serve``.

``actor`` is the model every training client starts from (its engine: FSDP or Megatron,
its optimizer defaults, ``actor.lora.alpha`` and ``target_modules`` for LoRA clients),
``rollout`` the samplers' engine, ``trainer`` the placement (workers, hybrid or separate,
Ray or local), ``data`` the tokenizer (``data.tokenizer_path``, else the model's).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from hf_algos.config.actor import ActorSection
from hf_algos.config.data import DataSection
from hf_algos.config.rollout import RolloutSection
from hf_algos.config.trainer import TrainerSection
from hf_controller import ConfigurationError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServeSection:
    """The HTTP server: where it listens, who may call it, what it keeps."""

    host: str = "127.0.0.1"
    """Address to bind. Loopback by default; any other address needs an API key."""
    port: int = 8000
    """TCP port (0: any free port, printed at start)."""
    api_key_env: str = "HYBRIDFLOW_API_KEY"
    """Environment variable holding the API key that every request must send as
    ``X-API-Key`` (the tinker SDK's ``TINKER_API_KEY``, which must start with ``tml-``).
    Unset on a loopback bind: no key is checked. The key itself is never logged."""
    base_model: str | None = None
    """The name clients give as ``base_model`` (e.g. ``HuggingFaceTB/SmolLM2-135M-Instruct``);
    default: ``actor.engine.model.path``."""
    max_request_mb: float = 64.0
    """Largest request body accepted (413 above it)."""
    future_ttl_s: float = 3600.0
    """How long a finished call's result is kept for a client to fetch."""
    poll_wait_s: float = 25.0
    """How long a ``retrieve_future`` poll waits for the result before ``try_again`` (under
    the SDK's 45 s read timeout)."""
    session_ttl_s: float = 600.0
    """A session whose client sent no heartbeat for this long is closed (its models freed)."""
    max_models: int = 1
    """Training clients alive at once (each is a worker group holding a model)."""
    state_dir: str = "outputs/serve"
    """Where ``save_state`` writes checkpoints (``<state_dir>/<model_id>/<name>``)."""
    sample_batch_wait_s: float = 0.05
    """Sample requests arriving this close together are generated as one batch."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigurationError(f"serve.port={self.port} must be in [0, 65535]")
        for name in ("max_request_mb", "future_ttl_s", "poll_wait_s", "session_ttl_s"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"serve.{name}={getattr(self, name)} must be > 0")
        if self.poll_wait_s >= 45:
            raise ConfigurationError(
                f"serve.poll_wait_s={self.poll_wait_s} must be under 45 s, the tinker SDK's "
                "read timeout for a poll (e.g. 25)"
            )
        if self.max_models < 1:
            raise ConfigurationError(f"serve.max_models={self.max_models} must be >= 1")


@dataclass(frozen=True)
class ServeConfig:
    """``hybridflow serve``: a Tinker-compatible training API over worker groups."""

    actor: ActorSection
    """The base model and how a training client trains it."""
    rollout: RolloutSection = field(default_factory=RolloutSection)
    """The samplers' engine (native on CPU, vLLM on GPU)."""
    data: DataSection = field(default_factory=DataSection)
    """Only the tokenizer settings are read."""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    """Placement of each client's groups: workers, hybrid or separate, Ray or local."""
    serve: ServeSection = field(default_factory=ServeSection)
    """The HTTP server."""

    @property
    def base_model(self) -> str:
        """The base model's name as clients give it."""
        return self.serve.base_model or str(self.actor.engine.model.path)
