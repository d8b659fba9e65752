"""The code blocks of the docs and READMEs, and how to run one (tests/docs/test_doc_snippets.py).

Every fenced ``python``, ``bash``, ``sh``, ``shell`` or ``console`` block of the pages listed
by :func:`pages` either runs in a test or carries a mark, an HTML comment on the line right
before its opening fence (invisible when the page is rendered)::

    <!-- snippet: skip: needs a GPU -->
    <!-- snippet: covered-by tests/recipes/test_quickstart.py::test_quickstart_smoke -->
    <!-- snippet: file my_reward.py -->

- no mark: the block runs, and must succeed;
- ``skip: <reason>``: the block is not run; the reason says why (a GPU, a cluster, the network,
  a file of the reader's own);
- ``covered-by <test file>::<test function> ...``: the block is not run here because those
  tests (one or more, space-separated) already run it or its short version; each test file
  and function must exist;
- ``file <name>``: the block is the content of a file the page tells the reader to write;
  it is written under that name and run (``python <name>``), so later blocks can use it.

Blocks that are not run are still checked for syntax (``compile`` / ``bash -n``).
The blocks of one page run in order in one temporary directory, so a later block sees the
files an earlier block wrote. ``python`` blocks run as a script in a fresh interpreter;
shell blocks run with ``bash -euo pipefail``; both with the dev environment's ``bin`` first on
``PATH`` (``python`` and ``hybridflow`` are the ones of the workspace) and the workspace's
sources on ``PYTHONPATH``. A ``console`` block runs its ``$ ``-prefixed lines only.

    python tools/doc_snippets.py            # one line per block: page:line language mark
    python tools/doc_snippets.py --run docs/cli.md   # run the runnable blocks of one page
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

PAGE_GLOBS = (
    "README.md",
    "DEVELOPERS.md",
    "docs/*.md",
    "docs/guides/*.md",
    "packages/*/README.md",
    "recipes/*/README.md",
)
"""The pages whose code blocks are checked, relative to the repository root."""

RUN_LANGUAGES = frozenset({"python", "bash", "sh", "shell", "console"})
"""Fence languages whose blocks are executed (or marked); other languages are only text."""

SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})

DEFAULT_TIMEOUT_S = 300.0
"""The most one block may take before the test fails it: a guard against a hang, not a
speed check (a block that trains runs for about a minute on a quiet 2-core machine and
several times that when CI runs its two lanes at once)."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*snippet:(?P<body>.*?)-->\s*$")
MARK_LINE = re.compile(r"^\s*<!--\s*snippet\b")
"""A line that is a snippet mark (a mark quoted inside a line of prose is not one)."""
_COVERED = re.compile(
    r"^(?P<file>(?:packages/[\w.-]+/)?tests/[\w./-]+\.py)::(?P<func>[A-Za-z_]\w*)$"
)
_FILE_NAME = re.compile(r"^[\w.-]+\.(?:py|sh|yaml|json|jsonl)$")


class MarkError(ValueError):
    """A ``<!-- snippet: ... -->`` comment that is malformed or is not right before a fence."""


@dataclass(frozen=True)
class Mark:
    """What to do with a block: ``run`` (no mark), ``file``, ``skip`` or ``covered-by``."""

    kind: str
    value: str = ""
    """``skip``: why the block is not run. ``covered-by``: ``tests/...py::test_name`` (several
    separated by spaces). ``file``: the file name the block is written to."""


RUN = Mark("run")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    """Path relative to the repository root, with ``/``."""
    line: int
    """1-based line of the opening fence."""
    language: str
    code: str
    mark: Mark

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and self.mark.kind in ("run", "file")


def pages(root: Path = REPO_ROOT) -> list[Path]:
    """Every page whose blocks are checked, sorted, without duplicates."""
    found: set[Path] = set()
    for pattern in PAGE_GLOBS:
        found.update(root.glob(pattern))
    return sorted(found)


def parse_mark(text: str) -> Mark:
    """The mark of one ``<!-- snippet: ... -->`` line; :class:`MarkError` if malformed."""
    match = _MARK.match(text)
    if match is None:
        raise MarkError(f"not a snippet mark on one line: {text.strip()!r}")
    body = match.group("body").strip()
    kind, _, rest = body.partition(" ")
    rest = rest.strip()
    if kind == "skip:" or body == "skip:":
        if not rest:
            raise MarkError("'skip:' needs a reason: <!-- snippet: skip: needs a GPU -->")
        return Mark("skip", rest)
    if kind == "covered-by":
        targets = rest.split()
        bad = [target for target in targets if _COVERED.match(target) is None]
        if not targets or bad:
            raise MarkError(
                "'covered-by' needs one or more <path>/tests/<file>.py::<test function>, "
                f"not {rest!r}"
            )
        return Mark("covered-by", " ".join(targets))
    if kind == "file":
        if _FILE_NAME.match(rest) is None:
            raise MarkError(f"'file' needs a plain file name such as my_reward.py, not {rest!r}")
        return Mark("file", rest)
    raise MarkError(
        f"unknown snippet mark {body!r}: use 'skip: <reason>', "
        "'covered-by tests/<file>.py::<test>' or 'file <name>'"
    )


