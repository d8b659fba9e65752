"""Bump one package's version and record the change in its CHANGELOG.md.

Usage::

    python tools/bump_version.py hf-protocol minor -m "DataProto.split accepts uneven sizes"

The ``version = "..."`` line of the package's pyproject.toml is edited in place (the
rest of the file is left byte for byte), and a ``## X.Y.Z — YYYY-MM-DD`` section
is added under the changelog's title, above the previous release. Bumping is plain
arithmetic on the release numbers (``major``: X+1.0.0, ``minor``: X.Y+1.0,
``patch``: X.Y.Z+1); any pre-release or dev suffix is dropped.

Afterwards every sibling whose declared range no longer admits the new version is
listed, with a widened range to copy. The bump itself still succeeds (exit 0);
``tools/check_versions.py`` keeps failing until those ranges are widened.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import date
from pathlib import Path

from check_versions import suggest_range
from packaging.version import Version
from workspace import REPO_ROOT, Package, Workspace, WorkspaceError, discover, load_package

PARTS = ("major", "minor", "patch")

# A table header such as ``[project]`` or ``[tool.hatch.build]`` (arrays of tables too).
_TABLE_HEADER = re.compile(r"^\s*\[\[?\s*([\w.\-\"' ]+?)\s*\]\]?\s*(#.*)?$")
# ``version = "0.1.0"`` with either quote style; group "value" is the version text.
_VERSION_LINE = re.compile(r"^(?P<key>\s*version\s*=\s*)(?P<q>[\"'])(?P<value>[^\"']*)(?P=q)")


def bumped(version: Version, part: str) -> Version:
    """The version after bumping ``part`` (one of :data:`PARTS`)."""
    major, minor, patch = (*version.release, 0, 0)[:3]
    if part == "major":
        return Version(f"{major + 1}.0.0")
    if part == "minor":
        return Version(f"{major}.{minor + 1}.0")
    if part == "patch":
        return Version(f"{major}.{minor}.{patch + 1}")
    raise ValueError(f"unknown part {part!r}; expected one of {', '.join(PARTS)}")


def set_project_version(text: str, new: Version) -> str:
    """``text`` (a pyproject.toml) with the ``[project]`` version set to ``new``.

    Only that one line changes. It is an error if ``[project]`` has no literal
    ``version = "..."`` line, or more than one.
    """
    lines = text.splitlines(keepends=True)
    table = ""
    hits: list[tuple[int, re.Match[str]]] = []
    for index, line in enumerate(lines):
        header = _TABLE_HEADER.match(line)
        if header:
            table = header.group(1).replace('"', "").replace("'", "").strip()
        elif table == "project" and (match := _VERSION_LINE.match(line)):
            hits.append((index, match))
    if len(hits) != 1:
        raise WorkspaceError(
            f'expected exactly one version = "..." line in [project], found {len(hits)}'
        )
    index, match = hits[0]
    line = lines[index]
    lines[index] = f"{match['key']}{match['q']}{new}{match['q']}{line[match.end() :]}"
    return "".join(lines)


def add_changelog_section(
    text: str, title: str, version: Version, day: date, messages: list[str]
) -> str:
    """``text`` (a CHANGELOG.md, possibly empty) with a new release section on top.

    The section goes right above the newest ``## `` section, i.e. under the title
    and any introduction; an empty changelog gets ``title`` as its heading.
    """
    if any(line.startswith(f"## {version} ") for line in text.splitlines()):
        raise WorkspaceError(f"the changelog already has a section for {version}")
    bullets = "".join(
        "- " + message.strip().removeprefix("- ").replace("\n", "\n  ") + "\n"
        for message in messages
    )
    section = f"## {version} — {day.isoformat()}\n\n{bullets}"
    if not text.strip():
        return f"# {title}\n\n{section}"
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if line.startswith("## "):
            return "".join(lines[:index]) + section + "\n" + "".join(lines[index:])
    return text.rstrip("\n") + "\n\n" + section


def broken_dependents(workspace: Workspace, package: Package) -> list[str]:
    """Messages for siblings whose range on ``package`` does not admit its version."""
    messages = []
    for dependent in workspace.topological_order():
        for declared in workspace.sibling_requirements(dependent):
            requirement = declared.requirement
            if workspace.get(requirement.name).key != package.key or requirement.url:
                continue  # path/URL references are check_versions' business
            if requirement.specifier.contains(package.version, prereleases=True):
                continue
            location = dependent.pyproject.relative_to(workspace.root)
            messages.append(
                f'{dependent.name} requires "{declared.text}" ({location}, {declared.where}), '
                f"which does not admit {package.name} {package.version}. "
                f'Widen it, e.g. to "{suggest_range(requirement, package.version)}".'
            )
    return messages


def main(argv: list[str] | None = None) -> int:
    """Bump a package version; return the process exit code."""
    parser = argparse.ArgumentParser(description="Bump a package version and its changelog.")
    parser.add_argument("package", help="package name, e.g. hf-protocol")
    parser.add_argument("part", choices=PARTS, help="which part of the version to bump")
    parser.add_argument(
        "-m",
        "--message",
        action="append",
        required=True,
        help="what changed (one changelog bullet; repeat for several)",
    )
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="workspace root")
    args = parser.parse_args(argv)
    messages = [m for m in args.message if m.strip()]
    if not messages:
        parser.error("the changelog message must not be empty")

    try:
        workspace = discover(args.root)
        package = workspace.get(args.package)
        new_version = bumped(package.version, args.part)
        changelog = package.path / "CHANGELOG.md"
        old_log = changelog.read_text(encoding="utf-8") if changelog.exists() else ""
        # Compute both new texts before writing either, so a failure changes nothing.
        # Bytes in and out, so line endings and everything else stay exactly as they were.
        old_text = package.pyproject.read_bytes().decode("utf-8")
        pyproject_text = set_project_version(old_text, new_version)
        log_text = add_changelog_section(
            old_log, f"Changelog — {package.name}", new_version, date.today(), messages
        )
        package.pyproject.write_bytes(pyproject_text.encode("utf-8"))
        changelog.write_text(log_text, encoding="utf-8")
        reread = load_package(package.pyproject)
    except WorkspaceError as error:
        print(f"bump_version: {error}", file=sys.stderr)
        return 1

    print(f"{package.name}: {package.version} -> {reread.version}")
    print(f"  updated {package.pyproject.relative_to(workspace.root)}")
    print(f"  updated {changelog.relative_to(workspace.root)}")
    broken = broken_dependents(discover(args.root), reread)
    for message in broken:
        print(f"ACTION NEEDED: {message}")
    if broken:
        print("Then run: python tools/check_versions.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
