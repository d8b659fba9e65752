#!/usr/bin/env python3
"""Generate ``hf_algos/trainers/roles/protocols_generated.py``: the typed Protocols of the worker
groups, written from the worker classes themselves.

A worker group gets its methods at run time (``WorkerGroup`` binds every ``@register``-ed
method of its worker class), so the type checker cannot see them. The Protocols that say
what each role's group offers are therefore generated from the worker classes: every public
``@register``-ed method, with the worker method's parameters and docstring, and the return
type its dispatch mode gives the group call:

* ``DP_COMPUTE_PROTO`` (and a custom mode whose method returns a ``DataProto``, such as the
  engines' n-d ``ENGINE_DISPATCH``): the workers' outputs concatenated, one ``DataProto``;
* ``RANK_ZERO``: rank 0's result;
* every other mode: a list with one result per rank;
* ``blocking=False``: one handle per rank (``list[Any]``), to wait for.

Methods a role's base Protocol already declares (the weight channel's, from
:mod:`hf_rollout.weight_sync.link`) are left to it. A role that changes its worker class's
methods changes its Protocol by running this script; CI fails while the committed file is
stale (``tests/tools/test_gen_group_protocols.py``).

    python tools/gen_group_protocols.py            # (re)write the module
    python tools/gen_group_protocols.py --check    # exit 1 if the committed file is stale
"""

from __future__ import annotations

import argparse
import builtins
import importlib
import inspect
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_controller.decorator import Dispatch, MethodSpec, method_spec

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT = REPO_ROOT / "packages/hf-algos/src/hf_algos/trainers/roles/protocols_generated.py"


@dataclass(frozen=True)
class Role:
    """One role's Protocol: its name, worker class, base Protocols and docstring."""

    protocol: str
    worker: str
    """``module:Class`` of the worker class the group runs."""
    doc: str
    bases: tuple[str, ...] = ()
    """``module:Protocol`` bases; the methods they declare are not repeated."""


ROLES = (
    Role(
        "ActorGroup",
        "hf_algos.trainers.roles.sync_actor:SyncActorWorker",
        "The policy: :class:`~hf_algos.trainers.roles.sync_actor.SyncActorWorker` ranks "
        "(the weight "
        "channel's methods come from :class:`~hf_rollout.weight_sync.WeightSenderGroup`).",
        ("hf_rollout.weight_sync:WeightSenderGroup",),
    ),
    Role(
        "CriticGroup",
        "hf_engines.workers:CriticWorker",
        "The value model: :class:`hf_engines.workers.CriticWorker` ranks.",
    ),
    Role(
        "ReferenceGroup",
        "hf_engines.workers:ReferenceWorker",
        "The frozen initial policy: :class:`hf_engines.workers.ReferenceWorker` ranks.",
    ),
    Role(
        "RewardModelGroup",
        "hf_engines.workers:RewardModelWorker",
        "A value-head reward model: :class:`hf_engines.workers.RewardModelWorker` ranks.",
    ),
    Role(
        "RolloutGroup",
        "hf_rollout.workers:RolloutWorker",
        "Generation: :class:`hf_rollout.workers.RolloutWorker` ranks (``world_size``, "
        "``wait_results`` and the weight methods come from "
        ":class:`~hf_rollout.weight_sync.WeightReceiverGroup`, ``execute_all_async`` from "
        ":class:`AsyncCalls`).",
        (
            "hf_rollout.weight_sync:WeightReceiverGroup",
            "hf_algos.trainers.roles.protocols_generated:AsyncCalls",
        ),
    ),
)

ASYNC_CALLS = '''
class AsyncCalls(Protocol):
    """A group's own call that starts a method on every rank without waiting
    (:meth:`hf_controller.WorkerGroup.execute_all_async`)."""

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every rank (a world-size list goes one entry per rank);
        one handle per rank, to wait for (the async modes' generations)."""
        ...
'''

SAME_AS_WORKER = {
    Dispatch.DP_COMPUTE_PROTO,
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
    Dispatch.RANK_ZERO,
}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def load(target: str) -> Any:
    """The object ``module:name`` names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def protocol_methods(protocol: type) -> set[str]:
    """Public methods a Protocol (and its Protocol bases) declares."""
    return {
        name
        for klass in protocol.__mro__
        if klass.__module__ not in ("typing", "builtins")
        for name, value in vars(klass).items()
        if callable(value) and not name.startswith("_")
    }


def registered_methods(worker: type) -> list[tuple[str, Any, MethodSpec]]:
    """The worker class's public ``@register``-ed methods in the order their first class
    defines them (base classes first), each as the most derived class defines it."""
    seen: dict[str, tuple[Any, MethodSpec]] = {}
    for klass in reversed(worker.__mro__):
        for name, value in vars(klass).items():
            spec = method_spec(value)
            if spec is not None and not name.startswith("_"):
                seen[name] = (value, spec)  # an override keeps the base's place
    return [(name, function, spec) for name, (function, spec) in seen.items()]


def return_type(annotation: str, spec: MethodSpec) -> str:
    """What the group call returns, given the worker method's return ``annotation``."""
    if not spec.blocking:
        return "list[Any]"
    mode = spec.dispatch_mode
    if isinstance(mode, dict):  # a custom mode: DataProto methods collect one DataProto
        return annotation if annotation == "DataProto" else f"list[{annotation}]"
    if mode in SAME_AS_WORKER:
        return annotation
    return f"list[{annotation}]"


