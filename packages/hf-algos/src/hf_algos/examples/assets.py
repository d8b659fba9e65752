"""The files a packaged example config names, made by an explicit step, never by composing.

A packaged config (``hybridflow grpo --config-name quickstart``) cannot point at files that
ship nowhere, so it names them through OmegaConf resolvers that return their paths:

* ``${reverse_letters.model:DIR}``: a random-weight tiny Qwen2 and a character tokenizer
  in ``DIR``;
* ``${reverse_letters.data:DIR}``: ``train.jsonl``, ``val.jsonl`` and ``sft.jsonl`` of the
  reverse-six-letters task in ``DIR``;
* ``${reverse_letters.warm_model:WORKDIR}``: ``WORKDIR/model_sft``, the random model after
  the supervised warm-up of the packaged ``quickstart_sft`` config (80 steps, about 20 s on
  two CPU cores; it needs the two above, in ``WORKDIR/model_init`` and ``WORKDIR/data``).
  GRPO starts from it: the random model alone does not learn the task;
* ``${reverse_letters.reward_file:}``: the path of
  :mod:`hf_algos.examples.reverse_letters_reward` (torch-free, so the reward's scoring
  processes start in a fraction of a second), a file that exists already.

The command registers these resolvers (:func:`register_resolvers`; loading a config does
not import this module). Resolving a config makes nothing: inside :func:`requested_assets`
(the ``hybridflow`` command) each resolver records what it names, and the command makes the
missing files with :func:`make_assets` only when it trains: ``--cfg`` writes nothing. A
program that registers the resolvers and resolves a packaged config outside that scope gets
the files made on the spot. An existing file is reused, never rebuilt.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

__all__ = [
    "AssetRequests",
    "make_assets",
    "register_resolvers",
    "requested_assets",
]

WARM_MODEL_DIR = "model_sft"
"""Where the warm-up puts its model, inside the workdir."""
_SFT_CONFIG = Path(__file__).parents[1] / "cli" / "configs" / "quickstart_sft.yaml"


@dataclass
class AssetRequests:
    """The example files a resolved config names, in the order first named."""

    makers: dict[str, Callable[[], None]] = field(default_factory=dict)
    """Path -> the function that makes it when missing."""

    @property
    def paths(self) -> list[str]:
        """Every named path (planned: it exists once :func:`make_assets` ran)."""
        return list(self.makers)


_REQUESTS: contextvars.ContextVar[AssetRequests | None] = contextvars.ContextVar(
    "hf_algos_example_assets", default=None
)


@contextmanager
def requested_assets() -> Iterator[AssetRequests]:
    """Within this scope, resolving a packaged config records its example files instead of
    making them; make them afterwards with :func:`make_assets` (or not, for ``--cfg``)."""
    requests = AssetRequests()
    token = _REQUESTS.set(requests)
    try:
        yield requests
    finally:
        _REQUESTS.reset(token)


def make_assets(requests: AssetRequests) -> None:
    """Make every requested file that does not exist yet (in the order named)."""
    for make in requests.makers.values():
        make()


def _named(path: Path, make: Callable[[], None]) -> str:
    """Record ``path`` with its maker in the active scope, else make it now; its text."""
    requests = _REQUESTS.get()
    if requests is None:
        make()
    else:
        requests.makers.setdefault(str(path), make)
    return str(path)


def _make_model(path: Path) -> None:
    from hf_algos.examples.reverse_letters import ModelShape, build_model_dir

    if not (path / "config.json").is_file():
        print(f"hybridflow: making the example's random tiny model in {path}")
        build_model_dir(path, ModelShape(), seed=0)


def _make_data(path: Path) -> None:
    from hf_algos.examples.reverse_letters import TaskConfig, write_task_files

    if not all((path / f"{name}.jsonl").is_file() for name in ("train", "val", "sft")):
        print(f"hybridflow: writing the example's task data to {path}")
        write_task_files(path, TaskConfig())


def _make_warm_model(workdir: Path) -> None:
    """Run the packaged ``quickstart_sft`` config in this process (local backend, no Ray),
    exporting its model to ``workdir/model_sft``."""
    target = workdir / WARM_MODEL_DIR
    if (target / "config.json").is_file():
        return
    from hf_algos.config import SFTConfig, load_config
    from hf_algos.data.tokenizer import load_tokenizer
    from hf_algos.trainers import SFTTrainer

    print(f"hybridflow: supervised warm-up of the example's model into {target} (once)")
    register_resolvers()  # quickstart_sft.yaml names the model and data through them
    config = load_config(
        SFTConfig,
        _SFT_CONFIG,
        [f"vars.workdir={workdir}", "trainer.backend=local", "trainer.loggers=[jsonl]"],
    )
    with SFTTrainer(config) as trainer:
        trainer.fit()
        trainer.roles.actor.export_hf(str(target))
    load_tokenizer(config.data, config.actor).save_pretrained(target)


def _model(directory: str) -> str:
    path = Path(directory)
    return _named(path, lambda: _make_model(path))


def _data(directory: str) -> str:
    path = Path(directory)
    return _named(path, lambda: _make_data(path))


def _warm_model(workdir: str) -> str:
    root = Path(workdir)

    def make() -> None:
        _make_model(root / "model_init")
        _make_data(root / "data")
        _make_warm_model(root)

    return _named(root / WARM_MODEL_DIR, make)


def _reward_file() -> str:
    from hf_algos.examples import reverse_letters_reward

    return str(Path(reverse_letters_reward.__file__).resolve())


def register_resolvers() -> None:
    """Register the ``reverse_letters.*`` resolvers with OmegaConf (idempotent)."""
    for name, function in (
        ("reverse_letters.model", _model),
        ("reverse_letters.data", _data),
        ("reverse_letters.warm_model", _warm_model),
        ("reverse_letters.reward_file", _reward_file),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_resolver(name, function)
