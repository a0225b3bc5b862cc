"""The engine of ``rdvpump mq``: a throwaway broker in this process, linked over TCP to an
MQ server broker of another process, and what each subcommand does with it."""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from brokermgr import BrokerManager, NameClient, ServiceError, Status
from brokermgr.tracking import DEFAULT_TRACK_PORT
from mq import MqClient
from pump import ConfigError
from rdv import Address, is_final, parse_located

from ._dial import NotBound, refusal_text, tool_universe

T = TypeVar("T")

#: How often the CLI dials a server that is not reachable yet, within its ``timeout``.
CLI_RETRY = 0.1


def parse_server(text: str) -> tuple[str, Address]:
    """``BROKER@HOST:PORT``: the MQ server's broker id and its process's address."""
    broker_id, _, _ = text.rpartition("@")
    if not broker_id:
        raise ConfigError(f"server {text!r}: expected BROKER@HOST:PORT (the broker id, and "
                         f"the address its process printed as ready)")
    _, address = parse_located(text)
    return broker_id, address


@asynccontextmanager
async def connect(universe: str, server: str, *, token: str = "", identity: str | None = None,
                  track_port: int = DEFAULT_TRACK_PORT, timeout: float = 10.0
                  ) -> AsyncIterator[MqClient]:
    broker_id, address = parse_server(server)
    async with tool_universe(universe, name="mq-cli", token=token, identity=identity,
                             directory={broker_id: address}) as manager:
        client = MqClient(manager.add_broker(f"@mq.{os.getpid()}"),
                          f"{broker_id}:{track_port}", timeout=timeout, retry=CLI_RETRY)
        link = client.link
        # a server that is still starting is dialled again until ``timeout``; a refusal
        # that dialling cannot mend (unauthorized, unknown broker) ends it at once, and a
        # broker that answers without a server on the port ends it after a grace
        unbound = NotBound()
        with trio.move_on_after(timeout):
            while link.queue is None:
                await link.attempted()
                if link.queue is None and is_final(link.last_refusal):
                    raise OSError(refusal_text(server, link.last_refusal))
                if unbound.too_long(link.last_refusal, link.queue is not None):
                    raise OSError(f"{server}: no MQ server there: broker {broker_id} "
                                  f"answers, but nothing is bound on its port "
                                  f"{track_port} (is it a broker run --role server?)")
        if link.queue is None:
            why = f": {link.last_refusal}" if link.last_refusal is not None else ""
            raise OSError(f"{server}: no link within {timeout} s{why}")
        try:
            yield client
        finally:
            await client.aclose()  # the last acks leave before the links are cut


#: Seconds between a following client's questions to the name service for its group's
#: master, while none other than the one lost is named.
FOLLOW_POLL = 0.02


class Following:
    """The master of the replicated group ``group``, found through the name service and
    followed: after its link is lost or it refuses as a slave, :meth:`move` waits (up to
    ``timeout``) until the name service names a master (another, or the same one back)
    and links to it, saying so on one line.  The client keeps one producer id, so that a
    publish tried again at the new master is not stored twice."""

    def __init__(self, manager: BrokerManager, names: NameClient, group: str, *,
                 track_port: int, timeout: float, say: Callable[[str], None]) -> None:
        self.manager = manager
        self.names = names
        self.group = group
        self.track_port = track_port
        self.timeout = timeout
        self.say = say
        self.master: str | None = None
        self.epoch = 0
        self.producer = f"@mq.{os.getpid()}.{os.urandom(4).hex()}"
        self.moves = 0
        self.client: MqClient | None = None

    async def find(self, lost: str | None = None) -> MqClient:
        """A client of the group's master: the first one named (other than ``lost``, or
        at a newer epoch), linked within the timeout."""
        with trio.move_on_after(self.timeout):
            while True:
                try:
                    said = await self.names.group(self.group)
                except ServiceError:
                    said = {}
                master, epoch = said.get("master"), said.get("epoch") or 0
                if isinstance(master, str) and (master != lost or epoch > self.epoch):
                    client = MqClient(self.manager.add_broker(f"@mq.{self.moves}"),
                                      f"{master}:{self.track_port}", producer=self.producer,
                                      timeout=self.timeout, retry=CLI_RETRY)
                    self.moves += 1
                    with trio.move_on_after(self.timeout):
                        await client.link.up.wait()
                    if client.link.queue is not None:
                        self.master, self.epoch, self.client = master, epoch, client
                        return client
                    client.close()
                await trio.sleep(FOLLOW_POLL)
        raise OSError(f"group {self.group}: no master "
                      f"{'' if lost is None else f'other than {lost} '}named and reachable "
                      f"within {self.timeout:g} s")

    async def refused(self, why: str) -> MqClient:
        """The master refused (503: a slave, or a master not confirmed yet): the same
        client again after a moment while the name service still names it, else the
        next master."""
        await trio.sleep(FOLLOW_POLL)
        try:
            said = await self.names.group(self.group)
        except ServiceError:
            said = {}
        client = self.client
        if said.get("master") == self.master and client is not None \
                and client.link.queue is not None:
            return client
        return await self.move(why)

    async def taking_writes(self) -> None:
        """Once the master followed says it is its group's confirmed master (the name
        service names a member it promotes before the member itself took over), within
        the timeout: a consumer subscribes to the master, not to a slave."""
        assert self.client is not None
        with trio.move_on_after(self.timeout):
            while True:
                said = (await self.client.query_all()).get("group") or {}
                if said.get("confirmed"):
                    return
                await trio.sleep(FOLLOW_POLL)
        raise OSError(f"group {self.group}: {self.master} did not take writes within "
                      f"{self.timeout:g} s")

    async def move(self, why: str) -> MqClient:
        """The master was lost (``why``): the next one, said on one line."""
        lost = self.master
        if self.client is not None:
            self.client.close()
        client = await self.find(lost)
        self.say(f"group {self.group}: master {lost} lost ({why}); following "
                 f"{self.master} at epoch {self.epoch}")
        return client


