"""Check that every sibling requirement admits the sibling's current version.

Workspace packages depend on each other by version range only
(``hf-protocol>=0.1,<0.2``), never by path or URL, so each one can be installed
from an index on its own. This script fails (exit 1) with one message per problem:

* a sibling referenced by path or URL (``hf-protocol @ file:///...``);
* a sibling with no version range at all (``hf-protocol``);
* a range that does not admit the sibling's current version.

Usage: ``python tools/check_versions.py [--root DIR]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import Specifier
from packaging.version import Version
from workspace import REPO_ROOT, DeclaredRequirement, Package, Workspace, WorkspaceError, discover


def next_breaking(version: Version) -> str:
    """The first version that may break users of ``version``: ``0.3`` for 0.2.x, ``2`` for 1.x."""
    major, minor = (*version.release, 0)[:2]
    return f"0.{minor + 1}" if major == 0 else f"{major + 1}"


def suggest_range(requirement: Requirement, version: Version) -> str:
    """``requirement`` rewritten with a range that admits ``version``.

    Lower bounds that still admit ``version`` are kept; the upper bound becomes the
    next breaking version (0.x minors are treated as breaking).
    """
    lower = [
        spec
        for spec in requirement.specifier
        if spec.operator in (">=", ">") and spec.contains(version, prereleases=True)
    ]
    if not lower:
        major, minor = (*version.release, 0)[:2]
        lower = [Specifier(f">={major}.{minor}")]
    specifier = ",".join([*map(str, lower), f"<{next_breaking(version)}"])
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    marker = f"; {requirement.marker}" if requirement.marker else ""
    return f"{requirement.name}{extras}{specifier}{marker}"


def check_requirement(
    workspace: Workspace, package: Package, declared: DeclaredRequirement
) -> str | None:
    """A message describing what is wrong with one sibling requirement, or ``None``."""
    requirement = declared.requirement
    sibling = workspace.get(requirement.name)
    where = f"{package.pyproject.relative_to(workspace.root)} ({declared.where})"
    example = suggest_range(requirement, sibling.version)
    if requirement.url:
        return (
            f'{package.name}: requirement "{declared.text}" in {where} points at a path or URL. '
            f"Siblings must be declared by version range so the package installs on its own. "
            f'Fix: replace it with "{example}" (current {sibling.name} is {sibling.version}).'
        )
    if not requirement.specifier:
        return (
            f'{package.name}: requirement "{declared.text}" in {where} has no version range. '
            f'Fix: declare a range that admits {sibling.name} {sibling.version}, e.g. "{example}".'
        )
    if not requirement.specifier.contains(sibling.version, prereleases=True):
        return (
            f'{package.name}: requirement "{declared.text}" in {where} does not admit the current '
            f"version of {sibling.name}, {sibling.version}. Fix: widen the range "
            f'(e.g. "{example}"), or bump {sibling.name} to a version inside it '
            f"(python tools/bump_version.py {sibling.name} ...)."
        )
    return None


def find_problems(workspace: Workspace) -> list[str]:
    """One message per bad sibling requirement in the whole workspace."""
    problems = []
    for package in workspace.topological_order():
        for declared in workspace.sibling_requirements(package):
            message = check_requirement(workspace, package, declared)
            if message:
                problems.append(message)
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the check; return the process exit code."""
    parser = argparse.ArgumentParser(
        description="Check that sibling version ranges admit current versions."
    )
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="workspace root")
    args = parser.parse_args(argv)
    try:
        workspace = discover(args.root)
        problems = find_problems(workspace)
    except WorkspaceError as error:
        print(f"check_versions: {error}", file=sys.stderr)
        return 1
    if problems:
        for message in problems:
            print(f"ERROR {message}", file=sys.stderr)
        print(f"check_versions: {len(problems)} problem(s) found.", file=sys.stderr)
        return 1
    edges = sum(len(workspace.sibling_requirements(p)) for p in workspace)
    listing = ", ".join(f"{p.name} {p.version}" for p in workspace.topological_order())
    print(f"check_versions: OK ({listing}); {edges} sibling requirement(s), all ranges admit.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
