"""The Python-expression sandbox's child process (run as a script, standard library only).

Started by :class:`hf_rollout.multiturn.python_tool.PythonSandbox` as
``python -I -S _sandbox_child.py MAX_MEMORY_MB SANDBOX_PY`` so that it imports nothing from
the project, the user's site-packages or the working directory: it starts in tens of
milliseconds, and an expression finds nothing installed to reach. ``SANDBOX_PY`` is the path
of :mod:`hf_controller.sandbox` (standard library only), loaded as a file: the resource
limits shared with the reward's scoring processes. The child caps its own address space and
forbids new processes before reading any input, then answers one JSON line per
JSON request line ``{"expression", "cpu_time_limit_s", "max_output_chars"}`` with
``{"ok": true, "value": TEXT}`` or ``{"ok": false, "error": "Type: message"}``. The parent
watches the wall clock and kills this process when an answer is late.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import json
import math
import signal
import sys
from types import ModuleType
from typing import Any

SAFE_BUILTINS: dict[str, Any] = {
    name: getattr(builtins, name)
    for name in (
        "abs", "all", "any", "bool", "chr", "dict", "divmod", "enumerate", "filter",
        "float", "frozenset", "int", "len", "list", "map", "max", "min", "ord", "pow",
        "range", "repr", "reversed", "round", "set", "sorted", "str", "sum", "tuple", "zip",
        "ArithmeticError", "Exception", "IndexError", "KeyError", "TypeError", "ValueError",
        "ZeroDivisionError",
    )
}  # fmt: skip
"""The only names an expression sees besides ``math`` (no ``__import__``, ``open``,
``exec``, ``eval``, ``getattr``, ``type``, ``globals``)."""

# Attributes that reach interpreter internals without a leading underscore: frames and code
# of generators / coroutines / tracebacks, and str.format's field syntax ("{0.__class__}").
_FORBIDDEN_PREFIXES = ("_", "gi_", "cr_", "ag_", "f_", "tb_", "co_")
_FORBIDDEN_ATTRIBUTES = {"format", "format_map", "mro"}


class CpuTimeExceededError(Exception):
    """Raised in the expression by ``SIGXCPU`` (its CPU-time limit passed)."""


def check_expression(expression: str) -> ast.Expression:
    """The parsed expression, or a ``ValueError`` naming the forbidden name or attribute."""
    tree = ast.parse(expression.strip(), mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
            node.attr.startswith(_FORBIDDEN_PREFIXES) or node.attr in _FORBIDDEN_ATTRIBUTES
        ):
            raise ValueError(f"attribute {node.attr!r} is not allowed")
        if isinstance(node, ast.Name) and node.id.startswith("_"):
            raise ValueError(f"name {node.id!r} is not allowed")
    return tree


def evaluate(
    expression: str, cpu_time_limit_s: float, max_output_chars: int, sandbox: ModuleType
) -> dict[str, Any]:
    """Evaluate one expression under a CPU-time limit (set with ``sandbox``, the loaded
    :mod:`hf_controller.sandbox`); the answer as a JSON-able dict."""
    sandbox.allow_cpu_seconds(cpu_time_limit_s)
    try:
        tree = check_expression(expression)
        code = compile(tree, "<python tool>", "eval")
        value = eval(code, {"__builtins__": SAFE_BUILTINS, "math": math}, {})
        text = value if isinstance(value, str) else repr(value)
    except CpuTimeExceededError:
        return {"ok": False, "error": f"CPU-time limit of {cpu_time_limit_s} s exceeded"}
    except MemoryError:
        return {"ok": False, "error": "MemoryError: over the sandbox's memory limit"}
    except BaseException as error:  # whatever the expression raised is its answer
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    finally:
        # No limit while idle, so a late SIGXCPU cannot hit the reply or the next read.
        sandbox.lift_cpu_limit()
    if len(text) > max_output_chars:
        text = f"{text[:max_output_chars]}...[{len(text) - max_output_chars} more chars]"
    return {"ok": True, "value": text}


def _on_cpu_limit(signum: int, frame: Any) -> None:
    raise CpuTimeExceededError


def load_sandbox(path: str) -> ModuleType:
    """:mod:`hf_controller.sandbox` loaded from its file (this isolated interpreter cannot
    import hf_controller, and must not import its package)."""
    spec = importlib.util.spec_from_file_location("hf_controller_sandbox", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python module at {path!r}; pass hf_controller.sandbox.__file__")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    """Confine this process, then answer requests from stdin until it closes."""
    sandbox = load_sandbox(sys.argv[2])
    # dies with the parent even when busy (EOF only ends a read); no fork, no core files
    sandbox.confine(int(sys.argv[1]), lock=True)
    sandbox.forbid_new_processes()
    signal.signal(signal.SIGXCPU, _on_cpu_limit)
    for line in sys.stdin:
        request = json.loads(line)
        answer = evaluate(
            request["expression"],
            request["cpu_time_limit_s"],
            request["max_output_chars"],
            sandbox,
        )
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
