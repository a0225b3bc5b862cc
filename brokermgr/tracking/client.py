"""The client of tracking: a route table fed by trackers and static servers, and the
routing half of producers and consumers.

A client subscribes to trackers (``track_sub``) and merges each TrackerInfo
into its :class:`~.routes.RouteTable`; a static server is asked for its
ServerInfo (``server``) on every (re)connect.  Both links are reconnecting
links (:mod:`brokermgr._link`).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from typing import Any

import trio

from .._broker import Broker
from .._link import DEFAULT_RETRY, BrokerLink, Reply
from .info import InfoError, ServerAddress, ServerInfo, TrackerInfo
from .routes import DEFAULT_VOTE_FACTOR, RouteChange, RouteTable
from .select import RoundRobin, Selector, all_servers

log = logging.getLogger("rdvpump.tracking")

#: The rendezvous port of a tracking broker, zbus's.
DEFAULT_TRACK_PORT = 15555


class RouteClient:
    """A client's route table, fed by trackers (dynamic) and static servers.

    ``add_tracker(address)`` subscribes to a tracker (``track_sub``) and merges
    each TrackerInfo; when the link drops the tracker's votes go
    (``remove_tracker``) and it is dialled again every ``retry`` seconds.
    ``add_server(address)`` pins a server and fetches its ServerInfo over a
    link of its own.  ``on_change(change)`` callbacks run after every update
    that changed something; ``await changed()`` waits for the next one.
    """

    def __init__(self, broker: Broker, *, vote_factor: float = DEFAULT_VOTE_FACTOR,
                 retry: float = DEFAULT_RETRY) -> None:
        if not retry > 0:
            raise ValueError(f"retry must be positive, got {retry!r}")
        self.broker = broker
        self.retry = retry
        self.routes = RouteTable(vote_factor=vote_factor)
        self.trackers: dict[str, _Subscription] = {}
        self.servers: dict[str, _ServerQuery] = {}
        self.ssl_cert_files: dict[str, str] = {}
        self.callbacks: list[Callable[[RouteChange], object]] = []
        self._event = trio.Event()

    # -- the API of the notes ----------------------------------------------------------

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
        self.broker.manager.net.tls_for[broker_id] = context
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

    def apply(self, change: RouteChange, *, notify: bool = False) -> None:
        """Run the callbacks if the table changed; wake ``changed()`` waiters if it did
        or ``notify`` (a fresh TrackerInfo that changed nothing)."""
        if change:
            for callback in list(self.callbacks):
                callback(change)
        if change or notify:
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
        self.abort(f"protocol error: bad {what}: {exc}")


class _Subscription(_ClientLink):
    """A client's ``track_sub`` link to one tracker."""

    def __init__(self, client: RouteClient, tracker: ServerAddress) -> None:
        super().__init__(client, tracker, "tracker")

    def opened(self) -> None:
        self.send({"cmd": "track_sub"})

    def pushed(self, obj: dict[str, Any]) -> None:
        if obj.get("cmd") == "error":
            log.warning("%s: %s", self.name, obj.get("error"))
            return
        try:
            info = TrackerInfo.from_json(obj.get("trackerInfo"),
                                         known=self.client.routes.server_table.get)
        except (ValueError, RecursionError) as exc:
            self._bad("TrackerInfo", exc)
            return
        change = self.client.routes.update_tracker(self.address.address, info)
        self.client.apply(change, notify=not change.stale)

    def lost(self, reason: str) -> None:
        self.client.apply(self.client.routes.remove_tracker(self.address.address))


class _ServerQuery(_ClientLink):
    """A client's link to a static server: its ServerInfo on every (re)connect."""

    def __init__(self, client: RouteClient, server: ServerAddress) -> None:
        super().__init__(client, server, "server")

    def opened(self) -> None:
        self.request({"cmd": "server"}, self._answered)

    def _answered(self, reply: Reply | None) -> None:
        if reply is None:
            return  # the link closed first; it is dialled again
        if reply.get("cmd") == "error":
            log.warning("%s: %s", self.name, reply.get("error"))
            return
        try:
            info = ServerInfo.from_json(reply.get("serverInfo"))
            if info.server_address.address != self.address.address:
                raise InfoError(f"asked {self.address.address}, got the ServerInfo of "
                                f"{info.server_address.address}")
        except (ValueError, RecursionError) as exc:
            self._bad("ServerInfo", exc)
            return
        if self.address.address in self.client.servers:
            self.client.apply(self.client.routes.update_server(info, static=True))

    def pushed(self, obj: dict[str, Any]) -> None:
        if obj.get("cmd") != "error":
            self.abort("protocol error: a server sent a query something unexpected")


class Producer:
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


class Consumer(Producer):
    """The routing half of a consumer: the servers to consume ``topic`` from (default: all)."""

    def __init__(self, client: RouteClient, topic: str, selector: Selector | None = None
                 ) -> None:
        super().__init__(client, topic, selector if selector is not None else all_servers)