def _located_mark(text: str, page: str, line: int) -> Mark:
    try:
        return parse_mark(text)
    except MarkError as error:
        raise MarkError(f"{page}:{line}: {error}") from None


def parse_page(path: Path, root: Path = REPO_ROOT) -> list[Block]:
    """The fenced blocks of one page, each with its mark.

    Raises :class:`MarkError` for a malformed mark, a mark that is not on the line right
    before an opening fence, or a mark on a block of a language that is never run.
    """
    page = path.resolve().relative_to(root.resolve()).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        text = lines[index]
        if MARK_LINE.search(text):
            _located_mark(text, page, index + 1)
            opening = _FENCE.match(lines[index + 1]) if index + 1 < len(lines) else None
            if opening is None:
                raise MarkError(
                    f"{page}:{index + 1}: a snippet mark must be on the line right before "
                    "a code fence"
                )
            index += 1
            continue
        opening = _FENCE.match(text)
        if opening is None:
            index += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        info = opening.group("info").strip()
        language = info.split()[0].lower() if info else ""
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = lines[end].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        mark = RUN
        if index > 0 and MARK_LINE.search(lines[index - 1]):
            mark = _located_mark(lines[index - 1], page, index)
            if language not in RUN_LANGUAGES:
                raise MarkError(
                    f"{page}:{index + 1}: a snippet mark on a {language or 'plain'} block, "
                    "which is never run"
                )
        blocks.append(Block(page, index + 1, language, "\n".join(body) + "\n", mark))
        index = end + 1
    return blocks


def missing_tests(targets: str, root: Path = REPO_ROOT) -> list[str]:
    """The ``file.py::function`` targets (space-separated) that name no existing test."""
    missing = []
    for target in targets.split():
        file_name, _, function = target.partition("::")
        path = root / file_name
        names: set[str] = set()
        if path.is_file():
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = {
                node.name
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
        if function not in names:
            missing.append(target)
    return missing


def syntax_error(block: Block) -> str | None:
    """Why a block that is not run does not even parse (``None`` when it does)."""
    if block.language == "python":
        try:
            compile(block.code, block.where, "exec")
        except SyntaxError as error:
            return f"{block.where}: python syntax error: {error}"
        return None
    done = subprocess.run(
        ["bash", "-n"], input=shell_code(block), capture_output=True, text=True, check=False
    )
    return f"{block.where}: bash syntax error: {done.stderr}" if done.returncode else None


def snippet_env(root: Path = REPO_ROOT) -> dict[str, str]:
    """The environment a block runs in: the dev venv's ``bin`` first, the sources importable."""
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    sources = [str(src) for src in sorted(root.glob("packages/*/src"))]
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([*sources, str(root), *([existing] if existing else [])])
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["HF_HUB_OFFLINE"] = "1"  # a block that needs the network is marked, not run
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def shell_code(block: Block) -> str:
    """The commands of a shell block (a ``console`` block: its ``$`` lines, prompt removed)."""
    if block.language != "console":
        return block.code
    commands = [line[2:] for line in block.code.splitlines() if line.startswith("$ ")]
    return "\n".join(commands) + "\n"


@dataclass(frozen=True)
class Outcome:
    block: Block
    returncode: int
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def report(self) -> str:
        tail = self.output[-4000:]
        return (
            f"{self.block.where}: {self.block.language} block exited {self.returncode} "
            f"after {self.seconds:.1f}s\n--- block ---\n{self.block.code}--- output ---\n{tail}"
        )


def run_block(
    block: Block,
    workdir: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    root: Path = REPO_ROOT,
) -> Outcome:
    """Run one block in ``workdir``; a timeout is an :class:`Outcome` with return code 124."""
    if block.language not in RUN_LANGUAGES:
        raise ValueError(f"{block.where}: {block.language!r} blocks are not run")
    if block.mark.kind == "file":
        script_name = block.mark.value
    else:
        script_name = f"snippet_{block.line}.{'py' if block.language == 'python' else 'sh'}"
    (workdir / script_name).write_text(
        block.code if block.language == "python" else shell_code(block), encoding="utf-8"
    )
    if block.language == "python":
        command = [sys.executable, script_name]
    else:
        command = ["bash", "-euo", "pipefail", script_name]
    start = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=workdir,
        env=snippet_env(root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # on a timeout, everything the block started is killed too
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return Outcome(block, 124, f"{output}\n[timed out after {timeout_s:.0f}s]", timeout_s)
    return Outcome(block, process.returncode, output, time.monotonic() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", metavar="PAGE", help="run the runnable blocks of this page")
    args = parser.parse_args(argv)
    if args.run:
        blocks = [b for b in parse_page(REPO_ROOT / args.run) if b.runs]
        failed = 0
        with tempfile.TemporaryDirectory(prefix="doc-snippets-") as tmp:
            for block in blocks:
                outcome = run_block(block, Path(tmp))
                print(
                    f"{block.where} {block.language}: rc={outcome.returncode} "
                    f"{outcome.seconds:.1f}s"
                )
                if not outcome.ok:
                    print(outcome.report())
                    failed += 1
        return 1 if failed else 0
    for path in pages():
        for block in parse_page(path):
            if block.language in RUN_LANGUAGES:
                detail = f" {block.mark.value}" if block.mark.value else ""
                print(f"{block.where} {block.language} {block.mark.kind}{detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
