"""A one-shot future: a value set once from a callback and awaited by one or more tasks.

The pump's listeners are callbacks and its users await: every "wait until this callback
has run, then read what it was given" (a reply, a connect's outcome, a benchmark's end)
is this one type, not an event beside a box."""

from __future__ import annotations

from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class Future(Generic[T]):
    """Set once (:meth:`set`; later sets are ignored: the first outcome wins), awaited with
    :meth:`wait`."""

    __slots__ = ("_event", "_value")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._value: T | None = None

    def set(self, value: T) -> bool:
        """Give the value; False (and nothing changes) if it was given already."""
        if self._event.is_set():
            return False
        self._value = value
        self._event.set()
        return True

    def done(self) -> bool:
        return self._event.is_set()

    def result(self) -> T:
        """The value; :class:`RuntimeError` if it has not been set."""
        if not self._event.is_set():
            raise RuntimeError("the future has no value yet")
        return self._value  # type: ignore[return-value]

    async def wait(self) -> T:
        """The value, once it is set."""
        await self._event.wait()
        return self._value  # type: ignore[return-value]
