"""The recipe's configuration: one small typed dataclass, checked before any work starts."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import itertools
import os
import tempfile
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("ray", "local")


def default_output_dir() -> str:
    """Where results, the trace and the synthetic corpus go unless told otherwise.

    Outside the repository (the corpus is ~160 MB), and stable across runs so a
    generated corpus is reused.
    """
    return os.path.join(tempfile.gettempdir(), "hybridflow", "parallel_map")


@dataclass(frozen=True)
class ParallelMapConfig:
    """Everything the parallel word count can be told. Unknown keys are an error."""

    input_dir: str | None = None
    """Folder of text files to count (searched recursively). ``None``: generate a
    synthetic corpus in ``{output_dir}/corpus`` (reused when it already exists)."""
    pattern: str = "*.txt"
    """Glob for the file names under ``input_dir``."""
    output_dir: str = field(default_factory=default_output_dir)
    """Where ``result.json`` and ``trace.json`` (and a synthetic corpus) are written."""
    workers: int = 2
    """Worker processes of the parallel run (one Ray actor each)."""
    compare_single: bool = True
    """Also run with one worker first, to measure the speed-up."""
    backend: str = "ray"
    """``"ray"``: one process per worker. ``"local"``: workers run one after the other
    in this process (for debugging with ``breakpoint()``; no speed-up)."""
    top_k: int = 10
    """How many of the most frequent words to report."""
    rounds: int = 8
    """Group calls the files are spread over; each round prints a progress line."""
    corpus_files: int = 64
    """Synthetic corpus: number of files."""
    corpus_mb: float = 160.0
    """Synthetic corpus: total size in megabytes (10**6 bytes)."""
    seed: int = 0
    """Synthetic corpus: random seed; the same seed always gives the same text."""

    def __post_init__(self) -> None:
        _check_type("workers", self.workers, int)
        _check_type("top_k", self.top_k, int)
        _check_type("rounds", self.rounds, int)
        _check_type("corpus_files", self.corpus_files, int)
        _check_type("seed", self.seed, int)
        _check_type("compare_single", self.compare_single, bool)
        _check_type("corpus_mb", self.corpus_mb, (int, float))
        _check_type("pattern", self.pattern, str)
        _check_type("output_dir", self.output_dir, str)
        if self.input_dir is not None:
            _check_type("input_dir", self.input_dir, str)
        _check_positive("workers", self.workers, "the number of worker processes, e.g. 2")
        _check_positive("top_k", self.top_k, "how many frequent words to show, e.g. 10")
        _check_positive("rounds", self.rounds, "use 1 for a single call per run")
        _check_positive("corpus_files", self.corpus_files, "e.g. 64")
        _check_positive("corpus_mb", self.corpus_mb, "e.g. 160, or 2 for a quick try")
        if self.backend not in BACKENDS:
            raise ValueError(
                f"backend={self.backend!r} is not known; use one of {', '.join(BACKENDS)}"
            )
        if self.input_dir is not None and not os.path.isdir(self.input_dir):
            raise ValueError(
                f"input_dir={self.input_dir!r} is not a directory; give a folder of text "
                f"files, or leave input_dir unset to count a generated corpus"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ParallelMapConfig:
        """Build a config from ``{field: value}``; an unknown key raises, naming the close ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=3)
                hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
                raise ValueError(
                    f"unknown config key {key!r}; {hint}known keys: {', '.join(known)}"
                )
        return cls(**values)

    @classmethod
    def small(cls, **overrides: Any) -> ParallelMapConfig:
        """A few-second run for tests and a first try: 8 files, 2 MB, 2 rounds."""
        values: dict[str, Any] = {"corpus_files": 8, "corpus_mb": 2.0, "rounds": 2}
        values.update(overrides)
        return cls.from_dict(values)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of the dataclass ``cls``, as one line per field.

    Read from the source, so the docstrings above stay the single description of
    every option (the command line shows them as ``--help``).
    """
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _check_type(name: str, value: Any, expected: type | tuple[type, ...]) -> None:
    # bool is an int in Python; a flag given where a count is expected is a mistake.
    wrong_bool = isinstance(value, bool) and expected is not bool
    if wrong_bool or not isinstance(value, expected):
        names = (
            " or ".join(t.__name__ for t in expected)
            if isinstance(expected, tuple)
            else expected.__name__
        )
        raise ValueError(f"{name}={value!r} is a {type(value).__name__}; it must be a {names}")


def _check_positive(name: str, value: float, example: str) -> None:
    if value <= 0:
        raise ValueError(f"{name}={value!r} must be positive; {example}")
