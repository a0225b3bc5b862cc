"""The MQ server role: topics and consume groups served on a broker's tracking port.

Commands (JSON, a binary body behind a NUL byte where there is one; every
request may carry a ``seq`` that its reply echoes):

* ``declare {topic, flags?, group?, filter?, start?}`` -- a topic (flags:
  ``memory``, ``rpc``, ``exclusive``, ``delete-on-exit``) and a group; the
  topic's default group is its name.
* ``produce {topic, producer, sequence, tag?, sizes?}`` + body -- one
  message, or ``len(sizes)`` messages cut from the body; the reply
  ``stored {offset, count, server}`` comes once they are stored as the
  durability policy says.  No topic is created by a produce (zbus).
* ``consume {topic, group?, window?}`` -- this link becomes a consumer of the
  group, with ``window`` credits; messages come while credits last, as
  ``messages {topic, group, offsets, sizes, tags, producers, sequences,
  deliveries, timestamps}`` + their bodies back to back, one frame for what
  one dispatch sends the link.  Each field is a column: a list with one entry
  a message, or one value for all of them (offsets and sequences: the first
  of consecutive values; :mod:`._wire`).  ``unconsume`` ends it.
* ``ack {topic, group, offsets}`` -- any number of offsets at once: a list,
  or ``offsets`` the first of ``count`` consecutive ones.
* ``query {topic?}``, ``remove {topic, group?}``, ``empty {topic}``.
* RPC (zbus's produce + route): a produce on an ``rpc`` topic is a request;
  the server stamps it with the caller link's session id (as its producer
  id; the request id is its sequence).  A service consumes it and answers
  ``route {recver: producer, id: sequence, status?}`` + body; the caller's
  link gets ``reply {id, status}`` + body.  A reply to a caller that has
  left is dropped and counted (``counts["unroutable"]``).
* Push (zbus's consume + route, reduced to its routing): ``receive {name}``
  makes a link answer to a receiver name; ``push {to}`` + body reaches every
  link answering to it at once, as ``pushed {to, from}`` + body -- not stored,
  a 404 if nobody answers to that name.

Every error is replied, with a status and the reason (404 for an unknown
topic or group), never dropped; a message that is not JSON closes only its
own link.  Every declare, remove, first and last consumer updates the
broker's ServerInfo, so trackers and route tables follow.

Durability (per server): ``sync`` -- a produce is acknowledged after fsync,
and every produce that arrived before the fsync shares it (group commit: the
fsync runs in a thread while the pump goes on, and what arrives meanwhile
waits for the next one), and messages are delivered only once durable;
``interval:S`` -- acknowledged and delivered once written, fsynced every S
seconds; ``none`` -- fsynced only when a segment is sealed or the server
closes.  (``fsync_thread=False`` keeps the fsyncs on the pump: deterministic
under a virtual clock, but the pump waits for the disk.)
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import Any
from urllib.parse import quote

import trio

from brokermgr import Sent, encode, send
from brokermgr.tracking import TrackNode
from brokermgr.tracking.info import (
    MASK_DELETE_ON_EXIT,
    MASK_EXCLUSIVE,
    MASK_MEMORY,
    MASK_RPC,
)
from channels import DEFAULT_RING_CAPACITY, Gather, MessageQueue
from pump import RdvpumpError, Timer

from ._cursor import CursorStore
from ._filter import FilterError
from ._log import DEFAULT_SEGMENT_BYTES, SyncPoint, TopicLog, _write_file, run_sync
from ._memory import MemoryLog
from ._record import Record, StoreError
from ._topic import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_WINDOW,
    Consumer,
    Delivery,
    Topic,
    UnknownGroupError,
)
from ._wire import pack_column

log = logging.getLogger("rdvpump.mq")

#: Topic flags by their stable names, with zbus 0.9's mask bits for its ServerInfo JSON.
FLAGS = {"memory": MASK_MEMORY, "rpc": MASK_RPC, "exclusive": MASK_EXCLUSIVE,
         "delete-on-exit": MASK_DELETE_ON_EXIT}
COMMANDS = frozenset({"declare", "produce", "consume", "unconsume", "ack", "query", "remove",
                      "route", "receive", "push",
                      "empty"})
#: Seconds between ack-timeout scans, cursor saves and ServerInfo depth updates.
TICK = 1.0
#: Largest window a consumer may ask for.
MAX_WINDOW = 10_000
#: Bytes of bodies after which a ``messages`` frame ends (the message that passes it is
#: the last): frames that fit a link's ring are taken out of it whole, larger ones are
#: put together piece by piece (with 1 MiB frames the 64 KiB stream of ``bench mq`` ran
#: at 2.1-2.3 K msgs/s, with these at 2.8-3.1 K, two runs each).
FRAME_BYTES = DEFAULT_RING_CAPACITY * 3 // 4
#: Bytes of a link's largest frame kept for a delivery's header: a message's body is at
#: most the link's maximum message size less this.
FRAME_ROOM = 64 << 10
#: Most consecutive offsets one ack may name by its first and count.
MAX_ACK_RANGE = 1 << 20


class MqError(RdvpumpError):
    """A request that gets an error reply: ``status`` and the reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class Durability:
    kind: str  # sync, interval, none
    interval: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Durability:
        if text in ("sync", "none"):
            return cls(text)
        kind, sep, seconds = text.partition(":")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if kind == "interval" and sep and value > 0:
            return cls("interval", value)
        raise ValueError(f"durability {text!r}: expected sync, interval:SECONDS or none")

    def __str__(self) -> str:
        return f"interval:{self.interval:g}" if self.kind == "interval" else self.kind


