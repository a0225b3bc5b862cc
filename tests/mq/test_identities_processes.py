"""A cluster of server processes with an identities file: each server proves it is the
member it names; a token holder, or a client with an identity of its own, that speaks
as a member on the cluster port is refused (403, logged by the server) and changes
nothing while a producer and a consumer go on."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest
import trio

from brokermgr import BrokerManager, ServiceError, decode, encode
from mq import load_cluster
from mq.cluster._node import CLUSTER_PORT
from pump import Pump
from rdv import Address, Credential
from tests.mq.test_cluster_processes import cluster_file, server
from tests.rdvpump.test_processes import RDVPUMP, TOKEN, spawn

pytestmark = pytest.mark.slow


async def test_a_member_is_proven_and_a_forger_changes_nothing(
        tmp_path: pathlib.Path) -> None:
    shop = cluster_file(tmp_path / "shop.toml", [("a", "primary"), ("b", "primary"),
                                                 ("c", "fanout")])
    ids = tmp_path / "ids.toml"
    creds = {}
    for name, rights in [("a", ["--member", "a"]), ("b", ["--member", "b"]),
                         ("c", ["--member", "c"]),
                         ("alice", ["--publish", "orders", "--consume", "orders",
                                    "--declare", "orders"])]:
        made = subprocess.run([*RDVPUMP, "identity", "new", name, "--file", str(ids),
                               *rights], capture_output=True, check=True, timeout=30)
        creds[name] = made.stdout.decode().strip()
    async with spawn("manager", "serve", "--universe", "k", "--listen", "127.0.0.1:0",
                     "--identities", str(ids)) as (_, manager):
        common = ["--universe", "k", "--manager", f"{manager[0]}:{manager[1]}", "--listen",
                  "127.0.0.1:0", "--heartbeat", "0.5", "--identities", str(ids)]

        def member(name: str) -> list[str]:
            (tmp_path / name).mkdir()
            return ["--id", name, "--cluster", shop, "--state-dir", str(tmp_path / name),
                    "--role", "server", "--mq-dir", str(tmp_path / name),
                    "--identity", creds[name], *common]

        async with server(*member("a")) as a, server(*member("b")) as b, \
                server(*member("c")) as c:
            for lines, me in ((a, "a (primary)"), (b, "b (primary)"), (c, "c (fanout)")):
                await lines.until(f"cluster shop: {me} linked to", "(2 of 2 peers); root a")
            where = {n: await lines.address() for n, lines in (("a", a), ("b", b), ("c", c))}
            env = {**os.environ, "RDVPUMP_TOKEN": TOKEN, "RDVPUMP_IDENTITY": creds["alice"]}

            async def mq(*args: str, stdin: bytes = b"") -> str:
                done = await trio.run_process([*RDVPUMP, "mq", *args, "--universe", "k"],
                                              stdin=stdin, capture_stdout=True, env=env)
                return done.stdout.decode()

            said = await mq("declare", "orders", "--shared", "--server", f"c@{where['c']}")
            assert said.startswith("declared orders, group orders, shared")
            said = await mq("publish", "orders", "--server", f"c@{where['c']}",
                            stdin=b"1\n2\n3\n")
            assert said.startswith("published 3 to orders on a:15555")
            # the token alone may not publish: a 403 that names the identity, one line
            refused = await trio.run_process(
                [*RDVPUMP, "mq", "publish", "orders", "--server", f"a@{where['a']}",
                 "--universe", "k"], stdin=b"x\n", capture_stdout=True, capture_stderr=True,
                env={**os.environ, "RDVPUMP_TOKEN": TOKEN}, check=False)
            assert refused.returncode == 1
            assert "identity 'token' may not publish 'orders'" in refused.stderr.decode()
            assert len(refused.stderr.decode().strip().splitlines()) == 1
            config = load_cluster(shop)
            for credential in (None, Credential.parse(creds["alice"])):
                liar = BrokerManager("k", pump=Pump(name="liar"), token=TOKEN,
                                     identity=credential)
                liar.directory["b"] = Address.parse(where["b"])
                async with trio.open_nursery() as nursery:
                    await nursery.start(liar.pump.serve)
                    await nursery.start(liar.serve_network, "127.0.0.1", 0)
                    as_a = liar.add_broker("a")  # named as the member it is not
                    answers = []
                    for message in (
                            {"cmd": "hello", "epoch": 1},
                            {"cmd": "root", "root": "c", "epoch": 1000},
                            {"cmd": "state", "version": 1000, "topics": {}, "removed": {},
                             "epoch": 1000, "root": "a", "state_epoch": 1000}):
                        with trio.fail_after(10):
                            queue = await as_a.connect_queue("b", CLUSTER_PORT)
                            await queue.send(encode({**message, "cluster": "shop", "id": "a",
                                                     "checksum": config.checksum, "seq": 1}))
                            answers.append(decode(await queue.receive()))
                        await queue.aclose()
                    who = "token" if credential is None else "alice"
                    for answer in answers:
                        error = ServiceError.of(answer)
                        assert error is not None and error.status == 403, answer
                        assert error.reason == (f"says it is 'a', which its link's identity "
                                                f"{who!r} may not speak as")
                    nursery.cancel_scope.cancel()
                await b.until(f"refused a: says it is 'a', which its link's identity {who!r}")
            # nothing changed: b still follows root a, every message is there to consume
            assert not any("steps down" in line or "replaces" in line for line in b.seen)
            said = await mq("consume", "orders", "--server", f"b@{where['b']}", "--count",
                            "3", "--idle", "10")
            assert said.splitlines()[:3] == ["1", "2", "3"], said
