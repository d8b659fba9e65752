"""Follow one PPO step's batch call by call: which files it enters, how often it comes back.

Runs one GRPO step of the packaged quickstart (its tiny model and task, made on the spot)
with the workers in the driver (``trainer.backend=local``), a reference and the KL loss on,
old log-probs recomputed by the actor, and follows the batch: the calls of ``hf_algos``
that are handed a ``DataProto``, the driver's code (``hf_algos/trainers/``) into every such
call, a call into the rest of ``hf_algos`` (the math, rewards, tracking) as one visit.
The file sequence (consecutive repeats merged) is what a reader follows by hand; a *return*
is a step of the sequence into a file the reader had already left.

Usage: ``python tools/step_trace.py [--workdir DIR] [--show]``; prints the files entered,
the number of returns and, with ``--show``, the sequence itself.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

OVERRIDES = (
    "trainer.total_training_steps=1",
    "trainer.backend=local",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.loggers=[jsonl]",
    "trainer.progress_bar=false",
    "reference=true",
    "actor.use_kl_loss=true",
    "actor.use_rollout_log_probs=false",
    "actor.ppo_epochs=2",  # old log-probs from a forward of their own, as most recipes
    "rollout.n=4",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=16",
)


DRIVER = "hf_algos/trainers/"
"""The driver's code: followed into every call it makes."""


def our_file(filename: str) -> str | None:
    """``hf_algos/.../name.py`` for a file of the driver's package, else ``None``."""
    parts = Path(filename).parts
    if "hf_algos" not in parts:
        return None
    return "/".join(parts[parts.index("hf_algos") :])


def carries_batch(frame: FrameType) -> bool:
    """Whether the call of ``frame`` was handed a batch (a ``DataProto``) as an argument."""
    from hf_protocol import DataProto

    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return any(isinstance(frame.f_locals.get(name), DataProto) for name in names)


def file_sequence(step: Callable[[], Any]) -> list[str]:
    """Run ``step`` and return the files of ``hf_algos`` the batch visits, in order,
    consecutive repeats merged: the calls that are handed a ``DataProto``. The driver's own
    code (``hf_algos/trainers/``) is followed into every such call; a call into the rest of
    ``hf_algos`` (the math, rewards, tracking) is one visit, not followed further; code
    outside ``hf_algos`` is not followed."""
    sequence: list[str] = []
    followed: set[int] = set()  # id() of the live frames whose calls are recorded
    recorded: set[int] = set()  # id() of the live frames that are in the sequence

    def visit(name: str | None) -> None:
        if name is not None and (not sequence or sequence[-1] != name):
            sequence.append(name)

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event not in ("call", "return"):
            return
        parent = frame.f_back
        if event == "call":
            starts = frame.f_code.co_name == "train_step" and not followed
            if not starts and (parent is None or id(parent) not in followed):
                return
            name = our_file(frame.f_code.co_filename)
            if name is None or not (starts or carries_batch(frame)):
                return
            recorded.add(id(frame))
            if name.startswith(DRIVER):
                followed.add(id(frame))
            visit(name)
        elif id(frame) in recorded:
            recorded.discard(id(frame))
            followed.discard(id(frame))
            if parent is not None and id(parent) in recorded:
                visit(our_file(parent.f_code.co_filename))

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return sequence


def returns(sequence: list[str]) -> int:
    """Steps of ``sequence`` into a file that was visited (and left) before."""
    seen: set[str] = set()
    count = 0
    for name in sequence:
        count += name in seen
        seen.add(name)
    return count


def traced_step(workdir: Path) -> list[str]:
    """The file sequence of one quickstart GRPO step (see the module docstring)."""
    import hf_algos
    from hf_algos.config import RLConfig, compose_config, instantiate_config, resolve_config
    from hf_algos.examples import make_assets, register_resolvers, requested_assets
    from hf_algos.trainers import PPOTrainer

    register_resolvers()  # the packaged config makes its model and task through them
    path = Path(hf_algos.__file__).parent / "cli" / "configs" / "quickstart.yaml"
    tree = compose_config(RLConfig, path, [f"vars.workdir={workdir}", *OVERRIDES])
    with requested_assets() as assets:
        resolve_config(tree)  # names the example's files, makes none
    make_assets(assets)
    config = instantiate_config(RLConfig, tree)
    with PPOTrainer(config) as trainer:
        batch = trainer.next_batch()
        trainer.global_step = 1
        return file_sequence(lambda: trainer.train_step(batch))


def main() -> None:
    """Print the files, the returns and (``--show``) the sequence."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="where the task is made")
    parser.add_argument("--show", action="store_true", help="print the file sequence")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sequence = traced_step(args.workdir or Path(tmp))
    if args.show:
        print(" -> ".join(sequence))
    print(f"files entered: {len(set(sequence))} ({', '.join(sorted(set(sequence)))})")
    print(f"returns to a file already left: {returns(sequence)}")


if __name__ == "__main__":
    main()
