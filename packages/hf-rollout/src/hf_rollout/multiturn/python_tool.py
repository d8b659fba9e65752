"""The Python-expression tool (``<python>EXPR</python>``): a sandbox of reused child processes.

Each expression runs in a child interpreter (``_sandbox_child.py``, started with ``-I -S``)
that caps its address space, forbids new processes and sets a CPU-time limit per call
(with :mod:`hf_controller.sandbox`, the limits the reward's scoring processes use too); the
expression sees a whitelist of builtins and ``math``, never a name or attribute starting with
``_`` (nor frame / code attributes, nor ``str.format``). The parent adds a wall-clock
timeout: a late child is killed and replaced, and its call is an error the model sees.

This is defence in depth against a policy's accidental damage (an infinite loop, a huge
allocation, a stray import), not a security boundary against a determined attacker: run
untrusted agents' code in a container.

Start cost: a child starts in about 30-60 ms (a bare interpreter); a warm call costs well
under a millisecond plus the expression, so children are kept (up to ``max_workers``) and
reused across calls and episodes. ``close()`` (or the finalizer, at the latest at exit)
ends them; a child also dies with its parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from hf_controller import sandbox as _sandbox
from hf_rollout.multiturn.environment import register_environment
from hf_rollout.multiturn.tools import Tool, ToolEnvironment, ToolError, register_tool

__all__ = ["PYTHON_TOOL", "PythonEnvironment", "PythonSandbox", "default_python_sandbox"]

_CHILD = Path(__file__).with_name("_sandbox_child.py")


class _Child:
    """One sandbox process and its pipes."""

    def __init__(self, max_memory_mb: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_CHILD), str(max_memory_mb), _sandbox.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self.buffer = b""

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The child's answer to ``request``; None when it is late or died (then killed)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return None
        deadline = time.monotonic() + timeout_s
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # the child died (killed by the kernel at a hard limit)
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def kill(self) -> None:
        """End the process now and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a request still buffered, child dead
                    pipe.close()


class _Spawner:
    """Starts sandbox children from one long-lived thread.

    A child's ``PR_SET_PDEATHSIG`` fires when the *thread* that started it ends, not the
    process: children started by the agent loop's short-lived step threads would die with
    them. This thread (a daemon) lives as long as the process.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[int, Future[_Child]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def spawn(self, max_memory_mb: int) -> _Child:
        """A new child, started on the spawner thread."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="hf-python-sandbox-spawner", daemon=True
                )
                self._thread.start()
        result: Future[_Child] = Future()
        self._requests.put((max_memory_mb, result))
        return result.result()

    def _serve(self) -> None:
        while True:
            max_memory_mb, result = self._requests.get()
            try:
                result.set_result(_Child(max_memory_mb))
            except BaseException as error:  # OSError and the like: the caller raises it
                result.set_exception(error)


_spawner = _Spawner()


def _close_children(children: list[_Child], lock: threading.Lock) -> None:
    with lock:
        idle, children[:] = list(children), []
    for child in idle:
        child.kill()


class PythonSandbox:
    """Evaluates Python expressions in reused, confined child processes.

    ``run`` may be called from many threads: at most ``max_workers`` children run at once
    (a call waits for a free one). Each call gets ``timeout_s`` of wall-clock time and
    ``cpu_time_limit_s`` of CPU time; each child ``max_memory_mb`` of address space. The
    value's text (``str`` for a string, else ``repr``) is cut at ``max_output_chars``.
    """

    def __init__(
        self,
        max_workers: int = 4,
        timeout_s: float = 5.0,
        cpu_time_limit_s: float = 2.0,
        max_memory_mb: int = 256,
        max_output_chars: int = 512,
    ) -> None:
        limits = {
            "max_workers": max_workers,
            "timeout_s": timeout_s,
            "cpu_time_limit_s": cpu_time_limit_s,
            "max_memory_mb": max_memory_mb,
            "max_output_chars": max_output_chars,
        }
        bad = {name: value for name, value in limits.items() if not value > 0}
        if bad:
            raise ValueError(f"PythonSandbox limits must be positive, got {bad}")
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self.cpu_time_limit_s = cpu_time_limit_s
        self.max_memory_mb = max_memory_mb
        self.max_output_chars = max_output_chars
        self._slots = threading.Semaphore(max_workers)
        self._lock = threading.Lock()
        self._idle: list[_Child] = []
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_children, self._idle, self._lock)

    def run(self, expression: str) -> str:
        """The value of ``expression`` as text; a :class:`ToolError` when it raises, is
        refused, or passes a limit (the message is what the model sees)."""
        request = {
            "expression": expression,
            "cpu_time_limit_s": self.cpu_time_limit_s,
            "max_output_chars": self.max_output_chars,
        }
        with self._slots:
            child = self._take()
            answer = child.ask(request, self.timeout_s)
            if answer is None:
                code = child.process.poll()
                child.kill()
                if code is None:
                    raise ToolError(f"timed out after {self.timeout_s} s")
                raise ToolError(f"the sandbox process ended (exit code {code}): over a limit")
            self._give_back(child)
        if not answer["ok"]:
            raise ToolError(str(answer["error"]))
        return str(answer["value"])

    def close(self) -> None:
        """End every child process (in-flight calls finish first, then end theirs)."""
        with self._lock:
            self._closed = True
        self._finalizer()

    def __enter__(self) -> PythonSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self) -> _Child:
        with self._lock:
            if self._closed:
                raise ToolError("the python sandbox is closed")
            while self._idle:
                child = self._idle.pop()
                if child.process.poll() is None:
                    return child
                child.kill()  # died while idle (killed from outside): reap it, take another
        return _spawner.spawn(self.max_memory_mb)

    def _give_back(self, child: _Child) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(child)
                return
        child.kill()


_default: PythonSandbox | None = None
_default_lock = threading.Lock()


def default_python_sandbox() -> PythonSandbox:
    """The sandbox the registered ``python`` tool uses (default limits), made on first use."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = PythonSandbox()
        return _default


def _run_python(expression: str) -> str:
    return default_python_sandbox().run(expression)


PYTHON_TOOL = register_tool(
    Tool(
        name="python",
        description=(
            "Evaluate one Python expression (builtins such as len, sorted, sum, range, and "
            "math) in a sandbox with time and memory limits; no imports, files or statements."
        ),
        run=_run_python,
        parameters={
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "e.g. sorted([3, 1, 2])[0]"}
            },
            "required": ["expression"],
        },
    )
)


@register_environment("python")
class PythonEnvironment(ToolEnvironment):
    """Answers ``<python>EXPR</python>`` in a model turn with ``<result>VALUE</result>``
    (or ``<error>...</error>``); a turn without a call ends the episode."""

    def __init__(self) -> None:
        super().__init__(tools=("python",))
