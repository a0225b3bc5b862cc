"""Identities and their rights, over real TCP links on 127.0.0.1: each identity of an
identities file against each action of the MQ server and the name service, allowed or
a 403 that names the identity and the right; secrets that do not match are refused at
the handshake; admin actions and denials are logged; denials are counted."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from brokermgr import BrokerManager, NameClient, NameService, ServiceError
from brokermgr.tracking import TrackNode
from mq import MqClient, MqServer
from pump import Pump
from rdv import Credential, Identities, IdentityError, RefusedError

CREDENTIALS = {name: Credential.new(name) for name in ("alice", "bob", "ops", "a")}
RIGHTS: dict[str, dict[str, Any]] = {
    "alice": {"publish": ["orders.*"], "consume": ["orders.*"], "declare": ["orders.*"]},
    "bob": {"consume": ["orders.*"]},
    "ops": {"admin": True},
    "a": {"member": ["a"]},  # a server: speaks as broker a
}
#: The token alone may consume public topics, nothing else.
TOKEN_RIGHTS = {"consume": ["public.*"]}


def identities() -> Identities:
    return Identities.parse({
        "token": TOKEN_RIGHTS,
        "identity": {name: {"secret": CREDENTIALS[name].verifier(), **rights}
                     for name, rights in RIGHTS.items()}})


class Server:
    """One process's side: a name service and an MQ server, with an identities file."""

    def __init__(self, universe: BrokerManager) -> None:
        self.universe = universe
        self.names = NameService(universe)
        self.node = TrackNode(universe.add_broker("s1"), role="server")
        self.mq = MqServer(self.node, None)
        for topic in ("orders.x", "public.news"):
            self.mq.handle_local({"cmd": "declare", "topic": topic})

    def topics(self) -> set[str]:
        return set(self.mq.catalogue.topics)


@asynccontextmanager
async def two_processes(credential: Credential | None
                        ) -> AsyncIterator[tuple[Server, BrokerManager, trio.Nursery]]:
    """The server's side, with the identities file, and a client's side that speaks as
    ``credential`` (None: the token alone), linked only by TCP on 127.0.0.1."""
    server_side = BrokerManager("u", pump=Pump(name="server"), token="t",
                                identities=identities())
    client_side = BrokerManager("u", pump=Pump(name="client"), token="t", identity=credential)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(server_side.pump.serve)
            await nursery.start(client_side.pump.serve)
            server = Server(server_side)
            client_side.directory["s1"] = await nursery.start(server_side.serve_network,
                                                              "127.0.0.1", 0)
            await nursery.start(client_side.serve_network, "127.0.0.1", 0)
            try:
                yield server, client_side, nursery
            finally:
                nursery.cancel_scope.cancel()


@asynccontextmanager
async def server_and_client(credential: Credential | None
                            ) -> AsyncIterator[tuple[Server, MqClient, NameClient]]:
    async with two_processes(credential) as (server, client_side, _):
        who = "token" if credential is None else credential.name
        client = MqClient(client_side.add_broker(f"c-{who}"), "s1:15555", timeout=5)
        names = NameClient(client_side, [client_side.directory["s1"]])
        names.start()
        await client.connected()
        await names.connected()
        try:
            yield server, client, names
        finally:
            client.close()
            names.close()


async def _consume(server: Server, client: MqClient, names: NameClient) -> None:
    await client.subscribe("orders.x")


async def _declare(server: Server, client: MqClient, names: NameClient) -> None:
    await client.declare("orders.new")


async def _remove(server: Server, client: MqClient, names: NameClient) -> None:
    server.mq.handle_local({"cmd": "declare", "topic": "orders.old"})
    await client.remove("orders.old")
    assert "orders.old" not in server.topics()


async def _follow(server: Server, client: MqClient, names: NameClient) -> None:
    # past the right: a 400, a memory topic is not replicated
    await client.request({"cmd": "follow", "topic": "orders.x", "start": 0, "replica": "a"})


async def _failover(server: Server, client: MqClient, names: NameClient) -> None:
    await names.failover("g", "a")  # past the right: a 404, there is no group g


async def _claim(server: Server, client: MqClient, names: NameClient) -> None:
    await names.links[0].call({"cmd": "claim", "group": "g", "id": "a", "epoch": 1}, timeout=5)


async def _register_member(server: Server, client: MqClient, names: NameClient) -> None:
    await names.links[0].call({"cmd": "register", "brokers": [
        {"id": "a", "address": ["127.0.0.1", 1]}]}, timeout=5)


Action = Callable[[Server, MqClient, NameClient], Awaitable[None]]
ACTIONS: dict[str, tuple[str, Action]] = {
    # action: (the right it needs, how to do it)
    "publish": ("publish", lambda s, c, n: c.publish("orders.x", b"m")),
    "consume": ("consume", _consume),
    "declare": ("declare", _declare),
    "empty": ("declare", lambda s, c, n: c.empty("orders.x")),
    "remove": ("declare", _remove),
    "push": ("publish", lambda s, c, n: c.push("orders.rpc", b"m")),
    "follow": ("member", _follow),
    "claim": ("member", _claim),
    "register a": ("member", _register_member),
    "failover": ("admin", _failover),
}
ALLOWED = {
    "token": set(),
    "alice": {"publish", "consume", "declare", "empty", "remove", "push"},
    "bob": {"consume"},
    "ops": {"failover"},
    "a": set(ACTIONS) - {"failover"},  # a server uses every topic, and speaks as a
}