@asynccontextmanager
async def connect_group(universe: str, manager_address: str, group: str, *, token: str = "",
                        identity: str | None = None, track_port: int = DEFAULT_TRACK_PORT,
                        timeout: float = 10.0, say: Callable[[str], None]
                        ) -> AsyncIterator[Following]:
    """The master of replicated group ``group`` as the name service at
    ``manager_address`` names it, followed (:class:`Following`)."""
    async with tool_universe(universe, name="mq-cli", token=token,
                             identity=identity) as manager:
        names = NameClient(manager, [Address.parse(manager_address)],
                           lookup_timeout=min(timeout, 2.0))
        names.start()
        following = Following(manager, names, group, track_port=track_port, timeout=timeout,
                              say=say)
        await following.find()
        try:
            yield following
        finally:
            if following.client is not None:
                await following.client.aclose()
            names.close()


async def publish(client: MqClient, topic: str, arrivals: AsyncIterable[list[bytes]], *,
                  tag: str | None, batch: int, progress: Callable[[int], None],
                  immediate: bool = False, following: Following | None = None
                  ) -> dict[str, Any]:
    """``rdvpump mq publish``: the messages of each arrival (:func:`arrivals`) in batches
    of at most ``batch``, each acknowledged before the next; a batch never waits for more
    input than its arrival brought (a line typed at a terminal is published as it is
    typed).  ``immediate``: a batch no consumer takes now is returned by the server, not
    stored, and counted in ``returned``; the next batches are still sent.  ``following``:
    a batch its master did not answer (lost) or refused as a slave is sent again, with
    its numbers, to the master the name service names next."""
    count = returned = 0
    first = last = stored_by = None

    async def send(pending: list[bytes]) -> None:
        nonlocal client, count, first, last, returned, stored_by
        numbers = client.sequence + 1  # the batch's first: the same on every try, so
        while True:  # a master that has it (stored before a failover) does not store it again
            try:
                if following is None:
                    stored = await client.publish_many(topic, pending, tag=tag,
                                                       immediate=immediate, sequence=numbers)
                else:  # a lost link moves on at once, not at the request's timeout
                    stored = await _or_lost(client, client.publish_many(
                        topic, pending, tag=tag, immediate=immediate, sequence=numbers))
                break
            except ServiceError as exc:
                if following is not None and exc.status in (Status.NO_REPLY,
                                                             Status.UNAVAILABLE):
                    client = await (following.move(str(exc)) if exc.status == Status.NO_REPLY
                                    else following.refused(str(exc)))
                    continue
                if exc.status != Status.GONE:
                    raise
                returned += int(exc.detail.get("returned", len(pending)))
                return
        first = stored[0].offset if first is None else first
        last = stored[-1].offset
        stored_by = stored[-1].server  # a cluster's root, when a shared topic's
        count += len(stored)
        progress(count)

    async for arrived in arrivals:
        for start in range(0, len(arrived), batch):
            await send(arrived[start:start + batch])
    via = client.server.address
    return {"topic": topic, "published": count, "first": first, "last": last,
            "returned": returned, "server": stored_by or via,
            "via": via if stored_by not in (None, via) else None}


