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
