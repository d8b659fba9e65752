"""Read the HybridFlow workspace: which packages exist and how they depend on each other.

A package is any directory ``packages/<dir>/`` holding a ``pyproject.toml`` with a
static ``[project]`` name and version. A *sibling requirement* is a requirement of
one workspace package on another, found in ``dependencies`` or in any
``optional-dependencies`` extra.

Only the standard library and ``packaging`` are used, so the tools run before
anything else is installed.
"""

from __future__ import annotations

import graphlib
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import InvalidVersion, Version

#: The repository root, when the tools are used from their own checkout.
REPO_ROOT = Path(__file__).resolve().parent.parent


class WorkspaceError(Exception):
    """The workspace layout or a package's metadata cannot be read."""


@dataclass(frozen=True)
class DeclaredRequirement:
    """One requirement string of a package, with where it was declared."""

    requirement: Requirement
    """The parsed requirement, e.g. ``hf-protocol>=0.1,<0.2``."""
    extra: str | None
    """The optional-dependency extra it belongs to; ``None`` for ``dependencies``."""
    text: str
    """The requirement exactly as written in the pyproject (for messages)."""

    @property
    def where(self) -> str:
        """Human-readable location, e.g. ``dependencies`` or ``extra "test"``."""
        return "dependencies" if self.extra is None else f'extra "{self.extra}"'


@dataclass(frozen=True)
class Package:
    """The metadata of one workspace package, as declared in its pyproject.toml."""

    name: str
    """Distribution name as written in the pyproject (e.g. ``hf-protocol``)."""
    version: Version
    """The package's current version."""
    path: Path
    """The package directory (the one holding ``pyproject.toml``)."""
    requirements: tuple[DeclaredRequirement, ...] = ()
    """Runtime dependencies and every extra's dependencies, in file order."""
    extras: frozenset[str] = frozenset()
    """Names of the package's optional-dependency extras (``test``, ``ray``, ...)."""

    @property
    def key(self) -> NormalizedName:
        """The canonical (PEP 503) name used to compare package names."""
        return canonicalize_name(self.name)

    @property
    def pyproject(self) -> Path:
        """Path of the package's pyproject.toml."""
        return self.path / "pyproject.toml"

    @property
    def import_name(self) -> str:
        """The import name by convention: ``hf-protocol`` -> ``hf_protocol``."""
        return self.key.replace("-", "_")

    def requirements_for(self, extras: Iterable[str] = ()) -> list[Requirement]:
        """Runtime requirements plus those of the given extras (unknown extras add nothing)."""
        wanted = {canonicalize_name(extra) for extra in extras}
        return [
            declared.requirement
            for declared in self.requirements
            if declared.extra is None or canonicalize_name(declared.extra) in wanted
        ]


def _parse_requirements(raw: object, extra: str | None, source: Path) -> list[DeclaredRequirement]:
    """Parse a TOML list of requirement strings, naming the file on errors."""
    if not isinstance(raw, list):
        where = "dependencies" if extra is None else f"optional-dependencies.{extra}"
        raise WorkspaceError(f"{source}: [project] {where} must be a list of strings")
    parsed = []
    for text in raw:
        try:
            parsed.append(DeclaredRequirement(Requirement(str(text)), extra, str(text)))
        except InvalidRequirement as error:
            raise WorkspaceError(
                f"{source}: invalid requirement {text!r}: {error}. "
                "Siblings are declared by name and version range, e.g. 'hf-protocol>=0.1,<0.2'."
            ) from error
    return parsed


