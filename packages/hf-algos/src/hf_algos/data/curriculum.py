"""A reasoning-gym curriculum that advances on the training accuracy (``data.curriculum``).

reasoning-gym's ``create_curriculum(task)`` names a task's difficulty attributes (``chain_sum``:
``num_terms``, ``num_digits``), each a list of levels. :class:`Curriculum` keeps the current
level of each, generates rows at those levels, and takes each step's scores back
(:meth:`Curriculum.observe`): when the mean of the last ``window`` scores reaches ``threshold``,
the next attribute of ``advance`` goes up one level and the window starts afresh.

Rows depend only on the seed, the levels and the batch's index (:func:`batch_seed`), never on
a global generator, and :meth:`Curriculum.state_dict` holds the levels, the window and the
position: a run resumed from a checkpoint generates exactly the rows an uninterrupted run
does.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hf_algos.data.reasoning_gym import (
    ReasoningGymSpec,
    import_reasoning_gym,
    reasoning_gym_rows,
)

if TYPE_CHECKING:
    from hf_algos.config.data import CurriculumSection


def batch_seed(seed: int, batch: int) -> int:
    """The generator seed of batch ``batch`` (row ``i`` of it: reasoning-gym's
    ``Random(batch_seed + i)``): a hash of both, so the training rows do not repeat a
    ``reasoning_gym:`` validation spec's ``seed + i`` stream."""
    digest = hashlib.blake2b(f"curriculum:{seed}:{batch}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def _reasoning_gym_curriculum(task: str) -> Any:
    """reasoning-gym's curriculum of ``task``, or a ``ValueError`` naming the tasks that have
    one."""
    import_reasoning_gym()
    from reasoning_gym.factory import CURRICULA, create_curriculum

    if task not in CURRICULA:
        raise ValueError(
            f"reasoning-gym has no curriculum for the task {task!r}; tasks with one: "
            f"{sorted(CURRICULA)}"
        )
    return create_curriculum(task)


class Curriculum:
    """The current levels of a reasoning-gym curriculum, the rows they give, and the rolling
    accuracy that raises them (module docstring)."""

    def __init__(self, section: CurriculumSection, seed: int = 0) -> None:
        self.section = section
        """The ``data.curriculum`` section: task, levels, when and what advances."""
        self.seed = seed
        """Seed of the rows (``data.seed``; :func:`batch_seed`)."""
        self._levels = _reasoning_gym_curriculum(section.task)
        attributes = self._levels.attributes
        self.advance = section.advance or tuple(attributes)
        unknown = sorted({*section.start, *section.max_levels, *self.advance} - set(attributes))
        if unknown:
            raise ValueError(
                f"the {section.task!r} curriculum has no attributes {unknown}; its attributes: "
                f"{_describe(attributes)}"
            )
        fields = {name for attr in attributes.values() for name in _field_names(attr)}
        fixed = sorted(set(section.settings) & fields)
        if fixed:
            raise ValueError(
                f"settings {fixed} are set by the curriculum's levels; leave them out of "
                f"settings and give start / max_levels of {_describe(attributes)}"
            )
        self.max_levels = {
            name: section.max_levels.get(name, len(attr.levels) - 1)
            for name, attr in attributes.items()
        }
        for name, level in section.start.items():
            self._set_level(name, level, "start")
        for name, top in self.max_levels.items():
            if not self.level(name) <= top < len(attributes[name].levels):
                raise ValueError(
                    f"max_levels.{name}={top} must lie between the start level "
                    f"{self.level(name)} and the last level {len(attributes[name].levels) - 1}"
                )
        self.scores: list[float] = []
        """The scores since the last level change, the last ``window`` of them."""
        self.batches = 0
        """Batches generated so far: the index of the next one."""
        self._turn = 0  # index into self.advance of the attribute raised next

    # ------------------------------------------------------------------ levels

    def level(self, name: str) -> int:
        """The current level of attribute ``name``."""
        return int(self._levels.get_attr_level(name))

    @property
    def levels(self) -> dict[str, int]:
        """The current level of every attribute."""
        return {name: self.level(name) for name in self._levels.attributes}

    def _set_level(self, name: str, level: int, what: str) -> None:
        attr = self._levels.attributes[name]
        if not 0 <= level < len(attr.levels):
            raise ValueError(
                f"{what}.{name}={level} is not a level of {self.section.task!r}'s {name!r}: give "
                f"0..{len(attr.levels) - 1} (levels {attr.levels})"
            )
        self._levels.set_attr_level(name, level)

    def task_settings(self) -> dict[str, Any]:
        """The task's settings at the current levels (the fixed ``settings`` included)."""
        from reasoning_gym.coaching.base_curriculum import (
            DefaultCurriculumContext,
            RangeAttributeMode,
        )

        context = DefaultCurriculumContext(mode=RangeAttributeMode(self.section.range_mode))
        config = self._levels.generate_configuration(dict(self.section.settings), context)
        values = dataclasses.asdict(config)
        return {k: v for k, v in values.items() if k not in ("size", "seed")}

    # ------------------------------------------------------------------ rows

    def next_rows(self, count: int) -> list[dict[str, Any]]:
        """The next batch of ``count`` rows at the current levels (verl's row schema, as
        :func:`~hf_algos.data.reasoning_gym.reasoning_gym_rows`; ``extra_info.index`` is the
        row's index in the run, ``extra_info.levels`` the levels it was made at)."""
        rows = self.rows_at(self.batches, count)
        self.batches += 1
        return rows

    def rows_at(self, batch: int, count: int) -> list[dict[str, Any]]:
        """Batch ``batch``'s ``count`` rows at the current levels, the position unchanged."""
        seed = batch_seed(self.seed, batch)
        spec = ReasoningGymSpec(
            self.section.task, count, seed, self.task_settings(), self.section.answer
        )
        rows = reasoning_gym_rows(spec)
        levels = self.levels
        for offset, row in enumerate(rows):
            row["extra_info"]["index"] = batch * count + offset
            row["extra_info"]["levels"] = dict(levels)
        return rows

    # ------------------------------------------------------------------ feedback

    def observe(self, scores: Sequence[float]) -> dict[str, float]:
        """Take one step's per-sample scores; advance when the rolling accuracy of a full
        window reaches the threshold (one line printed). Returns the step's metrics: the
        levels its rows were made at (``curriculum/<attribute>``: the level's value where it
        is a number, ``curriculum/<attribute>_level``), the rolling accuracy
        (``curriculum/accuracy``) and ``curriculum/advanced`` (1 when this step raised a
        level)."""
        metrics = self.metrics()
        self.scores = [*self.scores, *(float(s) for s in scores)][-self.section.window :]
        accuracy = sum(self.scores) / len(self.scores) if self.scores else 0.0
        metrics["curriculum/accuracy"] = accuracy
        full = len(self.scores) == self.section.window
        raised = self._raise() if full and accuracy >= self.section.threshold else None
        metrics["curriculum/advanced"] = float(raised is not None)
        if raised is not None:
            name, old = raised
            attr = self._levels.attributes[name]
            print(
                f"curriculum: {self.section.task} {name} {attr.levels[old]} -> "
                f"{attr.levels[old + 1]} (level {old} -> {old + 1}): accuracy {accuracy:.3f} "
                f">= {self.section.threshold} over the last {self.section.window} samples",
                flush=True,
            )
            self.scores = []
        return metrics

    def metrics(self) -> dict[str, float]:
        """``curriculum/<attribute>`` (the level's value, or the level where the value is no
        number) and ``curriculum/<attribute>_level`` of every attribute."""
        metrics = {}
        for name, attr in self._levels.attributes.items():
            level = self.level(name)
            value = attr.levels[level]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            metrics[f"curriculum/{name}"] = float(value if number else level)
            metrics[f"curriculum/{name}_level"] = float(level)
        return metrics

    def _raise(self) -> tuple[str, int] | None:
        """Raise the next attribute of ``advance`` below its maximum, in turn; returns it
        and its old level, or ``None`` when every one is at its maximum."""
        for step in range(len(self.advance)):
            turn = (self._turn + step) % len(self.advance)
            name = self.advance[turn]
            old = self.level(name)
            if old < self.max_levels[name]:
                self._levels.set_attr_level(name, old + 1)
                self._turn = (turn + 1) % len(self.advance)
                return name, old
        return None

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Levels, window, position and turn (plain data), and the task and seed a restore
        must match."""
        return {
            "task": self.section.task,
            "seed": self.seed,
            "levels": self.levels,
            "scores": list(self.scores),
            "batches": self.batches,
            "turn": self._turn,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the same task and seed)."""
        saved = (state["task"], state["seed"])
        if saved != (self.section.task, self.seed):
            raise ValueError(
                f"the checkpoint's curriculum is task {saved[0]!r} with seed {saved[1]}, this "
                f"run's {self.section.task!r} with seed {self.seed}; resume with the same "
                "data.curriculum.task and data.seed"
            )
        for name, level in state["levels"].items():
            self._set_level(name, int(level), "levels")
        self.scores = [float(s) for s in state["scores"]]
        self.batches = int(state["batches"])
        self._turn = int(state["turn"])


def _field_names(attr: Any) -> tuple[str, ...]:
    """The task settings an attribute sets (a range's lower and upper field, a scalar's)."""
    names = (getattr(attr, key, None) for key in ("lower_field_name", "upper_field_name"))
    return (*(n for n in names if n), *([attr.field_name] if hasattr(attr, "field_name") else []))


def _describe(attributes: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} (levels {attr.levels})" for name, attr in attributes.items())


def check_curriculum(section: CurriculumSection) -> None:
    """Build the curriculum of ``section`` and its first row, so an unknown task or
    attribute, a level out of range or a setting the task refuses fails before training
    (``ValueError`` naming the fix)."""
    curriculum = Curriculum(section)
    try:
        curriculum.rows_at(0, 1)
    except (TypeError, AssertionError, ValueError) as error:
        raise ValueError(
            f"task {section.task!r} cannot generate a row with the settings "
            f"{dict(section.settings)} at the levels {curriculum.levels} "
            f"({type(error).__name__}: {error}); change data.curriculum.settings"
        ) from error
