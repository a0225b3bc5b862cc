"""The server role of tracking: a broker's topics and consume groups, published to trackers.

A server publishes *its own* ServerInfo (``track_pub``) to each of its
trackers: when the link opens, on every change and every ``report_interval``,
and ``live: false`` on a clean shutdown; after the first on a link, as a patch of the
one it last sent there (what changed).  A new version is taken on every
change, from a :class:`~.info.VersionCounter`.  Clients that hold the server
statically watch it (``server_sub``): they get its ServerInfo at once and
after every change, coalesced behind a slow reader like the reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace

from channels import MessageQueue
from pump import ConfigError, Pump, Repeating

from .._broker import Broker
from .._groups import GroupMember
from .._link import BrokerLink
from .._rpc import Sent, send
from .._service import PushTable, ServiceError
from .feed import patch_value
from .info import ConsumeGroupInfo, ServerAddress, ServerInfo, TopicInfo, VersionCounter

log = logging.getLogger("rdvpump.tracking")

#: Seconds between a server's reports to its trackers, as zbus.
DEFAULT_REPORT_INTERVAL = 30.0
SERVER_VERSION = "rdvpump-tracking-1"


class ServerRole:
    """The topics and consume groups a broker serves, and its publishers to trackers.

    ``changed(info)`` runs after every new ServerInfo (the node's own tracker
    role, if any, reports it); ``count(cmd, nbytes)`` counts what is sent.
    """

    def __init__(self, broker: Broker, address: ServerAddress, trackers: Iterable[str], *,
                 versions: VersionCounter, report_interval: float, retry: float,
                 changed: Callable[[ServerInfo], None],
                 count: Callable[[str, int], object],
                 group: GroupMember | None = None) -> None:
        self.broker = broker
        self.pump: Pump = broker.pump
        self.address = address
        self.report_interval = report_interval
        self.retry = retry
        self._versions = versions
        self._changed_hook = changed
        self.count = count
        #: by name, in order (kept so as topics come, not sorted again at each change)
        self.topics: dict[str, TopicInfo] = {}
        #: Its place in a replicated group (published in its ServerInfo), or None; the
        #: records it holds, as its MQ server last said (a group's members only).
        self.group = group
        self.held: int | None = None
        self.info = ServerInfo(address, versions.next(), SERVER_VERSION,
                               tuple(ServerAddress(t) for t in trackers), {}, group=group)
        self.publishers = [_Publisher(self, t) for t in self.info.tracker_list]
        #: Clients watching this server (``server_sub``): queue -> a ServerInfo is owed.
        self.watchers: dict[MessageQueue, bool] = {}
        self._report_timer: Repeating | None = None
        self._encoded: bytes | None = None  # self.info's, made when first sent

    def encoded_info(self) -> bytes:
        """:attr:`info` as JSON bytes, made once per version (every tracker and watcher
        is sent the same)."""
        if self._encoded is None:
            self._encoded = self.info.encoded()
        return self._encoded

    def start(self) -> None:
        for publisher in self.publishers:
            publisher.connect()
        self._report_timer = self.pump.call_every(self.report_interval, self._report)

    # -- topics and consume groups -----------------------------------------------------

    def _now_ms(self) -> int:
        return int(self.pump.now() * 1000)

    def declare_topic(self, name: str, *, mask: int = 0, creator: str | None = None) -> TopicInfo:
        """Declare (or re-declare with a new mask) a topic; its default group is its name."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a topic name must be a non-empty string, got {name!r}")
        now = self._now_ms()
        old = self.topics.get(name)
        if old is None:
            topic = TopicInfo(self.address, name, SERVER_VERSION, mask, 0, 0,
                              (ConsumeGroupInfo(name, name, created_time=now,
                                                last_updated_time=now),),
                              creator, now, now)
        else:
            topic = replace(old, mask=mask, last_updated_time=now)
        later = old is None and self.topics and name < next(reversed(self.topics))
        self.topics[name] = topic
        if later:  # a name before the last: the table sorted again, once
            self.topics = dict(sorted(self.topics.items()))
        self._changed()
        return topic

    def remove_topic(self, name: str) -> None:
        if self.topics.pop(name, None) is None:
            raise KeyError(f"no topic {name!r} on {self.address}")
        self._changed()

    def declare_group(self, topic: str, group: str, *, mask: int = 0,
                      filter: str | None = None) -> ConsumeGroupInfo:
        info = self._topic(topic)
        if filter is not None and len(filter.encode()) > 127:
            raise ConfigError("a group filter is at most 127 bytes")
        now = self._now_ms()
        old = info.group(group)
        new = ConsumeGroupInfo(topic, group, mask, filter, 0 if old is None else old.message_count,
                               0 if old is None else old.consumer_count,
                               () if old is None else old.consumer_list,
                               created_time=now if old is None else old.created_time,
                               last_updated_time=now)
        groups = tuple(g for g in info.consume_group_list if g.group_name != group) + (new,)
        self.topics[topic] = replace(info, consume_group_list=groups, last_updated_time=now)
        self._changed()
        return new

    def remove_group(self, topic: str, group: str) -> None:
        info = self._topic(topic)
        if info.group(group) is None:
            raise KeyError(f"topic {topic!r} on {self.address} has no group {group!r}")
        groups = tuple(g for g in info.consume_group_list if g.group_name != group)
        self.topics[topic] = replace(info, consume_group_list=groups,
                                     last_updated_time=self._now_ms())
        self._changed()

    def update_group(self, topic: str, group: str, *, message_count: int | None = None,
                     consumers: Iterable[str] | None = None) -> None:
        """New message count or consumer list of a group; the topic's totals follow."""
        info = self._topic(topic)
        old = info.group(group)
        if old is None:
            raise KeyError(f"topic {topic!r} on {self.address} has no group {group!r}")
        now = self._now_ms()
        new = replace(old, last_updated_time=now,
                      message_count=old.message_count if message_count is None else message_count,
                      consumer_list=old.consumer_list if consumers is None else tuple(consumers))
        new = replace(new, consumer_count=len(new.consumer_list))
        groups = tuple(new if g.group_name == group else g for g in info.consume_group_list)
        self.topics[topic] = replace(
            info, consume_group_list=groups, last_updated_time=now,
            message_depth=max((g.message_count for g in groups), default=0),
            consumer_count=sum(g.consumer_count for g in groups))
        self._changed()

    def set_held(self, held: int) -> None:
        """The records a replicated group's member holds over its topics now (how far
        behind its master a slave is): a new ServerInfo when it changed."""
        if held != self.held:
            self.held = held
            self._changed()

    def set_group(self, group: GroupMember | None) -> None:
        """A new place in a replicated group (a promotion, say): a new ServerInfo."""
        if group != self.group:
            self.group = group
            self._changed()

    def _topic(self, name: str) -> TopicInfo:
        try:
            return self.topics[name]
        except KeyError:
            raise KeyError(f"no topic {name!r} on {self.address}") from None

    def _changed(self) -> None:
        """A new ServerInfo version, published to every tracker."""
        self.info = ServerInfo(self.address, self._versions.next(), SERVER_VERSION,
                               self.info.tracker_list, dict(self.topics),
                               group=self.group, held=self.held)
        self._encoded = None
        for publisher in self.publishers:
            publisher.publish()
        for queue in list(self.watchers):
            self._tell(queue)
        self._changed_hook(self.info)

    # -- clients that watch this server ------------------------------------------------

    def watch(self, queue: MessageQueue) -> None:
        """A ``server_sub``: our ServerInfo now and after every change."""
        self.watchers[queue] = False
        self._tell(queue)

    def unwatch(self, queue: MessageQueue) -> None:
        self.watchers.pop(queue, None)

    def _tell(self, queue: MessageQueue) -> None:
        if self.watchers.get(queue) is not False:
            return  # gone, or behind: the latest goes when it drains
        # the cached encoding spliced in: a JSON object of the same keys, sorted
        message = b'{"cmd":"server","serverInfo":' + self.encoded_info() + b"}"
        outcome = send(queue, message, what=f"watcher {queue.remote_id}")
        if outcome is Sent.SENT:
            self.count("server", len(message))
        elif outcome is Sent.FULL:
            self.watchers[queue] = True
        else:
            self.unwatch(queue)

    def drained(self, queue: MessageQueue) -> None:
        if self.watchers.get(queue):
            self.watchers[queue] = False
            self._tell(queue)

    def _report(self) -> None:
        for publisher in self.publishers:
            publisher.publish()

    def pause_reports(self) -> None:
        """Stop the periodic reports while the links stay up: what a hung server looks
        like to its trackers (tests and ``rdvpump bench routes`` use it)."""
        if self._report_timer is not None:
            self._report_timer.cancel()
            self._report_timer = None

    def close(self) -> None:
        """Clean shutdown: every tracker hears ``live: false``, then its link closes."""
        if self._report_timer is not None:
            self._report_timer.cancel()
        for publisher in self.publishers:
            publisher.close()