async def consume(client: MqClient, topic: str, *, group: str | None, count: int | None,
                  idle: float, window: int, show: Callable[[Any], None],
                  following: Following | None = None) -> int:
    """Print messages and acknowledge them, until ``count`` or ``idle`` seconds without one
    (``idle`` 0: never, until ``count`` or a cancellation).  The messages here are shown
    and then acknowledged together before waiting for more, so a consumer that waits
    owes nothing it showed.  When ``show`` raises (the reader of the output went away),
    what it showed before is acknowledged and the error goes on: the message it could not
    show is not, so the group gets it again.  A server lost ends it (OSError); with
    ``following``, it goes on at the master the name service names next, which delivers
    again what the group had not acknowledged there."""
    subscription = await client.subscribe(topic, group=group, window=window)
    seen = 0
    link = client.link
    while count is None or seen < count:
        messages: list[Any] = []
        with trio.move_on_after(idle if idle > 0 else math.inf) as scope:
            messages = await _receive_or_lost(
                subscription, link, window if count is None else min(window, count - seen))
        if link.down.is_set() and not messages and following is not None:
            client = await following.move(str(link.lost_reason))
            await following.taking_writes()
            subscription = await client.subscribe(topic, group=group, window=window)
            link = client.link
            continue
        if link.down.is_set() and not messages:
            raise OSError(f"{client.server.address}: the link to the server was lost "
                          f"({link.lost_reason}) after {seen:,} messages consumed and "
                          f"acknowledged; what it delivered since its last ack comes again "
                          f"to the group")
        if scope.cancelled_caught:
            break
        acks: list[int] = []
        try:
            for message in messages:
                show(message)
                seen += 1
                acks.append(message.offset)
        finally:
            if acks:
                await subscription.ack(acks)
    return seen


async def _or_lost(client: MqClient, request: Awaitable[T]) -> T:
    """``request``'s answer, or :class:`ServiceError` ``NO_REPLY`` as soon as the
    client's link is lost (or at once, if it is down)."""
    link = client.link
    answer = await _unless_lost(link, request)
    if answer is None:
        raise ServiceError(Status.NO_REPLY, f"{client.server.address}: the link was lost "
                                            f"({link.lost_reason})")
    return answer[0]


async def _receive_or_lost(subscription: Any, link: Any, most: int) -> list[Any]:
    """``subscription.receive_many(most)``, or nothing as soon as ``link`` is lost."""
    got = await _unless_lost(link, subscription.receive_many(most))
    return [] if got is None else list(got[0])


async def _unless_lost(link: Any, request: Awaitable[T]) -> tuple[T] | None:
    """``request``'s answer (in a tuple), or None once ``link`` is lost (at once if it is
    down); a :class:`ServiceError` the request raises is raised, unless the link was
    lost meanwhile."""
    answer: list[T] = []
    failed: list[ServiceError] = []
    async with trio.open_nursery() as nursery:
        async def ask() -> None:
            try:
                answer.append(await request)
            except ServiceError as exc:
                failed.append(exc)
            nursery.cancel_scope.cancel()

        async def watch() -> None:
            await link.down.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(ask)
        nursery.start_soon(watch)
    if answer:
        return (answer[0],)
    if failed and not link.down.is_set():
        raise failed[0]
    return None


#: The most bytes of stdin one read takes (and so the most that one arrival holds).
READ_SIZE = 1 << 16


async def arrivals(files: list[str], *, fd: int = 0,
                   read_size: int = READ_SIZE) -> AsyncIterator[list[bytes]]:
    """What ``rdvpump mq publish`` publishes, as it arrives: each file whole (an arrival
    each), or else the lines of stdin (``fd``) without their newlines, an arrival per
    read: at a terminal, a line as it is typed; from a pipe, up to ``read_size`` bytes'
    worth of lines.  A line cut by a read waits for the rest of it; the last line needs
    no newline.  Stdin is read in a worker thread that a cancellation abandons, so a
    Ctrl-C ends the command at once, not at the next line or at the end of the input
    (a read blocked in this thread would hold the signal back until it returned)."""
    if files:
        for name in files:
            with open(name, "rb") as f:
                yield [f.read()]
        return
    partial = b""
    while chunk := await trio.to_thread.run_sync(os.read, fd, read_size,
                                                 abandon_on_cancel=True):
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()
        if lines:
            yield lines
    if partial:
        yield [partial]