def load_package(pyproject: Path) -> Package:
    """Read one package's pyproject.toml into a :class:`Package`."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise WorkspaceError(f"{pyproject}: cannot read: {error}") from error
    project = data.get("project")
    if not isinstance(project, dict) or "name" not in project:
        raise WorkspaceError(f"{pyproject}: no [project] table with a name")
    if "version" not in project:
        raise WorkspaceError(
            f"{pyproject}: no static [project] version; workspace packages declare "
            'version = "X.Y.Z" so the release tools can read and bump it'
        )
    try:
        version = Version(str(project["version"]))
    except InvalidVersion as error:
        raise WorkspaceError(f"{pyproject}: {error}") from error

    requirements = _parse_requirements(project.get("dependencies", []), None, pyproject)
    extras = project.get("optional-dependencies", {})
    if not isinstance(extras, dict):
        raise WorkspaceError(f"{pyproject}: [project.optional-dependencies] must be a table")
    for extra, raw in extras.items():
        requirements += _parse_requirements(raw, extra, pyproject)
    return Package(
        str(project["name"]), version, pyproject.parent, tuple(requirements), frozenset(extras)
    )


@dataclass(frozen=True)
class Workspace:
    """All packages under ``<root>/packages``, keyed by canonical name."""

    root: Path
    packages: dict[NormalizedName, Package]

    def __iter__(self) -> Iterator[Package]:
        return iter(self.packages.values())

    def get(self, name: str) -> Package:
        """The package called ``name``; the error lists the known names."""
        try:
            return self.packages[canonicalize_name(name)]
        except KeyError:
            known = ", ".join(sorted(p.name for p in self)) or "(none)"
            raise WorkspaceError(f"unknown package {name!r}; known packages: {known}") from None

    def sibling_requirements(self, package: Package) -> list[DeclaredRequirement]:
        """Requirements of ``package`` (any extra) on other workspace packages."""
        return [
            declared
            for declared in package.requirements
            if self._is_sibling(package, declared.requirement)
        ]

    def _is_sibling(self, package: Package, requirement: Requirement) -> bool:
        # A package may name itself in an extra (``all = ["hf-x[a,b]"]``); that is no sibling.
        key = canonicalize_name(requirement.name)
        return key in self.packages and key != package.key

    def sibling_closure(self, name: str, extras: Iterable[str] = ()) -> list[Package]:
        """Siblings that ``name`` (with ``extras``) needs, directly or transitively.

        Extras are followed as pip follows them: ``hf-a[test]`` needs what its
        ``test`` extra lists, and ``hf-b[ray]`` in there pulls in hf-b's ``ray``
        extra. The result is in dependency order and excludes ``name`` itself.
        """
        start = self.get(name)
        needed: dict[NormalizedName, set[str]] = {}
        pending: list[tuple[NormalizedName, set[str]]] = [
            (start.key, {canonicalize_name(extra) for extra in extras})
        ]
        while pending:
            key, wanted = pending.pop()
            if key in needed and wanted <= needed[key]:
                continue  # already expanded with these extras
            needed[key] = needed.get(key, set()) | wanted
            package = self.packages[key]
            for requirement in package.requirements_for(needed[key]):
                # Self-references are followed too: ``test = ["hf-a[ray]"]`` adds hf-a's ray extra.
                if canonicalize_name(requirement.name) in self.packages:
                    extras_wanted: set[str] = {canonicalize_name(e) for e in requirement.extras}
                    pending.append((canonicalize_name(requirement.name), extras_wanted))
        return [p for p in self.topological_order() if p.key in needed and p.key != start.key]

    def topological_order(self) -> list[Package]:
        """All packages, each after every sibling it requires (extras included).

        Ties are broken by name so the order is stable. A dependency cycle is an error.
        """
        sorter: graphlib.TopologicalSorter[NormalizedName] = graphlib.TopologicalSorter()
        for package in self:
            siblings = self.sibling_requirements(package)
            sorter.add(package.key, *(canonicalize_name(d.requirement.name) for d in siblings))
        try:
            sorter.prepare()
        except graphlib.CycleError as error:
            cycle = " -> ".join(error.args[1])
            raise WorkspaceError(f"sibling dependency cycle: {cycle}") from error
        order: list[Package] = []
        while sorter.is_active():
            ready = sorted(sorter.get_ready())
            order += [self.packages[key] for key in ready]
            sorter.done(*ready)
        return order


def discover(root: Path = REPO_ROOT) -> Workspace:
    """Load every ``<root>/packages/*/pyproject.toml``; duplicate names are an error."""
    packages: dict[NormalizedName, Package] = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        package = load_package(pyproject)
        if package.key in packages:
            other = packages[package.key].pyproject
            raise WorkspaceError(f"package name {package.name!r} used twice: {other}, {pyproject}")
        packages[package.key] = package
    return Workspace(root, packages)
