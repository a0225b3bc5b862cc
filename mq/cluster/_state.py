"""A cluster's state: its shared topics and their consume groups (sans-I/O).

The root holds it and is the only one to change it: a server asks the root for a change,
the root applies it, counts a new version and sends the whole state to every server it
is linked to (application messages are not part of it).  A state is marked by the root
epoch it was made under and its version; a server whose mark differs from its root's
fetches the root's, and one behind another server's mark fetches that one's.  Topics declared on one
server only (private ones) are not in it.

A removal is said, not implied: the state lists what the root removed (the latest
:data:`MAX_REMOVED` removals, a declare of the same name striking its removal out), and
a server removes a topic or a group, and its messages, only when a state says it was
removed.  A state that merely leaves one out (from a faulty or lying server, or a root
that missed it) deletes nothing: the server keeps it, and its messages, as its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pump import RdvpumpError

from ..storage._names import check_name

__all__ = ["CHANGES", "MAX_REMOVED", "ClusterState", "Removal", "StateError"]

#: What a change does: a topic (with its default group) or a group of it declared, or
#: removed.
CHANGES = ("declare", "remove")
#: The removals a state remembers: a server away for more than that many removals keeps
#: what the older ones removed (nothing is deleted on a state's silence).
MAX_REMOVED = 1024

#: A removal: a topic (group None) or one group of it.
Removal = tuple[str, "str | None"]


class StateError(RdvpumpError, ValueError):
    """A change or a state that cannot be taken, and why."""


@dataclass
class ClusterState:
    """Shared topics -> their consume groups -> each group's filter (None: every tag)."""

    topics: dict[str, dict[str, str | None]] = field(default_factory=dict)
    version: int = 0
    #: The root epoch under which this version was made: states compare by (epoch,
    #: version), so that two roots' states of one version are told apart.
    epoch: int = 0
    #: What the root removed, oldest first (at most :data:`MAX_REMOVED`).
    removed: list[Removal] = field(default_factory=list)

    def was_removed(self, topic: str, group: str | None = None) -> bool:
        """Whether this state says ``topic`` (or ``group`` of it) was removed."""
        return (topic, group) in self.removed

    @property
    def mark(self) -> tuple[int, int]:
        return self.epoch, self.version

    def apply(self, op: str, topic: str, group: str | None = None,
              filter_: str | None = None) -> bool:
        """One change; whether the state changed (its version is the caller's)."""
        if op not in CHANGES:
            raise StateError(f"a change is one of {', '.join(CHANGES)}, not {op!r}")
        check_name(topic, "topic")
        if group is not None:
            check_name(group, "group")
        groups = self.topics.get(topic)
        if op == "declare":
            created = groups is None
            if groups is None:
                groups = self.topics[topic] = {topic: None}
                self._unremove((topic, None), (topic, topic))
            if group is None or (group in groups and groups[group] == filter_):
                return created
            groups[group] = filter_
            self._unremove((topic, group))
            return True
        if groups is None or (group is not None and group not in groups):
            return False
        if group is None:
            del self.topics[topic]
        else:
            del groups[group]
        self._unremove((topic, group))
        self.removed.append((topic, group))
        del self.removed[:-MAX_REMOVED]
        return True

    def _unremove(self, *removals: Removal) -> None:
        self.removed = [r for r in self.removed if r not in removals]

    def snapshot(self) -> dict[str, Any]:
        return {"version": self.version, "state_epoch": self.epoch,
                "topics": {t: dict(groups) for t, groups in sorted(self.topics.items())},
                "removed": [list(r) for r in self.removed]}

    @classmethod
    def of(cls, version: int, topics: Any, epoch: int = 0,
           removed: Any = None) -> ClusterState:
        """A state as a snapshot carries it; :class:`StateError` naming what is wrong."""
        if not isinstance(topics, Mapping):
            raise StateError(f"topics must be an object, not {type(topics).__name__}")
        state = cls(version=version, epoch=epoch, removed=_removals(removed))
        for topic, groups in topics.items():
            if not isinstance(groups, Mapping):
                raise StateError(f"topic {topic!r}: its groups must be an object")
            try:
                check_name(topic, "topic")
                for group, filter_ in groups.items():
                    check_name(group, "group")
                    if filter_ is not None and not isinstance(filter_, str):
                        raise StateError(f"{topic}/{group}: a filter is a string or null")
            except ValueError as exc:
                raise StateError(str(exc)) from None
            state.topics[topic] = dict(groups)
        return state


def _removals(value: Any) -> list[Removal]:
    """The removals as a snapshot carries them (``[[topic, group or null], ...]``, none
    when absent); :class:`StateError` naming what is wrong."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_REMOVED:
        raise StateError(f"removed must be a list of at most {MAX_REMOVED} [topic, group]")
    removals: list[Removal] = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and (item[1] is None or isinstance(item[1], str))):
            raise StateError(f"removed: {item!r} is not [topic, group or null]")
        try:
            check_name(item[0], "topic")
            if item[1] is not None:
                check_name(item[1], "group")
        except ValueError as exc:
            raise StateError(f"removed: {exc}") from None
        removals.append((item[0], item[1]))
    return removals
