"""A cluster's state: its shared topics and their consume groups (sans-I/O).

The root holds it and is the only one to change it: a server asks the root for a change,
the root applies it, counts a new version and sends the whole state to every server it
is linked to (application messages are not part of it).  A state is marked by the root
epoch it was made under and its version; a server whose mark differs from its root's
fetches the root's, and one behind another server's mark fetches that one's.  Topics declared on one
server only (private ones) are not in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pump import RdvpumpError

from ._names import check_name

__all__ = ["CHANGES", "ClusterState", "StateError"]

#: What a change does: a topic (with its default group) or a group of it declared, or
#: removed.
CHANGES = ("declare", "remove")


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
            if group is None or (group in groups and groups[group] == filter_):
                return created
            groups[group] = filter_
            return True
        if groups is None or (group is not None and group not in groups):
            return False
        if group is None:
            del self.topics[topic]
        else:
            del groups[group]
        return True

    def snapshot(self) -> dict[str, Any]:
        return {"version": self.version, "state_epoch": self.epoch,
                "topics": {t: dict(groups) for t, groups in sorted(self.topics.items())}}

    @classmethod
    def of(cls, version: int, topics: Any, epoch: int = 0) -> ClusterState:
        """A state as a snapshot carries it; :class:`StateError` naming what is wrong."""
        if not isinstance(topics, Mapping):
            raise StateError(f"topics must be an object, not {type(topics).__name__}")
        state = cls(version=version, epoch=epoch)
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

