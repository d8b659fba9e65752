"""Run every fault-injection case and print the table of docs/reliability.md.

Each ``faults_*.py`` module beside this file lists its cases in ``FAULTS``
(:class:`faults.FaultCase`). Every case runs in its own scratch directory; a case that
raises is a failure of the system under test (a hang, a silent zero, a lost checkpoint),
and the script exits 1 after printing the table.

Run from the repository root (CI does, in tools/test_all.sh)::

    .venv/bin/python tools/reliability/run_faults.py
    .venv/bin/python tools/reliability/run_faults.py --only reward --output docs/reliability.md
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

from faults import FaultCase, FaultResult, first_line, stopwatch  # noqa: E402

TABLE_START = "<!-- fault table: start -->"
TABLE_END = "<!-- fault table: end -->"


def collect_cases(only: str | None = None) -> list[FaultCase]:
    """Every ``FAULTS`` entry of the ``faults_*.py`` modules, in file order."""
    cases: list[FaultCase] = []
    for path in sorted(HERE.glob("faults_*.py")):
        module = importlib.import_module(path.stem)
        cases.extend(module.FAULTS)
    return [case for case in cases if only is None or only in case.name]


def run_case(case: FaultCase, scratch: Path) -> FaultResult | str:
    """The case's result, or the failure text when the system under test misbehaved."""
    previous = Path.cwd()
    os.chdir(scratch)  # a run's default outputs (outputs/<project>/...) stay in the scratch
    with stopwatch() as elapsed:
        try:
            return case.run(scratch)
        except Exception as error:  # the table reports it; the exit code fails CI
            text = "".join(traceback.format_exception(error)[-4:])
            return f"FAILED after {elapsed():.1f} s: {first_line(text, 300)}\n{text}"
        finally:
            os.chdir(previous)


def render_table(rows: list[tuple[str, FaultResult | str]]) -> str:
    """A markdown table: fault, outcome, seconds, what was lost, what the user saw."""
    lines = [
        "| fault | outcome | time to error / recovery (s) | lost | what the user sees |",
        "|---|---|---:|---|---|",
    ]
    for name, result in rows:
        if isinstance(result, str):
            lines.append(f"| {name} | **FAILED** | | | {first_line(result)} |")
        else:
            detail = result.detail.replace("|", "\\|")
            lines.append(
                f"| {name} | {result.outcome} | {result.seconds:.1f} | {result.lost} | "
                f"{first_line(detail)} |"
            )
    return "\n".join(lines)


def write_into(document: Path, table: str, command: str) -> None:
    """Replace the table between the markers of ``document`` (added at the end if absent)."""
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
    )
    block = f"{TABLE_START}\nCommand: `{command}` ({machine})\n\n{table}\n{TABLE_END}"
    text = document.read_text() if document.exists() else ""
    if TABLE_START in text and TABLE_END in text:
        head, rest = text.split(TABLE_START, 1)
        text = head + block + rest.split(TABLE_END, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    document.write_text(text)


def main() -> int:
    """Run the cases, print the table, optionally write it into a document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only cases whose name contains this text")
    parser.add_argument("--output", type=Path, help="write the table into this markdown file")
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    rows: list[tuple[str, FaultResult | str]] = []
    for case in collect_cases(args.only):
        print(f"-- {case.name}", flush=True)
        with tempfile.TemporaryDirectory(prefix="hf-fault-") as scratch:
            result = run_case(case, Path(scratch))
        if isinstance(result, str):
            print(result, flush=True)
        rows.append((case.name, result))
    table = render_table(rows)
    print(table)
    if args.output is not None:
        command = "python tools/reliability/run_faults.py" + (
            f" --only {args.only}" if args.only else ""
        )
        write_into(args.output, table, command)
    return 1 if any(isinstance(result, str) for _, result in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
