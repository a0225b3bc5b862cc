"""Durability of an MQ server's produces: the policy and the group commit.

``sync`` -- a produce is acknowledged after fsync, and every produce that arrived before
the fsync shares it (group commit: the fsync runs in a thread while the pump goes on,
and what arrives meanwhile waits for the next one), and messages are delivered only
once durable; ``interval:S`` -- acknowledged and delivered once written, fsynced every S
seconds; ``none`` -- fsynced only when a segment is sealed or the server closes.
(``fsync_thread=False`` keeps the fsyncs on the pump: deterministic under a virtual
clock, but the pump waits for the disk.)

What a commit needs of a topic's log is the :class:`~._topic.Log` protocol: whether it
is ``persistent``, ``prepare_sync`` (what an fsync must cover now; None for a log with
nothing to fsync), ``finish_sync`` back on the pump, and its ``durable_offset``.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from brokermgr import Deferred, ServiceError, Status
from channels import MessageQueue
from pump import ConfigError, Pump, Repeating

from ..storage._files import SyncPoint
from ..storage._record import StoreError
from ._syncers import NativeSyncer, ThreadSyncer, run_syncs
from ._topic import Log

__all__ = ["Durability", "GroupCommit", "Waiting"]

logger = logging.getLogger("rdvpump.mq")


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
        raise ConfigError(f"durability {text!r}: expected sync, interval:SECONDS or none")

    def __str__(self) -> str:
        return f"interval:{self.interval:g}" if self.kind == "interval" else self.kind


#: A produce waiting for its group commit: its topic and its reply.
Waiting = tuple[str, Deferred]


#: Upper bounds, in seconds, of the buckets a commit's fsync time is counted in
#: (:attr:`GroupCommit.fsync_buckets`); the last bucket takes the rest.
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GroupCommit:
    """The fsyncs of a server's topics under its :class:`Durability`, and the replies
    that wait for them.

    The server tells it of each topic's log (:meth:`add`, :meth:`remove`).  When a commit
    is done (or failed), each waiting reply goes to ``release`` (or is refused, for a topic
    whose commit failed), ``failed`` is told of each topic whose fsync failed (with why), and
    ``committed`` is given the topics whose writes became durable, to deliver what that
    opens (the others' deliveries are as they were).
    """

    def __init__(self, pump: Pump, durability: Durability, *, owner: Any,
                 release: Callable[[Deferred], None],
                 failed: Callable[[str, str], None],
                 committed: Callable[[list[str]], None],
                 fsync_thread: bool = True) -> None:
        self.pump = pump
        self.durability = durability
        #: fsyncs may run in threads (the topics' logs flush sealed segments in one too)
        self.fsync_thread = fsync_thread
        self._owner = owner
        #: the topics' logs, by name
        self.logs: dict[str, Log] = {}
        self._release = release
        self._failed = failed
        self._committed_hook = committed
        #: topics written since their last fsync was started
        self._dirty: set[str] = set()
        self._waiting: list[Waiting] = []
        #: what runs once a commit made its topic's writes durable (:meth:`after`)
        self._then: list[tuple[str, Callable[[], None]]] = []
        self._posted = False
        self._running = False
        self._closed = False
        #: fsyncs run in a thread and report back through trio (when trio runs this pump)
        self._token: trio.lowlevel.TrioToken | None = None
        #: the fsyncs' threads, made at the first commit: the C one, and the Python one
        #: for a commit that waits for a flush (or for all, if the C one cannot start)
        self._native: NativeSyncer | None = None
        self._thread: ThreadSyncer | None = None
        if fsync_thread:
            try:
                self._token = trio.lowlevel.current_trio_token()
            except RuntimeError:
                self._token = None
        #: How long each commit's fsyncs took, counted by :data:`FSYNC_BUCKETS` (one
        #: bucket more, past the last bound), and their sum in seconds
        self.fsync_buckets = [0] * (len(FSYNC_BUCKETS) + 1)
        self.fsync_seconds = 0.0
        self._timer: Repeating | None = None
        if durability.kind == "interval":
            self._timer = pump.call_every(durability.interval, self._interval)

    @property
    def threaded(self) -> bool:
        """Whether work may run in threads that report back (:meth:`from_thread`)."""
        return self._token is not None

    def from_thread(self, name: str, call: Callable[[], None]) -> None:
        """Run ``call`` on the pump, as task ``name``; from any thread (while
        :attr:`threaded`).  Dropped once trio's run is over."""
        assert self._token is not None
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(
                lambda: self.pump.post(name, call, owner=self._owner))

    def add(self, name: str, log: Log) -> None:
        self.logs[name] = log

    def remove(self, name: str) -> None:
        """A topic is gone: its log is no longer fsynced (a commit under way skips it)."""
        self.logs.pop(name, None)
        self._dirty.discard(name)

    def visible(self, log: Log) -> int:
        """The offsets below this may be delivered: under ``sync`` what is durable."""
        return log.durable_offset if self.durability.kind == "sync" else log.next_offset

    def waits(self, log: Log) -> bool:
        """Whether what is written to ``log`` waits for a group commit (``sync``, on a
        persistent log) before it is acknowledged and delivered."""
        return self.durability.kind == "sync" and log.persistent

    def written(self, name: str, log: Log, reply: Deferred | None = None) -> bool:
        """Topic ``name`` was just written.  If it :meth:`waits`, it waits for the next
        group commit (posted once for all), and so does ``reply``, the produce's: True
        then, and the caller neither replies nor delivers now."""
        if not self.waits(log):
            return False
        self._dirty.add(name)
        if reply is not None:
            self._waiting.append((name, reply))
        if self._running and self._native is not None:
            self._native.poll()  # (a commit it finished is reported, on the pump)
        self._want()
        return True

    def after(self, name: str, log: Log, then: Callable[[], None]) -> None:
        """Call ``then`` once what was written to topic ``name`` so far is stored as the
        policy says: after the next group commit if it :meth:`waits` (shared by every
        write before it), now otherwise; never if that commit fails (the topic is
        failed) or the server closes first.  A replica acknowledges its copies so."""
        if self.written(name, log):
            self._then.append((name, then))
        else:
            then()

    def forget(self, queue: MessageQueue) -> None:
        """A link closed: the replies waiting for it are dropped."""
        self._waiting = [w for w in self._waiting if w[1].queue is not queue]

    def _want(self) -> None:
        if not self._posted and not self._running:
            self._posted = True
            self.pump.post("mq commit", self._commit, owner=self._owner)

    def _commit(self) -> None:
        """One fsync per dirty topic for every produce since the last commit; their
        replies and deliveries follow when it is done.  With the fsync thread the fsyncs
        run there while the pump goes on (and produces gather for the next commit);
        otherwise on the pump."""
        self._posted = False
        if self._closed:
            return
        points: dict[str, SyncPoint] = {}
        failed: dict[str, str] = {}
        dirty, self._dirty = self._dirty, set()
        for name in sorted(dirty):
            log = self.logs.get(name)
            if log is None:
                continue
            try:
                point = log.prepare_sync()
            except StoreError as exc:
                failed[name] = str(exc)
                continue
            if point is not None:
                points[name] = point
        waiting = (self._waiting, self._then)
        self._waiting, self._then = [], []
        started = time.perf_counter()
        if not points or self._token is None:
            self._done(points, run_syncs(points), failed, waiting, started)
            return
        self._running = True
        self._syncer_for(points, self._token).submit(points, lambda errors: self.pump.post(
            "mq committed", self._done, points, errors, failed, waiting, started))

    def _syncer_for(self, points: dict[str, SyncPoint], token: trio.lowlevel.TrioToken
                    ) -> NativeSyncer | ThreadSyncer:
        if self._native is None and self._thread is None:
            try:
                self._native = NativeSyncer()
            except OSError as exc:
                logger.warning("fsyncs in a Python thread: %s", exc)
        if self._native is not None and self._native.takes(points):
            return self._native
        if self._thread is None:
            self._thread = ThreadSyncer(token)
        return self._thread

    def _done(self, points: dict[str, SyncPoint], errors: dict[str, OSError],
              failed: dict[str, str],
              waiting: tuple[list[Waiting], list[tuple[str, Callable[[], None]]]],
              started: float) -> None:
        self._running = False
        if points:
            took = time.perf_counter() - started
            self.fsync_buckets[bisect.bisect_left(FSYNC_BUCKETS, took)] += 1
            self.fsync_seconds += took
        if self._closed:
            return
        for name, point in points.items():
            log = self.logs.get(name)
            if log is None:
                continue
            try:
                log.finish_sync(point, errors.get(name))
            except StoreError as exc:
                failed[name] = str(exc)
        for name, reason in failed.items():
            self._failed(name, reason)
        if self._dirty and not self._posted and self._token is not None:
            # what was written meanwhile goes to the fsync thread now, before this
            # commit's replies and deliveries go out, not a task after them: the thread
            # fsyncs while the pump answers (64 KiB `sync`: the thread sat idle 1.2 ms a
            # commit, the pump's answers and the next reads before it)
            self._commit()
        replies, then = waiting
        for name, reply in replies:
            if name in failed:
                reply.refuse(ServiceError(Status.INTERNAL, f"not acknowledged, it may or may "
                                                           f"not be stored: {failed[name]}",
                                          topic=name))
            else:
                self._release(reply)
        for name, call in then:
            if name not in failed:
                call()
        durable = [name for name in points if name not in failed]
        if durable:
            self._committed_hook(durable)
        if self._waiting or self._dirty:
            self._want()

    def _interval(self) -> None:
        """Every topic written since the last interval is fsynced (a commit, in the fsync
        thread when there is one)."""
        self._dirty.update(name for name, log in self.logs.items()
                           if log.persistent and log.durable_offset < log.next_offset)
        self._want()

    def sync_all(self) -> None:
        """fsync every topic now, on the pump (at close); a failure is logged."""
        for name, log in self.logs.items():
            try:
                log.sync()
            except StoreError as exc:
                logger.error("%s: %s", name, exc)

    def close(self) -> None:
        """No more commits: the timer stops, the fsync thread ends after the commit under
        way (not waited for), and waiting replies are not sent."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for syncer in (self._native, self._thread):
            if syncer is not None:
                syncer.stop()
