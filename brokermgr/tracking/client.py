"""The client of tracking: a route table fed by trackers and static servers, and the
routing half of producers and consumers.

A client subscribes to trackers (``track_sub``): a full snapshot, then
deltas (:mod:`.feed`), merged into its :class:`~.routes.RouteTable`.  A
static server is watched (``server_sub``): its ServerInfo on every
(re)connect and after every change it makes.  Both links are reconnecting
links (:mod:`brokermgr._link`).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from typing import Any

import trio

from pump import ConfigError

from .._broker import DEFAULT_CLOSE_TIMEOUT, Broker, wait_all_sent
from .._link import DEFAULT_RETRY, BrokerLink
from .._service import Fields, Push, PushTable
from .feed import FeedReader, PatchBase, Resync, Snapshot, patched
from .info import InfoError, ServerAddress, ServerInfo, TrackerInfo
from .routes import DEFAULT_VOTE_FACTOR, DeltaError, RouteChange, RouteTable
from .select import RoundRobin, Selector, all_servers

log = logging.getLogger("rdvpump.tracking")

#: The rendezvous port of a tracking broker, zbus's.
DEFAULT_TRACK_PORT = 15555


class RouteClient:
    """A client's route table, fed by trackers (dynamic) and static servers.

    ``add_tracker(address)`` subscribes to a tracker (``track_sub``) and merges
    its table (with ``deltas``, the default, a snapshot and then what changed;
    without, zbus's whole TrackerInfo after every change); when the link
    drops the tracker's votes go (``remove_tracker``) and it is dialled again
    every ``retry`` seconds.  ``add_server(address)`` pins a server and
    watches its ServerInfo over a link of its own: it is current within one
    message of every change the server makes.  ``remove_server(address)``
    hides a server until it is added again (see :mod:`.routes`).
    ``on_change(change)`` callbacks run after every update that changed
    something; ``await changed()`` waits for the next one.
    """

    def __init__(self, broker: Broker, *, vote_factor: float = DEFAULT_VOTE_FACTOR,
                 retry: float = DEFAULT_RETRY, deltas: bool = True) -> None:
        if not retry > 0:
            raise ConfigError(f"retry must be positive, got {retry!r}")
        self.broker = broker
        self.retry = retry
        self.deltas = deltas
        self.routes = RouteTable(vote_factor=vote_factor)
        self.trackers: dict[str, _Subscription] = {}
        self.servers: dict[str, _ServerQuery] = {}
        self.ssl_cert_files: dict[str, str] = {}
        self.callbacks: list[Callable[[RouteChange], object]] = []
        self._event = trio.Event()
        #: How many times the table changed (or a fresh TrackerInfo came): what a caller
        #: that was busy meanwhile compares, where :meth:`changed` waits for the next.
        self.changes = 0

    # -- zbus's client API --------------------------------------------------------------

    def add_tracker(self, address: str) -> None:
        """Track the servers ``address`` tracks (dynamic routes)."""
        if address in self.trackers:
            return
        sub = _Subscription(self, ServerAddress(address))
        self.trackers[address] = sub
        sub.connect()

    def remove_tracker(self, address: str) -> None:
        sub = self.trackers.pop(address, None)
        if sub is not None:
            sub.close()
            self.apply(self.routes.remove_tracker(address))

    def add_server(self, address: str) -> None:
        """Route to ``address`` whatever the trackers say (static routes)."""
        if address in self.servers:
            return
        query = _ServerQuery(self, ServerAddress(address))
        self.servers[address] = query
        query.connect()

    def remove_server(self, address: str) -> None:
        query = self.servers.pop(address, None)
        if query is not None:
            query.close()
        self.apply(self.routes.remove_server(address))

    def add_ssl_cert_file(self, address: str, cert_file: str | os.PathLike[str]) -> None:
        """Reach the server at ``address`` over TLS, trusting the certificate(s) in
        ``cert_file`` (PEM; a CA or the server's own certificate).

        Every link this process dials to that broker then uses TLS checked
        against that file; no client certificate is presented on those links.
        """
        broker_id = ServerAddress(address).broker_id
        path = os.fspath(cert_file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"certificate file {path!r} does not exist")
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=path)
        self.broker.manager.use_tls_to(broker_id, context)
        self.ssl_cert_files[address] = path

    # -- selection ---------------------------------------------------------------------

    def select(self, topic: str, selector: Selector, key: bytes | str | None = None
               ) -> list[str]:
        return selector(self.routes, topic, key)

    def on_change(self, callback: Callable[[RouteChange], object]) -> None:
        self.callbacks.append(callback)

    async def changed(self) -> None:
        """Wait for the next change of the route table (or a fresh TrackerInfo)."""
        await self._event.wait()

    def close(self) -> None:
        for sub in self.trackers.values():
            sub.close()
        for query in self.servers.values():
            query.close()

    async def aclose(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> None:
        """:meth:`close`, then wait (up to ``timeout`` in all) until every link's last bytes
        and its close have left this process, so that it may end without its trackers and
        servers taking the close for a lost connection."""
        links = [*self.trackers.values(), *self.servers.values()]
        queues = [link.queue for link in links if link.queue is not None]
        self.close()
        await wait_all_sent(queues, timeout)

    def apply(self, change: RouteChange, *, notify: bool = False) -> None:
        """Run the callbacks if the table changed; wake ``changed()`` waiters if it did
        or ``notify`` (a fresh TrackerInfo that changed nothing)."""
        if change:
            for callback in list(self.callbacks):
                callback(change)
        if change or notify:
            self.changes += 1
            self._event.set()
            self._event = trio.Event()


class _ClientLink(BrokerLink):
    """A link of the client's broker to a tracker or a server."""

    def __init__(self, client: RouteClient, address: ServerAddress, what: str) -> None:
        super().__init__(client.broker, address.broker_id, address.port,
                         name=f"{what} {address.address}", retry=client.retry)
        self.client = client
        self.address = address

    def _bad(self, what: str, exc: BaseException) -> None:
        self.protocol_error(f"bad {what}: {exc}")


class _Subscription(_ClientLink):
    """A client's ``track_sub`` link to one tracker."""

    def __init__(self, client: RouteClient, tracker: ServerAddress) -> None:
        super().__init__(client, tracker, "tracker")
        self.reader = FeedReader()
        #: The tracker's feed, in pieces (:class:`~.feed.FeedReader` checks each).
        self.pushes = PushTable(self.name, {"track_pub": Push.raw(self._feed),
                                            "track_delta": Push.raw(self._feed)})
        #: Full snapshots asked for again after a gap (tests and benchmarks read it).
        self.resyncs = 0
        #: The tracker's own address (``<broker id>:<port>``), as its snapshots say.
        self.reported: str | None = None

    def opened(self) -> None:
        self.reader = FeedReader()
        self._subscribe()

    def _subscribe(self) -> None:
        self.send({"cmd": "track_sub", "deltas": True, "split": True, "patches": True}
                  if self.client.deltas
                  else {"cmd": "track_sub"})

    def _feed(self, obj: dict[str, Any]) -> None:
        """A piece of the tracker's feed: a snapshot's or a delta's."""
        routes = self.client.routes
        tracker = self.address.address
        try:
            event = self.reader.receive(obj)
            if event is None:
                return
            if isinstance(event, Resync):
                self._resync(event.reason)
                return
            held = routes.votes.get(tracker)
            if isinstance(event, Snapshot):
                info = TrackerInfo.from_json(event.tracker_info,
                                             known=None if held is None else held.servers.get)
                change = routes.update_tracker(tracker, info)
                self.reported = info.server_address.address
            else:
                servers = {}
                for address, value in event.servers.items():
                    where = f"track_delta.servers[{address!r}]"
                    server = ServerInfo.from_json(value, where, previous=None if held is None
                                                  else held.servers.get(address))
                    if server.server_address.address != address:
                        raise InfoError(f"{where} holds server "
                                        f"{server.server_address.address!r}")
                    servers[address] = server
                for address, value in event.patches.items():
                    servers[address] = _patched(
                        address, None if held is None else held.servers.get(address), value)
                change = routes.apply_delta(tracker, event.version, servers, event.left)
        except DeltaError as exc:
            self._resync(str(exc))
            return
        except (ValueError, RecursionError) as exc:
            self._bad("tracker feed", exc)
            return
        self.client.apply(change, notify=not change.stale)

    def _resync(self, reason: str) -> None:
        self.resyncs += 1
        log.info("%s: asking for a full snapshot again: %s", self.name, reason)
        self.reader.expected = None
        self._subscribe()

    def lost(self, reason: str) -> None:
        self.client.apply(self.client.routes.remove_tracker(self.address.address))


def _patched(address: str, held: ServerInfo | None, patch: dict[str, Any]) -> ServerInfo:
    """``address``'s ServerInfo from ``held`` and a patch of it (:func:`.feed.patch`);
    :class:`DeltaError` (ask for a full snapshot) when ``held`` is not its base."""
    try:
        return patched(held, patch, f"track_delta.patches[{address!r}]")
    except PatchBase as exc:
        raise DeltaError(str(exc)) from None


class _ServerQuery(_ClientLink):
    """A client's link to a static server: it watches the server's ServerInfo."""

    def __init__(self, client: RouteClient, server: ServerAddress) -> None:
        super().__init__(client, server, "server")
        self.pushes = PushTable(self.name, {"server": Push(self._server_info, self._server)})

    def opened(self) -> None:
        self.send({"cmd": "server_sub"})

    def _server_info(self, fields: Fields) -> ServerInfo:
        """The server's ``serverInfo``: its own (it says what it is asked of)."""
        info = fields.parsed("serverInfo", ServerInfo.from_json)
        if info.server_address.address != self.address.address:
            raise fields.bad("serverInfo", f"holds {info.server_address.address}, asked "
                                           f"{self.address.address}")
        return info

    def _server(self, info: ServerInfo) -> None:
        if self.address.address in self.client.servers:
            self.client.apply(self.client.routes.update_server(info))


class ProducerRoute:
    """The routing half of a producer: which server(s) a message for ``topic`` goes to.

    ``selector`` defaults to zbus's producer rule (:class:`RoundRobin`).
    """

    def __init__(self, client: RouteClient, topic: str, selector: Selector | None = None
                 ) -> None:
        self.client = client
        self.topic = topic
        self.selector: Selector = selector if selector is not None else RoundRobin()

    def servers(self, key: bytes | str | None = None) -> list[str]:
        return self.client.select(self.topic, self.selector, key)


class ConsumerRoute(ProducerRoute):
    """The routing half of a consumer: the servers to consume ``topic`` from (default: all)."""

    def __init__(self, client: RouteClient, topic: str, selector: Selector | None = None
                 ) -> None:
        super().__init__(client, topic, selector if selector is not None else all_servers)