@dataclass
class _Topic:
    topic: Topic
    flags: frozenset[str]
    directory: Path | None
    cursors: CursorStore | None
    creator: MessageQueue | None = None
    #: a produce is waiting for the next fsync
    dirty: bool = False
    #: the group filters, as declared (saved in meta.json)
    filters: dict[str, str | None] = field(default_factory=dict)


@dataclass
class _Link:
    """One link's consumers and the messages its queue did not take yet."""

    queue: MessageQueue
    #: what RPC replies are routed by (a request on an ``rpc`` topic carries it)
    session: str = ""
    #: receiver names this link answers to (``receive``)
    names: set[str] = field(default_factory=set)
    consumers: dict[tuple[str, str], Consumer] = field(default_factory=dict)
    outbox: deque[bytes | Gather] = field(default_factory=deque)
    #: deliveries of the dispatch under way, sent as one ``messages`` frame each
    batch: list[Delivery] = field(default_factory=list)


class MqServer:
    """Topics of a server-role :class:`~brokermgr.tracking.TrackNode`, on its port.

    ``directory`` holds one folder per topic (None: memory only, every topic
    is a bounded ring).
    """

    commands = COMMANDS

    def __init__(self, node: TrackNode, directory: str | os.PathLike[str] | None, *,
                 durability: str | Durability = "sync",
                 ack_timeout: float = DEFAULT_ACK_TIMEOUT,
                 max_deliveries: int = DEFAULT_MAX_DELIVERIES,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 fsync_thread: bool = True, retain_bytes: int | None = None,
                 retain_age: float | None = None) -> None:
        if node.server is None:
            raise ValueError(f"{node.address} has no server role: an MQ server needs one")
        self.node = node
        self.pump = node.pump
        self.address = node.address.address
        self.directory = None if directory is None else Path(directory)
        self.durability = (durability if isinstance(durability, Durability)
                           else Durability.parse(durability))
        self.ack_timeout = ack_timeout
        self.max_deliveries = max_deliveries
        #: Largest body a produce may carry: what a delivery of it can carry.
        self.max_body = node.broker.manager.queue_options["max_message_size"] - FRAME_ROOM
        self.segment_bytes = segment_bytes
        #: Retention per disk topic: whole segments go once the topic is larger than
        #: ``retain_bytes`` or their newest message is older than ``retain_age`` seconds,
        #: whether or not every group has read them (as Kafka); checked every second.
        self.retain_bytes = retain_bytes
        self.retain_age = retain_age
        self.topics: dict[str, _Topic] = {}
        self.links: dict[MessageQueue, _Link] = {}
        #: links by session id, for RPC replies (``route``)
        self.sessions: dict[str, _Link] = {}
        #: links by receiver name, for ``push``
        self.receivers: dict[str, list[_Link]] = {}
        self._sessions = 0
        self._waiting: list[tuple[MessageQueue, dict[str, Any], str]] = []
        self._commit_posted = False
        self._committing = False
        self._closed = False
        #: fsyncs run in a thread and report back through trio (when trio runs this pump)
        self._token: trio.lowlevel.TrioToken | None = None
        self._syncer: _Syncer | None = None
        if fsync_thread:
            try:
                self._token = trio.lowlevel.current_trio_token()
            except RuntimeError:
                self._token = None
        #: Counters: stored, delivered, acked, dead letters, errors replied.
        self.counts = {"stored": 0, "delivered": 0, "acked": 0, "dead": 0, "errors": 0,
                       "routed": 0, "unroutable": 0}
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._load()
        node.extend(self)
        self._tick_timer: Timer = self.pump.call_later(TICK, self._tick, periodic=True)
        self._sync_timer: Timer | None = None
        if self.durability.kind == "interval":
            self._sync_timer = self.pump.call_later(self.durability.interval, self._interval,
                                                    periodic=True)

    # -- topics on disk ----------------------------------------------------------------

    def _load(self) -> None:
        assert self.directory is not None
        for meta_path in sorted(self.directory.glob("*/meta.json")):
            meta = json.loads(meta_path.read_text())
            name = meta["topic"]
            if meta.get("version") != 1:
                raise StoreError(f"{meta_path}: topic format version {meta.get('version')}; "
                                 f"this rdvpump reads 1")
            state = self._open(name, frozenset(meta["flags"]))
            for group, filter in meta["groups"].items():
                # a group with no saved position starts where nothing can be missed
                state.topic.declare_group(group, filter=filter, start="beginning")
                state.filters[group] = filter
            log.info("%s: topic %s: %d messages, groups %s", self.address, name,
                     state.topic.log.next_offset - state.topic.log.start_offset,
                     sorted(meta["groups"]))

    def _open(self, name: str, flags: frozenset[str]) -> _Topic:
        topic_dir = cursors = None
        if "memory" in flags or self.directory is None:
            log_: TopicLog | MemoryLog = MemoryLog()
            saved: dict[str, int] = {}
        else:
            topic_dir = self.directory / quote(name, safe="")
            log_ = TopicLog(topic_dir, segment_bytes=self.segment_bytes)
            cursors = CursorStore(topic_dir)
            saved = cursors.load()
        topic = Topic(name, log_, clock=self.pump.now, saved=saved,
                      ack_timeout=self.ack_timeout, max_deliveries=self.max_deliveries,
                      dead=self._dead)
        state = self.topics[name] = _Topic(topic, flags, topic_dir, cursors)
        mask = sum(FLAGS[f] for f in flags)
        self.node.declare_topic(name, mask=mask)
        return state

    def _save_meta(self, state: _Topic) -> None:
        if state.directory is None:
            return
        meta = {"version": 1, "topic": state.topic.name, "flags": sorted(state.flags),
                "groups": state.filters}
        _write_file(state.directory / "meta.json", json.dumps(meta, indent=1).encode())

    # -- requests ----------------------------------------------------------------------

    def handle(self, queue: MessageQueue, request: dict[str, Any]) -> None:
        cmd = request["cmd"]
        if self._closed:
            self._reply(queue, request, {"cmd": "error", "status": 503,
                                         "error": f"{self.address}: the MQ server is closed"})
            return
        try:
            reply = getattr(self, f"_{cmd}")(queue, request)
        except MqError as exc:
            reply = {"cmd": "error", "status": exc.status, "error": str(exc)}
        except UnknownGroupError as exc:
            reply = {"cmd": "error", "status": 404, "error": str(exc)}
        except StoreError as exc:
            reply = {"cmd": "error", "status": 500, "error": str(exc)}
        except (FilterError, ValueError, TypeError) as exc:
            reply = {"cmd": "error", "status": 400, "error": str(exc)}
        if reply is not None:
            self._reply(queue, request, reply)

    def handle_local(self, request: dict[str, Any]) -> dict[str, Any]:
        """A request from this process (declare at start, say): the reply, or
        :class:`MqError` with its status and reason."""
        cmd = request.get("cmd")
        if cmd not in ("declare", "query", "remove", "empty"):
            raise ValueError(f"{cmd!r} is not a local request")
        reply: dict[str, Any] = getattr(self, f"_{cmd}")(None, request)
        return reply

    def _reply(self, queue: MessageQueue, request: dict[str, Any], reply: dict[str, Any]
               ) -> None:
        if reply.get("cmd") == "error":
            self.counts["errors"] += 1
        if "seq" in request:
            reply["seq"] = request["seq"]
        reply.setdefault("topic", request.get("topic"))
        self._send_to(self._link(queue), encode(reply))

    def _link(self, queue: MessageQueue) -> _Link:
        link = self.links.get(queue)
        if link is None:
            self._sessions += 1
            link = self.links[queue] = _Link(queue, f"{queue.remote_id}#{self._sessions}")
            self.sessions[link.session] = link
        return link

    def _state(self, request: dict[str, Any]) -> _Topic:
        name = request.get("topic")
        if not isinstance(name, str) or not name:
            raise MqError(400, "a request needs a topic (a non-empty string)")
        state = self.topics.get(name)
        if state is None:
            raise MqError(404, f"no topic {name!r} on {self.address}")
        return state

    def _declare(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("topic")
        if not isinstance(name, str) or not name or "\x00" in name:
            raise MqError(400, "declare needs a topic (a non-empty string)")
        flags = request.get("flags", [])
        if not isinstance(flags, list) or not set(flags) <= set(FLAGS):
            raise MqError(400, f"flags must be a list of {', '.join(FLAGS)}; got {flags!r}")
        state = self.topics.get(name)
        created = state is None
        if state is None:
            state = self._open(name, frozenset(flags))
            state.creator = queue
            state.topic.declare_group(name, start="beginning")
            state.filters[name] = None
        group = request.get("group") or name
        filter = request.get("filter")
        if group not in state.topic.groups or filter is not None:
            # a new group, or a new filter; declaring an existing group again keeps it
            state.topic.declare_group(group, filter=filter, start=request.get("start"))
            state.filters[group] = filter
            self.node.declare_group(name, group, filter=filter)
        self._save_meta(state)
        self._save_cursors(state)  # a new group's start holds across a crash
        return {"cmd": "declared", "group": group, "created": created}

    def _produce(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any] | None:
        state = self._state(request)
        body = request.get("body", b"")
        producer = request.get("producer", queue.remote_id)
        sequence = request.get("sequence", 0)
        tag = request.get("tag")
        if not isinstance(producer, str) or type(sequence) is not int or (
                tag is not None and not isinstance(tag, str)):
            raise MqError(400, "producer must be a string, sequence an integer, tag a string")
        if "rpc" in state.flags:
            # a request: replies are routed back to this link by (session, request id)
            if queue is None:
                raise MqError(400, "an RPC request needs a link to answer")
            producer = self._link(queue).session
        sizes = request.get("sizes")
        if sizes is None:
            messages = [(tag, producer, sequence, body)]
        else:
            if (not isinstance(sizes, list) or not _ints(sizes) or (sizes and min(sizes) < 0)
                    or sum(sizes) != len(body)):
                raise MqError(400, f"sizes must be non-negative integers adding up to the "
                                   f"body's {len(body)} bytes")
            view = memoryview(body)  # the messages are cut without copying
            ends = list(itertools.accumulate(sizes))
            messages = [(tag, producer, sequence + i, view[end - size:end])
                        for i, (size, end) in enumerate(zip(sizes, ends, strict=True))]
        if len(body) > self.max_body and (len(body) if sizes is None else max(sizes)) > (
                self.max_body):
            raise MqError(413, f"a message over {self.max_body} bytes: this server's links "
                               f"carry frames of at most {self.max_body + FRAME_ROOM} bytes, "
                               f"a delivery's header included")
        first = state.topic.publish(messages)
        self.counts["stored"] += len(messages)
        reply = {"cmd": "stored", "offset": first, "count": len(messages),
                 "server": self.address}
        if self._needs_commit(state):
            self._waiting.append((queue, {**reply, **({"seq": request["seq"]} if "seq" in
                                                     request else {})}, state.topic.name))
            return None
        self._dispatch(state)
        return reply

    def _needs_commit(self, state: _Topic) -> bool:
        """Under ``sync``, a disk topic just written waits for the next group commit
        (posted once for all); True if it does."""
        if self.durability.kind != "sync" or not isinstance(state.topic.log, TopicLog):
            return False
        state.dirty = True
        self._want_commit()
        return True

    def _want_commit(self) -> None:
        if not self._commit_posted and not self._committing:
            self._commit_posted = True
            self.pump.post("mq commit", self._commit, owner=self.node.broker)

    def _commit(self) -> None:
        """One fsync per dirty topic for every produce since the last commit; their
        replies and deliveries follow when it is done.  With ``fsync_thread`` the fsyncs
        run in a thread while the pump goes on (and produces gather for the next
        commit); otherwise on the pump."""
        self._commit_posted = False
        if self._closed:
            return
        points: dict[str, SyncPoint] = {}
        failed: dict[str, str] = {}
        for state in self.topics.values():
            if state.dirty and isinstance(state.topic.log, TopicLog):
                state.dirty = False
                try:
                    points[state.topic.name] = state.topic.log.prepare_sync()
                except StoreError as exc:
                    failed[state.topic.name] = str(exc)
        waiting, self._waiting = self._waiting, []
        if not points or self._token is None:
            errors = _run_syncs(points)
            self._committed(points, errors, failed, waiting)
            return
        self._committing = True
        if self._syncer is None:
            self._syncer = _Syncer(self._token)
        self._syncer.submit(points, lambda errors: self.pump.post(
            "mq committed", self._committed, points, errors, failed, waiting))

    def _committed(self, points: dict[str, SyncPoint], errors: dict[str, OSError],
                   failed: dict[str, str],
                   waiting: list[tuple[MessageQueue, dict[str, Any], str]]) -> None:
        self._committing = False
        if self._closed:
            return
        for name, point in points.items():
            state = self.topics.get(name)
            if state is None or not isinstance(state.topic.log, TopicLog):
                continue
            try:
                state.topic.log.finish_sync(point, errors.get(name))
            except StoreError as exc:
                failed[name] = str(exc)
        for queue, reply, name in waiting:
            if name in failed:
                reply = {"cmd": "error", "status": 500, "seq": reply.get("seq"),
                         "error": f"not acknowledged, it may or may not be stored: "
                                  f"{failed[name]}"}
            self._reply(queue, {"seq": reply["seq"]} if reply.get("seq") is not None else {},
                        {**reply, "topic": name})
        for state in self.topics.values():
            self._dispatch(state)
        if self._waiting or any(s.dirty for s in self.topics.values()):
            self._want_commit()

    def _visible(self, state: _Topic) -> int:
        topic_log = state.topic.log
        if self.durability.kind == "sync" and isinstance(topic_log, TopicLog):
            return topic_log.durable_offset
        return topic_log.next_offset

    def _dispatch(self, state: _Topic) -> None:
        sent = state.topic.dispatch(self._visible(state))
        if sent:
            self.counts["delivered"] += sent
            for link in self.links.values():
                if link.batch:
                    self._flush_batch(link)

    def _consume(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any]:
        state = self._state(request)
        group = request.get("group") or state.topic.name
        window = request.get("window", DEFAULT_WINDOW)
        if type(window) is not int or not 1 <= window <= MAX_WINDOW:
            raise MqError(400, f"window must be an integer within 1..{MAX_WINDOW}")
        topic_group = state.topic.group(group)
        link = self._link(queue)
        if (state.topic.name, group) in link.consumers:
            raise MqError(409, f"this link already consumes {state.topic.name}/{group}")
        if "exclusive" in state.flags and topic_group.consumers:
            raise MqError(409, f"topic {state.topic.name!r} is exclusive: group {group!r} "
                               f"has a consumer already")
        consumer = Consumer(f"{queue.remote_id}#{id(queue) % 100000}", group,
                            link.batch.append, window=window)
        link.consumers[(state.topic.name, group)] = consumer
        state.topic.attach(consumer)
        self._consumers_changed(state, group)
        self.pump.post("mq dispatch", lambda: self._dispatch(state), owner=self.node.broker)
        return {"cmd": "consuming", "group": group, "window": window}

    def _unconsume(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any]:
        state = self._state(request)
        group = request.get("group") or state.topic.name
        consumer = self._link(queue).consumers.pop((state.topic.name, group), None)
        if consumer is None:
            raise MqError(404, f"this link does not consume {state.topic.name}/{group}")
        state.topic.detach(consumer)
        self._consumers_changed(state, group)
        self._dispatch(state)
        return {"cmd": "unconsumed", "group": group}

    def _ack(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any] | None:
        state = self._state(request)
        group = request.get("group") or state.topic.name
        offsets = request.get("offsets")
        count = request.get("count")
        if type(offsets) is int and type(count) is int and offsets >= 0 and 0 < count <= (
                MAX_ACK_RANGE):
            offsets = range(offsets, offsets + count)  # consecutive: offsets from the first
        elif not isinstance(offsets, list) or not _ints(offsets):
            raise MqError(400, f"offsets must be a list of integers, or the first of count "
                               f"consecutive ones (count within 1..{MAX_ACK_RANGE})")
        consumer = self._link(queue).consumers.get((state.topic.name, group))
        done = state.topic.ack(group, offsets, consumer)
        self.counts["acked"] += done
        self._dispatch(state)
        return {"cmd": "acked", "count": done} if "seq" in request else None

    def _query(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any]:
        names = [self._state(request).topic.name] if request.get("topic") else sorted(
            self.topics)
        return {"cmd": "topics", "server": self.address,
                "topics": {n: self.describe(n) for n in names}}

    def describe(self, name: str) -> dict[str, Any]:
        state = self.topics[name]
        topic = state.topic
        return {"flags": sorted(state.flags), "depth": topic.depth,
                "start": topic.log.start_offset, "next": topic.log.next_offset,
                "groups": {g.name: {"filter": state.filters.get(g.name), "lag": topic.lag(g.name),
                                    "consumers": len(g.consumers),
                                    "inFlight": len(g.in_flight),
                                    "deadLetters": g.dead_letters}
                           for g in topic.groups.values()}}

    def _remove(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any]:
        state = self._state(request)
        group = request.get("group")
        if group:
            state.topic.remove_group(group)
            state.filters.pop(group, None)
            if state.cursors is not None:
                state.cursors.remove(group)
            self._save_meta(state)
            self.node.remove_group(state.topic.name, group)
            return {"cmd": "removed", "group": group}
        self._drop_topic(state)
        return {"cmd": "removed"}

    def _drop_topic(self, state: _Topic) -> None:
        for group in list(state.topic.groups):
            state.topic.remove_group(group)
        for link in self.links.values():
            for key in [k for k in link.consumers if k[0] == state.topic.name]:
                del link.consumers[key]
        state.topic.log.close()
        del self.topics[state.topic.name]
        if state.directory is not None:
            shutil.rmtree(state.directory, ignore_errors=True)
        self.node.remove_topic(state.topic.name)

    def _route(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any] | None:
        """An RPC reply: ``route {recver, id}`` + body goes to the caller's link as
        ``reply {id}`` + body; a caller that has left is counted, and the replier told
        only if it asked (``seq``)."""
        recver, request_id = request.get("recver"), request.get("id")
        if not isinstance(recver, str) or type(request_id) is not int:
            raise MqError(400, "route needs recver (a string) and id (an integer)")
        link = self.sessions.get(recver)
        if link is None:
            self.counts["unroutable"] += 1
            log.info("%s: a reply to %s (request %d) dropped: the caller has left",
                     self.address, recver, request_id)
            if "seq" in request:
                raise MqError(410, f"caller {recver} has left; the reply is dropped")
            return None
        self.counts["routed"] += 1
        self._send_to(link, encode({"cmd": "reply", "id": request_id,
                                 "status": request.get("status", 200)},
                                request.get("body", b"")))
        return {"cmd": "routed"} if "seq" in request else None

    def _receive(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any]:
        """This link answers to a receiver name: pushes to that name come here."""
        name = request.get("name")
        if not isinstance(name, str) or not name:
            raise MqError(400, "receive needs a name (a non-empty string)")
        link = self._link(queue)
        if name not in link.names:
            link.names.add(name)
            self.receivers.setdefault(name, []).append(link)
        return {"cmd": "receiving", "name": name}

    def _push(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any] | None:
        """``push {to}`` + body: to every link that answers to that name, now (not
        stored); a 404 if none does."""
        name = request.get("to")
        if not isinstance(name, str) or not name:
            raise MqError(400, "push needs to (a receiver name)")
        links = self.receivers.get(name)
        if not links:
            self.counts["unroutable"] += 1
            raise MqError(404, f"no receiver {name!r} on {self.address}")
        sender = self._link(queue).session if queue is not None else self.address
        message = encode({"cmd": "pushed", "to": name, "from": sender},
                         request.get("body", b""))
        for link in links:
            self._send_to(link, message)
        self.counts["routed"] += len(links)
        return {"cmd": "pushed-to", "count": len(links)} if "seq" in request else None

    def _empty(self, queue: MessageQueue, request: dict[str, Any]) -> dict[str, Any]:
        state = self._state(request)
        state.topic.empty()
        return {"cmd": "emptied"}

    # -- delivery ----------------------------------------------------------------------

    def _flush_batch(self, link: _Link) -> None:
        """The deliveries of one dispatch to one link (its consumers append them to
        ``link.batch``), one ``messages`` frame per group: the records' fields as lists,
        their bodies back to back."""
        batch = link.batch[:]
        link.batch.clear()
        first = batch[0]
        if all(d.group == first.group and d.topic == first.topic for d in batch):
            self._send_messages(link, first.topic, first.group, batch)
            return
        by_group: dict[tuple[str, str], list[Delivery]] = {}
        for delivery in batch:
            by_group.setdefault((delivery.topic, delivery.group), []).append(delivery)
        for (topic, group), deliveries in by_group.items():
            self._send_messages(link, topic, group, deliveries)

    def _send_messages(self, link: _Link, topic: str, group: str,
                       deliveries: list[Delivery]) -> None:
        """``messages`` frames of about :data:`FRAME_BYTES` of bodies each (a wide window
        behind a deep backlog would make one frame larger than a link carries)."""
        start = size = 0
        for i, delivery in enumerate(deliveries):
            size += len(delivery.record.body)
            if size >= FRAME_BYTES:
                self._send_frame(link, topic, group, deliveries[start:i + 1])
                start, size = i + 1, 0
        if start < len(deliveries):
            self._send_frame(link, topic, group, deliveries[start:])

    def _send_frame(self, link: _Link, topic: str, group: str,
                    deliveries: list[Delivery]) -> None:
        records = [d.record for d in deliveries]
        header = {"cmd": "messages", "topic": topic, "group": group, "count": len(records),
                  "offsets": pack_column([r.offset for r in records], counting=True),
                  "sizes": pack_column([len(r.body) for r in records]),
                  "tags": pack_column([r.tag for r in records]),
                  "producers": pack_column([r.producer for r in records]),
                  "sequences": pack_column([r.sequence for r in records], counting=True),
                  "deliveries": pack_column([d.deliveries for d in deliveries]),
                  "timestamps": pack_column([r.timestamp for r in records])}
        self._send_to(link, encode(header, [r.body for r in records]))

    def _send_to(self, link: _Link, message: bytes | Gather) -> None:
        """Send, or keep for when the queue drains (bounded: credits bound deliveries)."""
        if link.outbox:
            link.outbox.append(message)
            return
        outcome = send(link.queue, message, what=f"mq client {link.queue.remote_id}")
        if outcome is Sent.FULL:
            link.outbox.append(message)

    def drained(self, queue: MessageQueue) -> None:
        link = None if self._closed else self.links.get(queue)
        if link is None:
            return
        while link.outbox:
            outcome = send(queue, link.outbox[0], what=f"mq client {queue.remote_id}")
            if outcome is not Sent.SENT:
                return
            link.outbox.popleft()

    def closed(self, queue: MessageQueue, reason: str) -> None:
        """A link closed: its consumers' messages go to the others; topics it declared
        with delete-on-exit go."""
        if self._closed:
            return
        link = self.links.pop(queue, None)
        if link is not None:
            self.sessions.pop(link.session, None)
            for name in link.names:
                held = self.receivers.get(name, [])
                if link in held:
                    held.remove(link)
                if not held:
                    self.receivers.pop(name, None)
            for (name, group), consumer in link.consumers.items():
                state = self.topics.get(name)
                if state is not None:
                    returned = state.topic.detach(consumer)
                    if returned:
                        log.info("%s: %s/%s: %d unacknowledged messages of %s go to the "
                                 "group's other consumers", self.address, name, group,
                                 returned, queue.remote_id)
                    self._consumers_changed(state, group)
                    self._dispatch(state)
        self._waiting = [w for w in self._waiting if w[0] is not queue]
        for state in list(self.topics.values()):
            if state.creator is queue and "delete-on-exit" in state.flags:
                self._drop_topic(state)

    def _dead(self, topic: str, group: str, record: Record, deliveries: int) -> None:
        """A message out of deliveries goes to ``<topic>.<group>.DLQ``."""
        self.counts["dead"] += 1
        name = f"{topic}.{group}.DLQ"
        state = self.topics.get(name)
        if state is None:
            flags = self.topics[topic].flags & {"memory"}
            state = self._open(name, frozenset(flags))
            state.topic.declare_group(name, start="beginning")
            state.filters[name] = None
            self._save_meta(state)
        state.topic.publish([(record.tag, record.producer, record.sequence, record.body)])
        if not self._needs_commit(state):
            self._dispatch(state)
        log.warning("%s: %s/%s: offset %d went to %s after %d deliveries", self.address,
                    topic, group, record.offset, name, deliveries)

    def _consumers_changed(self, state: _Topic, group: str) -> None:
        topic_group = state.topic.groups.get(group)
        if topic_group is None:
            return
        names = [c.name for c in topic_group.consumers]
        self.node.update_group(state.topic.name, group, message_count=state.topic.lag(group),
                               consumers=names)

    # -- timers ------------------------------------------------------------------------

    def _tick(self) -> None:
        if self.retain_bytes is not None or self.retain_age is not None:
            self._retain()
        for state in list(self.topics.values()):
            if state.topic.expire():
                self._dispatch(state)
            self._save_cursors(state)
        self._tick_timer = self.pump.call_later(TICK, self._tick, periodic=True)

    def _retain(self) -> None:
        for state in self.topics.values():
            topic_log = state.topic.log
            if not isinstance(topic_log, TopicLog):
                continue
            gone = topic_log.retain(max_bytes=self.retain_bytes, max_age=self.retain_age)
            if not gone:
                continue
            start = topic_log.start_offset
            behind = {g.name: start - g.floor for g in state.topic.groups.values()
                      if g.floor < start}
            log.info("%s: %s: retention removed %d messages", self.address,
                     state.topic.name, gone)
            for group, missed in behind.items():
                log.warning("%s: %s/%s: %d messages went by retention before the group "
                            "handled them", self.address, state.topic.name, group, missed)

    def _save_cursors(self, state: _Topic) -> None:
        floors = state.topic.floors_to_save()
        if state.cursors is None:
            return
        for group, floor in floors.items():
            try:
                state.cursors.save(group, floor)
            except OSError as exc:
                log.error("%s: %s/%s: cannot save the group's position (%s); it is kept in "
                          "memory and tried again", self.address, state.topic.name, group, exc)
                state.topic.groups[group].dirty = True

    def _interval(self) -> None:
        """Every topic written since the last interval is fsynced (a commit, in the
        fsync thread when there is one)."""
        for state in self.topics.values():
            if isinstance(state.topic.log, TopicLog) and (
                    state.topic.log.durable_offset < state.topic.log.next_offset):
                state.dirty = True
        self._want_commit()
        self._sync_timer = self.pump.call_later(self.durability.interval, self._interval,
                                                periodic=True)

    def sync_all(self) -> None:
        for state in self.topics.values():
            if isinstance(state.topic.log, TopicLog):
                try:
                    state.topic.log.sync()
                except StoreError as exc:
                    log.error("%s: %s", self.address, exc)

    def close(self) -> None:
        """Save every position, fsync every topic, close the files."""
        if self._closed:
            return
        self._closed = True
        self._tick_timer.cancel()
        if self._sync_timer is not None:
            self._sync_timer.cancel()
        if self._syncer is not None:
            self._syncer.stop()
        self.sync_all()
        for state in self.topics.values():
            self._save_cursors(state)
            state.topic.log.close()

    def topic_names(self) -> Iterable[str]:
        return sorted(self.topics)


def _ints(values: list[Any]) -> bool:
    """Every value is an int (not a bool); one pass in C, not a loop of Python checks."""
    return set(map(type, values)) <= {int}


class _Syncer:
    """One thread that runs the commits' fsyncs, one commit at a time, and reports each
    back on the pump's trio loop (a thread started per commit cost more than many
    fsyncs of a small commit)."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._jobs: SimpleQueue[
            tuple[dict[str, SyncPoint], Callable[[dict[str, OSError]], object]] | None
        ] = SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="mq fsync", daemon=True)
        self._thread.start()

    def submit(self, points: dict[str, SyncPoint],
               done: Callable[[dict[str, OSError]], object]) -> None:
        self._jobs.put((points, done))

    def stop(self) -> None:
        """No more commits: the thread ends after the one under way (not waited for)."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            points, done = job
            errors = _run_syncs(points)
            try:
                self._token.run_sync_soon(done, errors)
            except trio.RunFinishedError:  # ending: nothing is acknowledged
                return


def _run_syncs(points: dict[str, SyncPoint]) -> dict[str, OSError]:
    """fsync each point (any thread); the errors by topic."""
    errors = {}
    for name, point in points.items():
        try:
            run_sync(point)
        except OSError as exc:
            errors[name] = exc
    return errors
