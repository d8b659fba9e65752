"""Errors of the Tinker-compatible server, each with the HTTP status it answers with."""

from __future__ import annotations


class ServeError(Exception):
    """An error a client is told about: ``status`` and one message naming what and the fix."""

    status = 500
    category = "server"
    """Tinker's ``RequestFailedResponse.category``: ``user``, ``server`` or ``unknown``."""


class BadRequestError(ServeError):
    """A malformed or unsupported request (400): the message names the field."""

    status = 400
    category = "user"


class NotFoundError(ServeError):
    """An unknown model, session, sampler or future (404)."""

    status = 404
    category = "user"


class UnauthorizedError(ServeError):
    """A missing or wrong API key (401); the key itself is never echoed or logged."""

    status = 401
    category = "user"


class TooLargeError(ServeError):
    """A request body over ``serve.max_request_mb`` (413)."""

    status = 413
    category = "user"
