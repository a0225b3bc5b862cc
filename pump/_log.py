"""Warnings that a flood cannot multiply."""

from __future__ import annotations

import logging
from typing import Any

#: Warnings of one kind from one source: one line, then a count every this many seconds.
LOG_WINDOW = 10.0


class CollapsingLog:
    """Warnings that a flood cannot multiply: the first of a kind (per key) is logged, the
    ones that follow within ``window`` seconds are counted, and the count is logged once
    the window ends ("N more like this in the last 10 s"), on the pump's clock."""

    def __init__(self, logger: logging.Logger, pump: Any, *,
                 window: float = LOG_WINDOW) -> None:
        self.logger = logger
        self.pump = pump
        self.window = window
        # keys within a window: the warnings not logged, and the last of them
        self._held: dict[object, tuple[int, str]] = {}

    def warn(self, key: object, line: str) -> None:
        held = self._held.get(key)
        if held is not None:
            self._held[key] = (held[0] + 1, line)
            return
        self.logger.warning("%s", line)
        self._held[key] = (0, line)
        self.pump.call_later(self.window, self._end_window, key)

    def _end_window(self, key: object) -> None:
        more, last = self._held.pop(key, (0, ""))
        if more:
            self.logger.warning("%d more like this in the last %g s (the last: %s)", more,
                                self.window, last)
