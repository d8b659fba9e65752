"""Field descriptions of config dataclasses, read from their source.

A field's description is the string right after it (an attribute docstring). Python drops
those at run time, so they are read from the class source, which is installed with the
package. One reader serves ``hybridflow <command> --help`` and the generated configuration
reference (``tools/gen_config_reference.py``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap


def attribute_docstrings(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of dataclass ``cls`` and its dataclass bases (subclasses win).

    Docstrings are ``inspect.cleandoc``-ed; fields without one are left out. Raises
    ``OSError`` / ``TypeError`` (from :func:`inspect.getsource`) when a class has no source.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_docstrings(klass))
    return docs


def _own_docstrings(cls: type) -> dict[str, str]:
    """The attribute docstrings written in the body of ``cls`` itself."""
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(node, ast.ClassDef), f"the source of {cls.__qualname__} is not a class"
    docs: dict[str, str] = {}
    for field, after in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[field.target.id] = inspect.cleandoc(after.value.value)
    return docs
