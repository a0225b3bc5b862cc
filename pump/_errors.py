"""The one base class of rdvpump's own exceptions, at the bottom layer so every layer can use it."""

from __future__ import annotations


class RdvpumpError(Exception):
    """Base of every exception rdvpump defines (``except RdvpumpError`` catches them all).

    Where trio has the right exception (``ClosedResourceError``,
    ``BrokenResourceError``, ``WouldBlock``) it is raised as it is, or
    subclassed together with this one.
    """


class NeverIdleError(RdvpumpError, RuntimeError):
    """``run_until_idle`` found nothing left but periodic timers (reports, scans,
    heartbeats): the pump would never go idle.  Run it for a time instead."""


class ConfigError(RdvpumpError, ValueError):
    """A bad argument, setting or name from the caller (a port out of range, a negative
    timeout, a format that does not exist): the message says which and why.  A
    ``ValueError`` too, for code that catches those."""


class TraceWriteError(RdvpumpError, RuntimeError):
    """Writing a trace failed (the disk, the file system): the cause is chained."""
