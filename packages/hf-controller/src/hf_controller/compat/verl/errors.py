"""The error verl's checks raise, as the compat layer raises it."""

from __future__ import annotations


class VerlCheckError(ValueError, AssertionError):
    """A value verl refuses with an ``assert``. HybridFlow refuses it with a ``ValueError``
    that names the value and the fix; this is both, so code written against verl
    (``except AssertionError``) and against HybridFlow (``except ValueError``) catch it."""
