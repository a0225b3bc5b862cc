"""A master's side of replication: the records of its topics shipped to the replicas that
follow them.

A replica (:class:`~._follower.Follower`) asks ``follow {topic, start, window}`` on a
link: from then on the master sends it that topic's records from ``start`` on, as they
are written, in ``copies {topic, first, count}`` frames whose body is the records as the
log stored them (checksums included: the replica checks each one and stores the bytes as
they are), never more than ``window`` bytes ahead of what the replica acknowledged
(``copied {topic, next}``).  A replica whose ``start`` is past the master's last offset
holds records the master does not (a former master's tail): refused with that reason,
409.  A memory topic is not replicated (400).

What each replica acknowledged is kept (:meth:`Shipper.offsets`): the in-sync set and a
``sync`` group's acknowledgements will be built on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from brokermgr import ServiceError, Status, encode

from ._catalogue import Catalogue, TopicState
from ._delivery import FRAME_BYTES, ClientLink
from ._record import encode_records
from ._requests import Copied, Follow

_ANY_BODY = 1 << 62

@dataclass
class _Follower:
    link: ClientLink
    topic: str
    #: the next offset to ship, and the replica's next offset as it acknowledged
    next: int
    acked: int
    window: int
    #: bytes shipped and not acknowledged yet, by the first offset after them
    in_flight: list[tuple[int, int]]


class Shipper:
    """The followers of a server's topics, by link and topic."""

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        #: by the link's id and the topic
        self.followers: dict[tuple[str, str], _Follower] = {}
        #: Counters: frames and bytes shipped.
        self.counts = {"frames": 0, "bytes": 0}

    def follow(self, link: ClientLink, request: Follow) -> dict[str, Any]:
        state = self.catalogue.get(request.topic)
        if "memory" in state.flags:
            raise ServiceError(Status.BAD_REQUEST,
                               f"topic {request.topic!r} is memory only: not replicated")
        log = state.topic.log
        if request.start > log.next_offset:
            raise ServiceError(Status.CONFLICT,
                               f"{request.topic}: the replica holds offsets up to "
                               f"{request.start - 1}, this server's last is "
                               f"{log.next_offset - 1}: it holds records this one does not")
        if request.start < log.start_offset:
            raise ServiceError(Status.CONFLICT,
                               f"{request.topic}: records before {log.start_offset} are gone "
                               f"(retention); the replica asked from {request.start}")
        self.followers[(link.caller_id, request.topic)] = _Follower(
            link, request.topic, request.start, request.start, request.window, [])
        self.ship(state)
        return {"cmd": "following", "topic": request.topic, "next": log.next_offset}

    def copied(self, link: ClientLink, request: Copied) -> None:
        follower = self.followers.get((link.caller_id, request.topic))
        if follower is None:
            raise ServiceError(Status.CONFLICT,
                               f"this link does not follow {request.topic!r}")
        if not follower.acked <= request.next <= follower.next:
            raise ServiceError(Status.BAD_REQUEST,
                               f"{request.topic}: copied up to {request.next}, but "
                               f"{follower.acked}..{follower.next} was shipped")
        follower.acked = request.next
        follower.in_flight = [(end, n) for end, n in follower.in_flight if end > request.next]
        state = self.catalogue.topics.get(request.topic)
        if state is not None:
            self.ship(state)

    def ship(self, state: TopicState) -> None:
        """Send each follower of the topic what was written since, within its window."""
        name = state.topic.name
        log = state.topic.log
        for (_, topic), follower in list(self.followers.items()):
            if topic != name:
                continue
            link = follower.link
            while follower.next < log.next_offset:
                room = follower.window - sum(n for _, n in follower.in_flight)
                if room <= 0:
                    break
                records = log.read(follower.next, max_count=10_000,
                                   max_bytes=min(room, FRAME_BYTES))
                if not records:
                    break
                if records[0].offset != follower.next:
                    # damage in this log hides the records from next on: the replica
                    # cannot be given them (it keeps its offsets in line)
                    self.catalogue.failed(state, "replication",
                                          f"records from {follower.next} cannot be read")
                    break
                records = [r for i, r in enumerate(records)
                           if r.offset == follower.next + i]
                # as stored (the replica checks each body against its own maximum)
                chunks, lengths = encode_records(records, _ANY_BODY)
                size = sum(lengths)
                link.send(encode({"cmd": "copies", "topic": name, "first": follower.next,
                                  "count": len(records)}, chunks))
                follower.next += len(records)
                follower.in_flight.append((follower.next, size))
                self.counts["frames"] += 1
                self.counts["bytes"] += size

    def forget(self, link: ClientLink) -> None:
        for key in [k for k in self.followers if k[0] == link.caller_id]:
            del self.followers[key]

    def offsets(self, topic: str) -> dict[str, int]:
        """Each follower's acknowledged next offset, by its link's id."""
        return {caller: f.acked for (caller, t), f in self.followers.items() if t == topic}
