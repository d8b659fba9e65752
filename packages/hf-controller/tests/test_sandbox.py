"""hf_controller.sandbox in real child processes: the limits it sets, loaded both as a module
and by its file path from an isolated interpreter (as the python tool's child loads it)."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

from hf_controller import sandbox

CHILD = textwrap.dedent(
    """
    import importlib.util, resource, signal, sys

    spec = importlib.util.spec_from_file_location("sandbox_by_path", sys.argv[1])
    sandbox = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sandbox)
    sandbox.confine(256, lock=True)
    sandbox.forbid_new_processes()
    print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CORE))
    print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
    sandbox.allow_cpu_seconds(3)
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = resource.getrlimit(resource.RLIMIT_CPU)[0]
    print(3 <= soft - (used.ru_utime + used.ru_stime) < 4)  # whole seconds, rounded up
    sandbox.lift_cpu_limit()
    print(resource.getrlimit(resource.RLIMIT_CPU)[0] == resource.getrlimit(resource.RLIMIT_CPU)[1])
    try:
        bytearray(512 * 1024 * 1024)
    except MemoryError:
        print("MemoryError")
    """
)


def test_an_isolated_child_loads_the_file_and_is_confined() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", CHILD, sandbox.__file__],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    cap = 256 * 1024 * 1024
    assert done.stdout.splitlines() == [
        f"({cap}, {cap}) (0, 0)",  # locked: the hard limits are lowered too
        "True",
        "True",
        "True",
        "MemoryError",
    ]


def test_the_scoring_processes_cap_keeps_the_hard_limit() -> None:
    code = (
        "import resource; from hf_controller import sandbox; sandbox.confine(512);"
        "print(resource.getrlimit(resource.RLIMIT_AS))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    soft, hard = eval(done.stdout)
    assert soft == 512 * 1024 * 1024 and hard == resource.getrlimit(resource.RLIMIT_AS)[1]
