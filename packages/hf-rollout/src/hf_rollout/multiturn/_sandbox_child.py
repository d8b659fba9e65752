"""The Python-expression sandbox's child process (run as a script, standard library only).

Started by :class:`hf_rollout.multiturn.python_tool.PythonSandbox` as
``python -I -S _sandbox_child.py MAX_MEMORY_MB`` so that it imports nothing from the
project, the user's site-packages or the working directory: it starts in tens of
milliseconds, and an expression finds nothing installed to reach. It caps its own address
space and forbids new processes before reading any input, then answers one JSON line per
JSON request line ``{"expression", "cpu_time_limit_s", "max_output_chars"}`` with
``{"ok": true, "value": TEXT}`` or ``{"ok": false, "error": "Type: message"}``. The parent
watches the wall clock and kills this process when an answer is late.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import json
import math
import resource
import signal
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1

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


def evaluate(expression: str, cpu_time_limit_s: float, max_output_chars: int) -> dict[str, Any]:
    """Evaluate one expression under a CPU-time limit; the answer as a JSON-able dict."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime + cpu_time_limit_s)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
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
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    if len(text) > max_output_chars:
        text = f"{text[:max_output_chars]}...[{len(text) - max_output_chars} more chars]"
    return {"ok": True, "value": text}


def _on_cpu_limit(signum: int, frame: Any) -> None:
    raise CpuTimeExceededError


def _confine(max_memory_mb: int) -> None:
    if sys.platform == "linux":  # die with the parent even when busy (EOF only ends a read)
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGXCPU, _on_cpu_limit)
    for limit, value in (
        (resource.RLIMIT_AS, max_memory_mb * 1024 * 1024),
        (resource.RLIMIT_NPROC, 0),  # no fork (not enforced for root)
        (resource.RLIMIT_CORE, 0),
    ):
        _, hard = resource.getrlimit(limit)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(limit, (value, value))


def main() -> None:
    """Confine this process, then answer requests from stdin until it closes."""
    _confine(int(sys.argv[1]))
    for line in sys.stdin:
        request = json.loads(line)
        answer = evaluate(
            request["expression"], request["cpu_time_limit_s"], request["max_output_chars"]
        )
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
