"""The ``world`` fixture: a tracking world on one pump (see :mod:`.world`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .world import World


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.universe.close()