@pytest.mark.parametrize("who", list(ALLOWED))
async def test_each_identity_may_do_what_its_rights_say_and_nothing_else(
        who: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rdvpump.audit")
    async with server_and_client(CREDENTIALS.get(who)) as (server, client, names):
        outcome = {}
        for action, (right, do) in ACTIONS.items():
            try:
                await do(server, client, names)
                outcome[action] = "allowed"
            except ServiceError as exc:
                if exc.status != 403:  # past the right (no receiver, a memory topic)
                    outcome[action] = "allowed"
                    continue
                assert f"identity {who!r}" in exc.reason, exc.reason
                assert exc.detail["identity"] == who and exc.detail["right"] == right
                outcome[action] = "403"
        assert outcome == {a: "allowed" if a in ALLOWED[who] else "403" for a in ACTIONS}
        denials = server.universe.net.identities.denials
        assert sum(n for (name, _), n in denials.items() if name == who) == (
            len(ACTIONS) - len(ALLOWED[who]))
        # a refused request changed nothing
        if "declare" not in ALLOWED[who]:
            assert server.topics() == {"orders.x", "public.news", "orders.old"}
    audit = [r.getMessage() for r in caplog.records if r.name == "rdvpump.audit"]
    removed = [line for line in audit if line.startswith("mq remove topic orders.old")]
    if "remove" in ALLOWED[who]:
        assert len(removed) == 1, audit
        assert removed[0].startswith(f"mq remove topic orders.old by {who} from "
                                     f"c-{who}@127.0.0.1:") and removed[0].endswith(": done")
    else:
        assert removed == []
        assert any(line.startswith(f"denied: remove by {who} from c-{who}@127.0.0.1:")
                   for line in audit), audit


async def test_the_token_alone_has_the_rights_of_the_token_table() -> None:
    async with server_and_client(None) as (server, client, names):
        await client.subscribe("public.news")  # allowed
        with pytest.raises(ServiceError) as caught:
            await client.publish("public.news", b"m")
        assert caught.value.status == 403
        assert caught.value.reason == "identity 'token' may not publish 'public.news'"


@pytest.mark.parametrize("credential", [Credential("alice", "not-its-secret"),
                                        Credential("mallory", "anything")])
async def test_an_identity_not_proven_is_refused_at_the_handshake(
        credential: Credential) -> None:
    async with two_processes(credential) as (server, client_side, _):
        with pytest.raises(RefusedError) as caught:
            await client_side.add_broker("c").connect_queue("s1", 15555)
        assert str(caught.value.reason) == (
            f"unauthorized: identity {credential.name!r} is not one of this "
            f"process's, or its secret is wrong")
        assert server.universe.net.rejections["unauthorized"] == 1
        assert server.topics() == {"orders.x", "public.news"}


def test_identities_files_are_checked_with_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "ids.toml"
    for text, said in [
        ("[identity.alice]\nsecret = 'x'\n", "identity.alice.secret: must be \"sha256:\""),
        ("[identity.alice]\nsecret = 'sha256:" + "0" * 64 + "'\npublish = 'a'\n",
         "identity.alice.publish: must be a list of patterns"),
        ("[identity.alice]\nsecret = 'sha256:" + "0" * 64 + "'\nsubscribe = []\n",
         "identity.alice: unknown key 'subscribe'"),
        ("[token]\nsecret = 'x'\n", "token.secret: the [token] identity's secret is the "
                                    "universe token"),
        ("[users]\n", "unknown table 'users'"),
        ("[identity.token]\nsecret = 'x'\n", "identity.token: a name is"),
        ("not toml =", "not TOML"),
    ]:
        path.write_text(text)
        with pytest.raises(IdentityError) as caught:
            Identities.load(path)
        assert str(caught.value).startswith(f"{path}: ") and said in str(caught.value), (
            text, str(caught.value))
    with pytest.raises(IdentityError, match="cannot read the identities file"):
        Identities.load(tmp_path / "missing.toml")


def test_a_credential_is_name_colon_secret_and_never_shown() -> None:
    credential = Credential.parse("alice:s3cret:with:colons")
    assert credential == Credential("alice", "s3cret:with:colons")
    assert "s3cret" not in repr(credential)
    for bad in ("alice", ":x", "alice:", "a b:x"):
        with pytest.raises(IdentityError, match="an identity is NAME:SECRET"):
            Credential.parse(bad)


def test_without_a_file_every_link_may_do_everything() -> None:
    from rdv import OPEN

    identity = OPEN.verify(None, None)
    assert identity is not None and identity.everything and OPEN.open
    assert not OPEN.reserved("a")

