"""A replica's side of replication: a topic's records copied from its master, as the
master stored them.

A :class:`Follower` keeps a link to the master's MQ server (reconnecting by itself) and,
on every connect, asks ``follow`` for each of its topics from its own log's next offset;
each ``copies`` frame is checked and stored whole (:meth:`~._log.TopicLog.append_copies`:
every checksum, offsets in line), made durable, and acknowledged with ``copied {topic,
next}``, which opens the master's window for more.  A frame that is damaged or out of
line stores nothing and closes the link with the reason (a protocol error); the next
connect asks again from what is stored.  A refusal (a replica ahead of its master, a
memory topic) is kept per topic (:attr:`Follower.refused`) and logged once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import trio

from brokermgr import DEFAULT_RETRY, Broker, BrokerLink, Outcome, ServiceError
from brokermgr.tracking import ServerAddress

from ._log import TopicLog
from ._record import StoreError
from ._requests import DEFAULT_FOLLOW_WINDOW

log = logging.getLogger("rdvpump.mq")


class _MasterLink(BrokerLink):
    def __init__(self, follower: Follower, broker: Broker, master: ServerAddress,
                 retry: float) -> None:
        super().__init__(broker, master.broker_id, master.port,
                         name=f"replica of {master.address}", retry=retry)
        self.follower = follower

    def opened(self) -> None:
        for topic, topic_log in self.follower.logs.items():
            self.request({"cmd": "follow", "topic": topic, "start": topic_log.next_offset,
                          "window": self.follower.window},
                         functools.partial(self.follower.answered, topic))

    def pushed(self, obj: dict[str, Any]) -> None:
        if obj.get("cmd") == "copies":
            self.follower.copies(self, obj)
        elif obj.get("cmd") == "error":
            log.warning("%s: %s", self.name, ServiceError.of(obj))


class Follower:
    """Copies of ``logs`` (topic name -> this replica's log of it) from the MQ server at
    ``master`` (``"broker:port"``), over a link from ``broker``."""

    def __init__(self, broker: Broker, master: str, logs: Mapping[str, TopicLog], *,
                 window: int = DEFAULT_FOLLOW_WINDOW, retry: float = DEFAULT_RETRY) -> None:
        self.logs = dict(logs)
        self.window = window
        self.master = ServerAddress(master)
        #: Why the master refused a topic, until it follows again; the topics it follows.
        self.refused: dict[str, str] = {}
        self.following: set[str] = set()
        #: Records stored, and frames refused (damaged or out of line).
        self.counts = {"records": 0, "frames": 0, "refused frames": 0}
        #: Set (and renewed) after each frame stored, and each answer to a follow.
        self.changed = trio.Event()
        self.link = _MasterLink(self, broker, self.master, retry)
        self.link.connect()

    def answered(self, topic: str, outcome: Outcome) -> None:
        if isinstance(outcome, ServiceError):
            if outcome.status and self.refused.get(topic) != outcome.reason:
                log.error("%s: %s: %s", self.link.name, topic, outcome.reason)
                self.refused[topic] = outcome.reason
                self._changed()
            return
        self.refused.pop(topic, None)
        self.following.add(topic)
        self._changed()

    def copies(self, link: _MasterLink, obj: dict[str, Any]) -> None:
        topic, first, count = obj.get("topic"), obj.get("first"), obj.get("count")
        topic_log = self.logs.get(topic) if isinstance(topic, str) else None
        try:
            if topic_log is None:
                raise StoreError(f"copies of {topic!r}, which this replica does not follow")
            if type(first) is not int or type(count) is not int or count < 1:
                raise StoreError(f"first {first!r} and count {count!r}")
            if first != topic_log.next_offset:
                raise StoreError(f"{topic}: copies from {first}, this replica's next offset "
                                 f"is {topic_log.next_offset}")
            stored = topic_log.append_copies(obj.get("body", b""))
            if stored != count:
                raise StoreError(f"{topic}: {stored} records in a frame of {count}")
        except StoreError as exc:
            self.counts["refused frames"] += 1
            log.error("%s: a bad copies frame: %s", link.name, exc)
            link.protocol_error(f"a bad copies frame: {exc}")
            return
        topic_log.sync()
        self.counts["records"] += count
        self.counts["frames"] += 1
        link.send({"cmd": "copied", "topic": topic, "next": topic_log.next_offset})
        self._changed()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def close(self) -> None:
        self.link.close()
