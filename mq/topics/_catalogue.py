"""The topic catalogue of an MQ server: its topics, their files and their error states.

Each topic is a :class:`TopicState`: the topic's core (:class:`~._topic.Topic`, its log
and groups), its flags, its directory and cursor store (none for a memory topic), the
group filters as declared, and why its work or a group's position save failed last.
The catalogue opens the topics found on disk at start (one that cannot be opened is
left out with its reason, the others are served), opens new ones, saves their meta and
positions, applies retention, describes them for ``query``, and drops them.  Opening
and dropping a topic tell the group commit (:mod:`._commit`) and the broker's
ServerInfo, so trackers follow.

The server's commands (:mod:`mq.server._server`) find topics here; nothing here answers a
request or touches a link.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokermgr import ServiceError, Status
from brokermgr.tracking import TrackNode
from brokermgr.tracking.info import (
    MASK_DELETE_ON_EXIT,
    MASK_EXCLUSIVE,
    MASK_MEMORY,
    MASK_RPC,
)
from channels import MessageQueue

from ..storage._cursor import CursorSaver, CursorStore
from ..storage._files import write_file
from ..storage._log import TopicLog
from ..storage._memory import MemoryLog
from ..storage._names import disk_name
from ..storage._record import Record, StoreError
from ..storage._tail import Kept
from ._commit import GroupCommit
from ._dedupe import QUIET, Recent
from ._filter import FilterError
from ._meta import META, encode_meta, read_meta
from ._requests import FLAG_NAMES
from ._topic import Topic

log = logging.getLogger("rdvpump.mq")

#: Topic flags by their stable names, with zbus 0.9's mask bits for its ServerInfo JSON.
FLAGS = dict(zip(FLAG_NAMES, (MASK_MEMORY, MASK_RPC, MASK_EXCLUSIVE, MASK_DELETE_ON_EXIT),
                 strict=True))


@dataclass
class TopicState:
    """One topic of the catalogue."""

    topic: Topic
    flags: frozenset[str]
    directory: Path | None
    cursors: CursorStore | None
    #: the link that created it (a delete-on-exit topic goes with it)
    creator: MessageQueue | None = None
    #: the group filters, as declared (saved in meta.json)
    filters: dict[str, str | None] = field(default_factory=dict)
    #: why the topic's own work (dispatch, commit) failed last, until it works again
    error: str | None = None
    #: why a group's position could not be saved, until it is saved again
    group_errors: dict[str, str] = field(default_factory=dict)
    #: its recent publishes by producer and sequence (None: to be built from the log)
    recent: Recent | None = None
    #: the log's next offset at a tick, and since when it has been that (a quiet topic
    #: lets go of ``recent``: :meth:`Catalogue.forget_quiet`)
    quiet: tuple[int, float] = (-1, 0.0)
    #: on a member of a group replicated ``sync``: the offsets below this are stored by
    #: enough replicas (acknowledged, never cut by a failover), and only those are
    #: delivered; a master moves it as its replicas acknowledge, a replica as its master
    #: says (:mod:`mq.replication._shipper`)
    committed: int = 0


class Catalogue:
    """The topics of one server, under ``directory`` (one folder per topic) or in memory
    only (``directory`` None: every topic is a bounded ring).  ``dead`` is called for a
    message out of deliveries (the server moves it to its dead-letter topic); ``tick``
    is the seconds between position saves, for the log."""

    def __init__(self, node: TrackNode, directory: Path | None, commit: GroupCommit, *,
                 segment_bytes: int, ack_timeout: float, max_deliveries: int,
                 dead: Callable[[str, str, Record, int], None], tick: float) -> None:
        self.node = node
        self.address = node.address.address
        self.directory = directory
        self.commit = commit
        self.segment_bytes = segment_bytes
        self.ack_timeout = ack_timeout
        self.max_deliveries = max_deliveries
        self.dead = dead
        self.tick = tick
        self.topics: dict[str, TopicState] = {}
        #: What its topics' logs keep in memory for readers, against one budget.
        self.kept = Kept()
        #: Set on a server whose group replicates ``sync``: a topic on disk delivers only
        #: what is committed (:attr:`TopicState.committed`).
        self.deliver_committed = False
        #: topics found on disk that cannot be opened, by directory name: why
        self.unavailable: dict[str, str] = {}
        #: the topics whose groups' floors or filters changed (each topic adds itself),
        #: and those whose replicas must hear of something else (the shipper adds them):
        #: what a master's next shipment of positions looks at, in order
        self.moved: dict[str, None] = {}
        #: Counts every topic added or dropped: a replica that saw this generation's
        #: topics is answered, as long as it stays, that nothing changed (``query``'s
        #: ``since``), instead of every topic described again at each beat.
        self.generation = 0
        #: Writes the positions a tick saves, off the pump (None: on it, as every save
        #: made at once is, e.g. a new group's start; see mq.storage._cursor).
        self.saver = (CursorSaver(lambda call: commit.from_thread("mq positions saved", call))
                      if commit.threaded and directory is not None else None)

    def load(self) -> None:
        """Open every topic found under the directory; one that cannot be opened is
        reported with its file and reason and left out (:attr:`unavailable`), and the
        others are served."""
        assert self.directory is not None
        for meta_path in sorted(self.directory.glob(f"*/{META}")):
            try:
                name, flags, groups = read_meta(meta_path)
                state = self.open(name, flags, groups)
            except (StoreError, OSError) as exc:
                reason = str(exc) if isinstance(exc, StoreError) else (
                    f"{meta_path.parent}: cannot be read: {exc.strerror or exc}")
                self.unavailable[meta_path.parent.name] = reason
                log.error("%s: a topic is not served: %s", self.address, reason)
                continue
            for group, filter in groups.items():
                try:
                    # a group with no saved position starts where nothing can be missed
                    state.topic.declare_group(group, filter=filter, start="beginning")
                except (FilterError, ValueError) as exc:
                    log.error("%s: %s: group %r left out: %s", self.address, meta_path, group,
                              exc)
                    continue
                state.filters[group] = filter
                self.node.declare_group(name, group, filter=filter)  # routes show it
            log.info("%s: topic %s: %d messages, groups %s", self.address, name,
                     state.topic.log.next_offset - state.topic.log.start_offset,
                     sorted(state.filters))

    def open(self, name: str, flags: frozenset[str], groups: Iterable[str] = ()
             ) -> TopicState:
        """A topic's log, cursors (of ``groups``, the groups its meta lists) and state."""
        topic_dir = cursors = None
        if "memory" in flags or self.directory is None:
            log_: TopicLog | MemoryLog = MemoryLog()
            saved: dict[str, int] = {}
        else:
            # the only place a topic's name reaches the file system: see mq.storage._names
            topic_dir = self.directory / disk_name(name)
            log_ = TopicLog(topic_dir, segment_bytes=self.segment_bytes,
                            flush_in_thread=self.commit.fsync_thread, kept=self.kept)
            cursors = CursorStore(topic_dir, self.saver)
            saved = cursors.load(groups)
        topic = Topic(name, log_, clock=self.node.pump.now, saved=saved,
                      ack_timeout=self.ack_timeout, max_deliveries=self.max_deliveries,
                      dead=self.dead, moved=self.moved)
        state = self.topics[name] = TopicState(topic, flags, topic_dir, cursors)
        self.generation += 1
        self.commit.add(name, log_)
        self.node.declare_topic(name, mask=sum(FLAGS[f] for f in flags))
        return state

    def get(self, name: str) -> TopicState:
        """The topic ``name``: a 404 when there is none, a 503 when it is on disk but
        cannot be opened (with why)."""
        state = self.topics.get(name)
        if state is None:
            if name in self.unavailable:
                raise ServiceError(Status.UNAVAILABLE,
                                   f"topic {name!r} cannot be opened: {self.unavailable[name]}")
            raise ServiceError(Status.NOT_FOUND, f"no topic {name!r} on {self.address}")
        return state

    def save_meta(self, state: TopicState) -> None:
        if state.directory is not None:
            write_file(state.directory / META, encode_meta(state.topic.name, state.flags,
                                                          state.filters))

    def save_positions(self, state: TopicState, *, later: bool = False) -> None:
        """Save the positions that changed, now (``later``: in the saver's thread, if
        the catalogue has one; the tick's saves).  One that cannot be saved is kept in
        memory and tried again every tick; its group shows why (``query``), and the
        failure is logged once when it starts, not at every try."""
        floors = state.topic.floors_to_save()
        cursors = state.cursors
        if cursors is None or not floors:
            return
        if later and self.saver is not None:
            self.saver.submit([(group, cursors.path(group), floor)
                               for group, floor in floors.items()],
                              lambda errors: self._saved(state, list(floors), errors))
            return
        errors: dict[Any, OSError] = {}
        for group, floor in floors.items():
            try:
                cursors.save(group, floor)
            except OSError as exc:
                errors[group] = exc
        self._saved(state, list(floors), errors)

    def _saved(self, state: TopicState, groups: list[str], errors: dict[Any, OSError]
               ) -> None:
        """The positions of ``groups`` were saved, but for ``errors``'."""
        if self.topics.get(state.topic.name) is not state:
            return  # dropped since
        for group in groups:
            if group not in state.topic.groups:
                continue  # removed since
            exc = errors.get(group)
            if exc is not None:
                error = f"cannot save the group's position: {exc.strerror or exc}"
                if state.group_errors.get(group) != error:
                    log.error("%s: %s/%s: %s; it is kept in memory and tried again every "
                              "%g s", self.address, state.topic.name, group, error,
                              self.tick)
                state.group_errors[group] = error
                state.topic.groups[group].dirty = True
            elif state.group_errors.pop(group, None) is not None:
                log.warning("%s: %s/%s: the group's position is saved again",
                            self.address, state.topic.name, group)

    def remove_group(self, state: TopicState, group: str) -> None:
        state.topic.remove_group(group)
        state.filters.pop(group, None)
        state.group_errors.pop(group, None)
        if state.cursors is not None:
            state.cursors.remove(group)
        self.save_meta(state)
        self.node.remove_group(state.topic.name, group)

    def drop(self, state: TopicState) -> None:
        """The topic goes, its files with it (its consumers are the server's to end)."""
        for group in list(state.topic.groups):
            state.topic.remove_group(group)
            if state.cursors is not None:  # (and no save queued writes it back)
                with contextlib.suppress(OSError):  # the folder goes anyway
                    state.cursors.remove(group)
        state.topic.log.close()
        del self.topics[state.topic.name]
        self.generation += 1
        self.commit.remove(state.topic.name)
        if state.directory is not None:
            # a topic's own directory, one level below the server's (mq.storage._names)
            assert self.directory is not None and state.directory.parent == self.directory
            shutil.rmtree(state.directory, ignore_errors=True)
        self.node.remove_topic(state.topic.name)

    def failed(self, state: TopicState, work: str, reason: str,
               exc: BaseException | None = None) -> None:
        """A topic's error state: logged once when it starts (or changes), shown by
        ``query`` until the topic's work succeeds again."""
        error = f"{work} failed: {reason}"
        if state.error != error:
            log.error("%s: topic %s: %s; the topic shows this error, the other topics go "
                      "on", self.address, state.topic.name, error, exc_info=exc)
        state.error = error

    def forget_quiet(self, state: TopicState, now: float) -> None:
        """A topic that has stored nothing for :data:`~._dedupe.QUIET` seconds lets go of
        its recent publishes (about 1 MB once it has seen 4,096): its next publish builds
        them again from its log's newest records, as after a restart."""
        if state.recent is None:
            return
        stored = state.topic.log.next_offset
        if stored != state.quiet[0]:
            state.quiet = (stored, now)
        elif now - state.quiet[1] >= QUIET:
            state.recent = None

    def works_again(self, state: TopicState) -> None:
        if state.error is not None:
            log.warning("%s: topic %s serves again (it had failed: %s)", self.address,
                        state.topic.name, state.error)
            state.error = None

    def retain(self, max_bytes: int | None, max_age: float | None) -> None:
        """Retention: whole segments go from each disk topic larger than ``max_bytes`` or
        whose newest message is older than ``max_age`` seconds; a group that had not
        handled what went is named in the log."""
        for state in self.topics.values():
            topic_log = state.topic.log
            gone = topic_log.retain(max_bytes=max_bytes, max_age=max_age)
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

    def describe(self, name: str) -> dict[str, Any]:
        """A topic as ``query`` shows it: flags, depth, offsets, error state, damage
        found on disk, and each group's filter, lag, consumers, messages in flight,
        dead letters and status."""
        state = self.topics[name]
        topic = state.topic
        groups = {}
        for g in topic.groups.values():
            groups[g.name] = {"filter": state.filters.get(g.name), "lag": topic.lag(g.name),
                              "consumers": len(g.consumers), "inFlight": g.in_flight_count,
                              "deadLetters": g.dead_letters,
                              "status": self._group_status(state, g.name)}
        described: dict[str, Any] = {
            "flags": sorted(state.flags), "depth": topic.depth,
            "start": topic.log.start_offset, "next": topic.log.next_offset,
            "error": state.error, "groups": groups}
        if topic.log.persistent:
            described["corrupt"] = [{"file": c.file, "position": c.position,
                                     "offsets": [c.first, c.last]}
                                    for c in topic.log.corruptions]
        return described

    def _group_status(self, state: TopicState, group: str) -> str:
        """Why a group is where it is, in a few words: ``ok`` when it can advance."""
        if group in state.group_errors:
            return f"error: {state.group_errors[group]}"
        if state.error is not None:
            return f"error: {state.error}"
        g = state.topic.groups[group]
        if state.topic.lag(group) == g.in_flight_count + len(g.redeliver) == 0:
            return "ok"
        if not g.consumers:
            return "waiting for a consumer"
        if all(c.credits <= 0 for c in g.consumers):
            return f"every consumer's window is full ({g.in_flight_count} unacknowledged)"
        if g.next_read >= self.visible(state) and not g.redeliver:
            if g.next_read >= state.topic.log.next_offset:
                return "ok"
            if g.next_read >= self.commit.visible(state.topic.log):
                return "waiting for messages to be stored"
            return "waiting for replicas to store messages"
        return "ok"

    def visible(self, state: TopicState) -> int:
        """The offsets below this may be delivered: what the durability policy made
        durable and, on a server of a group replicated ``sync``, what enough replicas
        stored (a message a failover may cut is never delivered)."""
        end = self.commit.visible(state.topic.log)
        if self.deliver_committed and "memory" not in state.flags:
            return min(end, state.committed)
        return end

    def close(self) -> None:
        """Save every position and close the files (the group commit has synced them);
        the saves under way in the saver's thread are waited for."""
        if self.saver is not None:
            self.saver.close()
        for state in self.topics.values():
            self.save_positions(state)
            state.topic.log.close()