class _Publisher(BrokerLink):
    """A server's link to one of its trackers: ``track_pub`` of its own ServerInfo only."""

    def __init__(self, role: ServerRole, tracker: ServerAddress) -> None:
        super().__init__(role.broker, tracker.broker_id, tracker.port,
                         name=f"tracker {tracker.address}", retry=role.retry)
        self.role = role
        self.address = tracker
        #: A report is owed: the last one did not fit under the high-water mark.
        self.behind = False
        #: The ServerInfo last sent on this link: the next report is a patch of it.
        self.sent: ServerInfo | None = None
        #: The tracker refused a patch for another reason than its base (a tracker that
        #: takes none): only whole reports on this link.
        self.whole_only = False
        #: A tracker sends a publisher nothing but a refusal of its report.
        self.pushes = PushTable(f"tracker {tracker}", {}, refused=self._refused)

    def opened(self) -> None:
        self.behind = False
        self.sent = None
        self.whole_only = False
        self.publish()

    def publish(self, live: bool = True) -> None:
        """Our ServerInfo to the tracker, or a patch of the one last sent on this link
        (what changed: a report costs the change, not every topic); coalesced like
        snapshots (the latest wins)."""
        if self.queue is not None and not self.behind:
            info, sent = self.role.info, self.sent
            if live and sent is not None and not self.whole_only:
                message = b'{"cmd":"track_pub","live":true,"patch":%s}' % patch_value(
                    sent, info)
            else:
                message = b'{"cmd":"track_pub","live":%s,"serverInfo":%s}' % (
                    b"true" if live else b"false", self.role.encoded_info())
            outcome = self.send(message)
            if outcome is Sent.SENT:
                self.role.count("track_pub", len(message))
                self.sent = info
            self.behind = outcome is Sent.FULL

    def _refused(self, error: ServiceError) -> None:
        """The tracker refused a report.  A patch of what it does not hold (it dropped our
        entry: an expiry) is answered with the whole ServerInfo; a patch refused for
        another reason (a tracker that takes none) too, and this link sends only whole
        ones from then on; a whole one refused is logged."""
        if self.whole_only:
            log.warning("tracker %s refused our report: %s", self.address, error)
            return
        if error.detail.get("whole") is True:
            log.info("tracker %s: %s", self.address, error)
        else:
            log.warning("tracker %s refused a patch (%s): whole reports from now on",
                        self.address, error)
            self.whole_only = True
        self.sent = None
        self.publish()

    def drained(self) -> None:
        if self.behind:
            self.behind = False
            self.publish()

    def goodbye(self) -> None:
        self.publish(live=False)

