"""The application's own error: a process it started, or a measurement it ran, failed."""

from __future__ import annotations

from pump import RdvpumpError


class RunError(RdvpumpError, RuntimeError):
    """A broker process, a peer or a benchmark run did not do what it had to (did not
    start, was refused, delivered less than it sent, is not installed): the message says
    which.  The CLI prints it as one line."""


def first_leaf(exc: BaseException) -> BaseException:
    """The first exception inside ``exc``'s trio exception groups (``exc`` itself if it is
    not one)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
