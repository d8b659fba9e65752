"""A scoring function loaded from a user's Python file by path (``reward.function_path``).

verl's ``custom_reward_function.path`` / ``.name``: the file need not be importable (no
package, not on ``sys.path``). It is loaded in the driver when the run is built, so a file
that is missing, fails to import or lacks the function stops set-up within seconds, and
loaded again by path in each scoring process (the function travels as ``(path, name)``, not
by value), so module-level state of the file (compiled patterns, lookup tables) is built
once per process like an imported module's.

A function whose parameters include ``completions`` is TRL's batched form
(``fn(completions, **kwargs) -> list[float]``); set ``fn.batched = True`` / ``False`` on the
function to say so explicitly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from hf_controller import ConfigurationError

_MODULES: dict[str, ModuleType] = {}
"""Files already loaded in this process, by absolute path."""


class RewardFileError(ConfigurationError):
    """``reward.function_path`` / ``reward.function_name`` do not give a usable function
    (a user error: the ``hybridflow`` command prints it alone and exits 2)."""


def load_module(path: str) -> ModuleType:
    """The module of the Python file at ``path`` (loaded once per process).

    The file's directory is put on ``sys.path`` first, so it may import helper modules
    that sit next to it.
    """
    file = Path(path).expanduser().resolve()
    key = str(file)
    if key in _MODULES:
        return _MODULES[key]
    if not file.is_file():
        raise RewardFileError(
            f"reward.function_path={path!r} ({key}) is not a file; give the path of a Python "
            f"file defining the scoring function (relative paths are taken from the working "
            f"directory {str(Path.cwd())!r})"
        )
    # A name unique to the file, so two reward files both called reward.py do not collide.
    name = f"hf_user_reward_{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise RewardFileError(
            f"reward.function_path={path!r} cannot be loaded as Python; name it *.py"
        )
    module = importlib.util.module_from_spec(spec)
    if str(file.parent) not in sys.path:
        sys.path.append(str(file.parent))
    sys.modules[name] = module  # dataclasses / pickling inside the file look themselves up
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # Ctrl-C still stops the run
        sys.modules.pop(name, None)
        raise RewardFileError(
            f"reward.function_path={path!r} failed to import: {type(error).__name__}: "
            f"{error}. Fix the file (run `python {key}` to see the full traceback)"
        ) from error
    _MODULES[key] = module
    return module


def load_function(path: str, name: str) -> Callable[..., Any]:
    """``name`` from the file at ``path`` (see :func:`load_module`); raises
    :class:`RewardFileError` naming the path, the name and the fix."""
    return load_functions(path, [name])[0]


def load_functions(path: str, names: Sequence[str]) -> list[Callable[..., Any]]:
    """The functions ``names`` from the file at ``path`` (see :func:`load_module`); every
    name the file lacks (or binds to something not callable) is reported in one
    :class:`RewardFileError` listing the file's functions."""
    module = load_module(path)
    values: dict[str, Any] = {name: getattr(module, name, None) for name in names}
    absent = [n for n, v in values.items() if v is None]
    uncallable = [n for n, v in values.items() if v is not None and not callable(v)]
    if not absent and not uncallable:
        return [values[name] for name in names]
    found = sorted(
        attr
        for attr, value in vars(module).items()
        if inspect.isfunction(value) and not attr.startswith("_")
    )
    problems = []
    if absent:
        problems.append(_problem("has no function", absent))
    if uncallable:
        problems.append(_problem("defines a non-callable", uncallable))
    which = "one of them" if len(names) == 1 else "names among them"
    raise RewardFileError(
        f"reward.function_path={path!r} {' and '.join(problems)}; its functions are {found}. "
        f"Set reward.function_name to {which} (verl: custom_reward_function.name)"
    )


def _problem(what: str, names: list[str]) -> str:
    """``has no function 'a'`` for one name, ``has no functions ['a', 'b']`` for several."""
    if len(names) == 1:
        return f"{what} {names[0]!r}"
    plural = what + "s" if what.endswith("function") else what
    return f"{plural} {names}"


def is_batched(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` scores many samples per call: its ``batched`` attribute when set, else
    whether it takes ``completions`` (TRL's form)."""
    flag = getattr(fn, "batched", None)
    if isinstance(flag, bool):
        return flag
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class FileScoringFunction:
    """A scoring function named by file path and name; pickles as ``(path, name)``.

    Calling it calls the function (loaded on first use in each process). Its signature is
    the function's, so :func:`~hf_algos.rewards.signature.scoring_call` reads the fields
    it wants.
    """

    def __init__(self, path: str, name: str = "compute_score") -> None:
        self.path = str(Path(path).expanduser().resolve())
        self.name = name
        self._fn: Callable[..., Any] | None = None
        self.__signature__ = inspect.signature(self.function)
        self.__module__ = self.function.__module__
        self.__qualname__ = f"{Path(self.path).name}:{name}"

    @property
    def function(self) -> Callable[..., Any]:
        """The user's function (loaded on first access)."""
        if self._fn is None:
            self._fn = load_function(self.path, self.name)
        return self._fn

    @property
    def batched(self) -> bool:
        """Whether the function is TRL's batched form (see :func:`is_batched`)."""
        return is_batched(self.function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the user's function."""
        return self.function(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return FileScoringFunction, (self.path, self.name)

    def __repr__(self) -> str:
        return f"FileScoringFunction({self.path!r}, {self.name!r})"
