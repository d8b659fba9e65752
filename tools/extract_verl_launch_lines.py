"""Extract the overrides of verl's example launch lines into a test table.

    python tools/extract_verl_launch_lines.py /path/to/verl VERL_COMMIT

Reads every ``*.sh`` under verl's ``examples/`` that runs ``verl.trainer.main_ppo`` (and the
quickstart's line in ``docs/start/quickstart.rst``), takes
the ``key=value`` words of that command (backslash continuations joined) and writes them,
per script, to ``packages/hf-algos/tests/data/verl_launch_lines.json``. Shell variables are
substituted: those the script assigns before the command (``${NAME:-default}`` falls back to
its default), ``$HOME`` as ``/home/user``; a variable left unknown is replaced by the
placeholder of :data:`PLACEHOLDERS` for the key's type (a number, a bool, a path). Only keys
and values are kept, none of the scripts' prose.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "packages/hf-algos/tests/data/verl_launch_lines.json"
_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(
    r"\$\{([A-Za-z0-9_]+)(?::?([-=+])([^}]*)|/([^}/]*)/?([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
)
_ARITHMETIC = re.compile(r"\$\(\(([^()]*(?:\([^()]*\)[^()]*)*)\)\)")
_LEFT = re.compile(r"\$\{[^}]*\}+")
"""A ``${...}`` the expansion left (nested defaults): a path here, never an interpolation."""
_COMMAND = re.compile(r"\$\(([^()]*)\)")
_KEY = re.compile(r"^[+~]{0,2}[A-Za-z_][A-Za-z0-9_.\[\]]*(=|$)")
_UNKNOWN = "@UNKNOWN@"
PLACEHOLDERS = {"path": "/home/user/verl_var", "number": "1", "bool": "False"}
"""What an unknown shell variable stands for, by the kind of key it is the value of."""


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    if current:
        lines.append(current)
    return lines


def _substitute(text: str, env: dict[str, str], unknown: str, depth: int = 0) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(6)
        if match.group(2) == "+":  # ${NAME:+word}: word when NAME is set
            return match.group(3) if env.get(name) else ""
        if name in env and env[name] != unknown:
            value = env[name]
            if match.group(4):  # ${NAME/pattern/replacement}
                value = value.replace(match.group(4), match.group(5), 1)
            return value
        if match.group(2) is not None:
            return _substitute(match.group(3), env, unknown, depth + 1)
        return unknown

    return _VAR.sub(replace, text) if depth < 5 else text


def _expand(text: str, env: dict[str, str], unknown: str) -> str:
    """Variables, ``$((arithmetic))`` (integer) and ``$(pwd)`` / ``$(date ...)`` expanded."""
    text = _substitute(text, env, unknown)

    def arithmetic(match: re.Match[str]) -> str:
        expression = re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*)\b", lambda m: env.get(m[1], "1"), match[1])
        if not re.fullmatch(r"[0-9+\-*/() ]+", expression):  # not plain integer arithmetic
            return unknown
        return str(int(eval(expression.replace("/", "//"), {"__builtins__": {}})))

    text = _ARITHMETIC.sub(arithmetic, text)
    commands = {"pwd": env["PWD"], "date": "20260129"}
    return _COMMAND.sub(
        lambda m: commands.get(m[1].split()[0] if m[1].split() else "", unknown), text
    )


def _placeholder(key: str) -> str:
    leaf = key.rsplit(".", 1)[-1]
    if any(w in leaf for w in ("path", "file", "dir", "name", "logger", "project", "model")):
        return PLACEHOLDERS["path"]
    if leaf.startswith(("use_", "enable", "enforce", "free_", "val_before")) or "offload" in leaf:
        return PLACEHOLDERS["bool"]
    return PLACEHOLDERS["number"]


def _unquote(value: str) -> str:
    try:
        words = shlex.split(value)
    except ValueError:
        return value.strip("'\"")
    return words[0] if len(words) == 1 else value.strip("'\"")


def extract(script: Path) -> list[str]:
    """The ``key=value`` overrides of the ``main_ppo`` command in ``script``."""
    env: dict[str, str] = {"HOME": "/home/user", "PWD": "/home/user/verl"}
    for line in _logical_lines(script.read_text(encoding="utf-8", errors="replace")):
        if "verl.trainer.main_ppo" not in line:
            match = _ASSIGN.match(line)
            if match and not match.group(2).startswith("("):
                value = _expand(match.group(2).split(" #")[0].strip(), env, _UNKNOWN)
                env[match.group(1)] = _unquote(value)
            continue
        command = _expand(line.split("verl.trainer.main_ppo", 1)[1], env, _UNKNOWN)
        try:
            words = shlex.split(command)
        except ValueError:  # an unbalanced quote: plain words
            words = command.split()
        overrides = []
        for word in words:
            if word in ("2>&1", "|", "&", "&&", ";") or word.startswith((">", "2>")):
                break
            if not _KEY.match(word) or "=" not in word:
                continue
            key, _, value = word.partition("=")
            value = _LEFT.sub(PLACEHOLDERS["path"], value.replace(_UNKNOWN, _placeholder(key)))
            overrides.append(f"{key}={value or _placeholder(key)}")
        return overrides
    return []


def main(argv: list[str]) -> int:
    """Write the table for the verl checkout at ``argv[0]``, from verl commit ``argv[1]``."""
    verl, commit = Path(argv[0]), argv[1]
    files = [verl / "docs/start/quickstart.rst", *sorted((verl / "examples").rglob("*.sh"))]
    scripts = {}
    for script in files:
        if "verl.trainer.main_ppo" in script.read_text(encoding="utf-8", errors="replace"):
            overrides = extract(script)
            if overrides:
                scripts[str(script.relative_to(verl))] = overrides
    OUT.parent.mkdir(parents=True, exist_ok=True)
    table = {"verl_commit": commit, "source": "github.com/volcengine/verl", "scripts": scripts}
    OUT.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"{len(scripts)} launch lines -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