def parameter_list(function: Any) -> str:
    """The worker method's parameters as source text (``self`` first)."""
    parts, keyword_marked = ["self"], False
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "self" or parameter.name.startswith("_"):
            continue
        text = parameter.name
        if parameter.annotation is not inspect.Parameter.empty:
            text += f": {parameter.annotation}"
        if parameter.default is not inspect.Parameter.empty:
            text += f" = {parameter.default!r}"
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            text, keyword_marked = "*" + text, True
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            text = "**" + text
        elif parameter.kind is inspect.Parameter.KEYWORD_ONLY and not keyword_marked:
            parts.append("*")
            keyword_marked = True
        parts.append(text)
    return ", ".join(parts)


def imports_of(annotation: str, function: Any, found: dict[str, str]) -> None:
    """Record in ``found`` (name -> import line) what the names in ``annotation`` need."""
    namespace = inspect.unwrap(function).__globals__
    for dotted in IDENTIFIER.findall(annotation):
        head = dotted.split(".")[0]
        if head in ("None", "Any") or hasattr(builtins, head):
            continue
        value = namespace.get(head)
        if value is None:
            raise SystemExit(f"{function.__qualname__}: cannot resolve {head!r} in {annotation!r}")
        if inspect.ismodule(value):
            found[head] = f"import {value.__name__}" + (
                "" if value.__name__ == head else f" as {head}"
            )
        else:
            found[head] = f"from {value.__module__} import {value.__qualname__}"


def render_method(name: str, function: Any, spec: MethodSpec, found: dict[str, str]) -> str:
    """One Protocol method: the worker's parameters and docstring, the group's return."""
    signature = inspect.signature(function)
    annotation = signature.return_annotation
    annotation = "None" if annotation is inspect.Signature.empty else str(annotation)
    for parameter in signature.parameters.values():
        if parameter.annotation is not inspect.Parameter.empty and parameter.name != "self":
            imports_of(str(parameter.annotation), function, found)
    returned = return_type(annotation, spec)
    imports_of(returned, function, found)
    doc = inspect.getdoc(function) or f"The workers' ``{name}``."
    body = textwrap.indent(f'"""{doc}"""\n...', " " * 8)
    return f"    def {name}({parameter_list(function)}) -> {returned}:\n{body}\n"


def render_role(role: Role, found: dict[str, str], runtime: dict[str, str]) -> str:
    """One role's Protocol class (``found``: the annotations' imports; ``runtime``: the
    base Protocols' imports)."""
    bases = [target.partition(":")[2] for target in role.bases]
    inherited: set[str] = set()
    for target in role.bases:
        module, _, name = target.partition(":")
        if module == "hf_algos.trainers.roles.protocols_generated":  # AsyncCalls, in this module
            inherited.add("execute_all_async")
            continue
        runtime[name] = f"from {module} import {name}"
        inherited |= protocol_methods(load(target))
    worker = load(role.worker)
    methods = [
        render_method(name, function, spec, found)
        for name, function, spec in registered_methods(worker)
        if name not in inherited
    ]
    header = f"class {role.protocol}({', '.join([*bases, 'Protocol'])}):"
    doc = textwrap.indent(textwrap.fill(f'"""{role.doc}"""', width=88), "    ")
    return "\n".join([header, doc, "", "\n".join(methods)])


def render() -> str:
    """The whole module, formatted as ``ruff format`` writes it."""
    found: dict[str, str] = {}
    runtime_found: dict[str, str] = {}
    classes = [render_role(role, found, runtime_found) for role in ROLES]
    runtime = sorted(runtime_found.values())
    typing_only = sorted(line for name, line in found.items() if name not in runtime_found)
    text = "\n".join(
        [
            '"""The worker groups\' typed Protocols, GENERATED by tools/gen_group_protocols.py '
            "from\nthe worker classes: do not edit; run the script after changing a worker's "
            "``@register``-ed\nmethods. How the dispatch mode gives each call's return type: "
            'the script\'s docstring."""',
            "",
            "from __future__ import annotations",
            "",
            "from typing import TYPE_CHECKING, Any, Protocol",
            "",
            *runtime,
            "",
            "if TYPE_CHECKING:",
            *(f"    {line}" for line in typing_only),
            "",
            ASYNC_CALLS,
            *(f"\n{cls}" for cls in classes),
        ]
    )
    return format_source(text)


def format_source(text: str) -> str:
    """``text`` as ``ruff format`` (the repository's settings) writes it."""
    ruff = [sys.executable, "-m", "ruff"]
    where = ["--stdin-filename", str(OUTPUT), "-"]
    sort_imports = [*ruff, "check", "--fix-only", "--quiet", "--select", "I", *where]
    for command in (sort_imports, [*ruff, "format", *where]):
        text = subprocess.run(
            command, input=text, capture_output=True, text=True, check=True, cwd=REPO_ROOT
        ).stdout
    return text


def main() -> int:
    """Write the module, or with ``--check`` exit 1 when the committed one is stale."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT} is stale; run python tools/gen_group_protocols.py", file=sys.stderr)
            return 1
        print(f"{OUTPUT} is up to date")
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
