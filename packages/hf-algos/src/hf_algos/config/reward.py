"""``reward``: which functions score a response, and the processes that run them.

Each section checks its own values in ``__post_init__``; checks that need several
sections are in :mod:`hf_algos.config.cross_checks`.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from pathlib import Path

from hf_algos.config.values import require_positive
from hf_controller import ConfigurationError
from hf_engines.config import EngineConfig


@dataclass(frozen=True)
class RewardSection:
    """How responses are scored: the rule-based :class:`~hf_algos.rewards.RewardManager`'s
    config (``RewardManager.from_config``), or a reward model."""

    num_workers: int = 2
    """Processes that run the rule-based scoring functions (by each row's ``data_source``)."""
    timeout_s: float = 10.0
    """Seconds one sample's scoring may take before it scores 0 and is reported."""
    max_error_fraction: float = 0.1
    """Share of a batch's samples (train step or validation batch) that may fail (raise or
    time out) and score 0; above it the run stops, showing the first failures. 1.0: never."""
    max_memory_mb: int | None = 4096
    """Address-space cap (MiB) of each scoring process: a runaway allocation becomes that
    sample's ``MemoryError``. ``null`` disables it."""
    cpu_time_limit_s: float | None = None
    """CPU seconds one sample may use before its scoring process is killed (``SIGXCPU``,
    reported as a dead process with its cause). ``null``: ``2 x timeout_s + 5``; 0: none."""
    max_consecutive_timeouts: int = 4
    """When this many samples of one function time out in a row within a batch, the batch
    stops at once with a ``RewardError`` naming the function and the count (a function
    that hangs costs about this many ``timeout_s``, not one per row). 0: never."""
    hard_timeout_grace_s: float = 60.0
    """Extra seconds a task (a chunk of samples: ``timeout_s`` each) may run before its
    process, which ignores the alarm (stuck in C code), is killed and replaced; its samples
    score 0 and are reported, and the other tasks go on. A batch not done by then for every
    round of tasks (process start-up included) replaces the whole pool. A process that dies
    is reported at once, not at this deadline."""
    start_method: str | None = None
    """How scoring processes start (multiprocessing's start method); ``null``:
    ``forkserver`` where available (each process forks from a server that imported the
    scoring code once, so a replaced one starts fast and no Ray or torch threads are
    forked), else ``spawn``."""
    skip_special_tokens: bool = True
    """Drop special tokens (EOS, chat markers) from the response text a function scores."""
    max_logged_errors: int = 5
    """Failed samples logged one by one per batch (and shown when the run stops for them)."""
    model: EngineConfig | None = None
    """A reward model (value head) scored by a ``RewardModelWorker`` instead of the rules;
    its checkpoint is ``reward.model.model.path``."""
    function_path: str | None = None
    """A Python file (by path; it need not be importable) defining the scoring function
    ``function_name`` (verl: ``custom_reward_function.path``). It scores every row whose
    data_source has no function registered by your code, and replaces the built-in gsm8k /
    math functions; see docs/rewards.md."""
    function_name: str | tuple[str, ...] = "compute_score"
    """The function of ``function_path`` (verl: ``custom_reward_function.name``); verl's,
    HybridFlow's and TRL's batched signatures are accepted. A list (TRL's ``reward_funcs``)
    scores each sample with every function named, each in its own signature: the score is
    their weighted sum (``function_weights``), a function returning ``None`` for a sample is
    left out of its sum, and each is logged as ``reward/<name>/mean``."""
    function_weights: tuple[float, ...] | None = None
    """Weights of the functions of ``function_name``, one per name in the same order (TRL's
    ``reward_weights``); ``null``: 1.0 each."""

    @property
    def function_names(self) -> tuple[str, ...]:
        """``function_name`` as a tuple (one name, or the list's names)."""
        name = self.function_name
        return (name,) if isinstance(name, str) else tuple(name)

    def __post_init__(self) -> None:
        if not isinstance(self.function_name, str):  # a list given in Python: keep it frozen
            object.__setattr__(self, "function_name", tuple(self.function_name))
        if self.function_weights is not None:
            weights = tuple(float(w) for w in self.function_weights)
            object.__setattr__(self, "function_weights", weights)
        _check_function_list(self.function_names, self.function_weights)
        if self.function_path is None and (
            self.function_weights is not None or len(self.function_names) > 1
        ):
            raise ConfigurationError(
                f"reward.function_name={list(self.function_names)} with reward.function_weights"
                f"={None if self.function_weights is None else list(self.function_weights)} "
                f"needs reward.function_path, the file that defines those functions; set it, "
                f"or drop function_weights and give one function_name (without a file, the "
                f"functions registered for each data_source score it)"
            )
        if self.function_path is not None and self.model is not None:
            raise ConfigurationError(
                f"reward.function_path={self.function_path!r} and reward.model are both set; "
                f"a run scores with one of them: drop reward.model to score with the file, "
                f"or reward.function_path to score with the reward model"
            )
        if self.function_path is not None and not Path(self.function_path).is_file():
            raise ConfigurationError(
                f"reward.function_path={self.function_path!r} is not a file; give the path of "
                f"a Python file defining {', '.join(self.function_names)} (relative paths are "
                f"taken from the working directory {str(Path.cwd())!r})"
            )
        require_positive("reward.num_workers", self.num_workers)
        require_positive("reward.timeout_s", self.timeout_s)
        if self.max_consecutive_timeouts < 0:
            raise ConfigurationError(
                f"reward.max_consecutive_timeouts={self.max_consecutive_timeouts} must be >= 0 "
                f"(0 never stops a batch for timeouts in a row)"
            )
        if self.hard_timeout_grace_s < 0:
            raise ValueError(
                f"reward.hard_timeout_grace_s={self.hard_timeout_grace_s} must be >= 0"
            )
        if not 0.0 <= self.max_error_fraction <= 1.0:
            raise ValueError(
                f"reward.max_error_fraction={self.max_error_fraction} must be in [0, 1] "
                f"(1.0 never stops the run for failed samples)"
            )
        if self.max_memory_mb is not None and self.max_memory_mb < 64:
            raise ValueError(
                f"reward.max_memory_mb={self.max_memory_mb} is too small for a Python "
                f"process; give at least 64 (MiB) or null to disable the cap"
            )
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ValueError(
                f"reward.start_method={self.start_method!r} is not available here; choose "
                f"from {methods} (or null: forkserver where available)"
            )

    @property
    def process_start_method(self) -> str:
        """``start_method``, or ``forkserver`` where available, else ``spawn``."""
        if self.start_method is not None:
            return self.start_method
        return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

    @property
    def cpu_limit_per_sample_s(self) -> float | None:
        """The CPU-time limit per sample in force (``None``: none)."""
        if self.cpu_time_limit_s is None:
            return 2 * self.timeout_s + 5
        return self.cpu_time_limit_s or None


def _check_function_list(names: tuple[str, ...], weights: tuple[float, ...] | None) -> None:
    """Refuse ``reward.function_name`` / ``function_weights`` that cannot pair up."""
    if not names or not all(names):
        raise ConfigurationError(
            f"reward.function_name={list(names)} must name at least one function, each a "
            f"non-empty name of a function of reward.function_path"
        )
    if weights is not None and len(weights) != len(names):
        raise ConfigurationError(
            f"reward.function_weights has {len(weights)} weight(s) {list(weights)} but "
            f"reward.function_name names {len(names)} function(s) {list(names)}; give one "
            f"weight per function, in the same order (or null: 1.0 each)"
        )
