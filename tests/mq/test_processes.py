"""The MQ server as a real process on 127.0.0.1: SIGKILL it mid-stream and restart it on
the same directory; SIGKILL a consumer process and its messages reach another consumer."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess

import pytest
import trio

from brokermgr import BrokerManager
from mq import MqClient, MqRequestError
from pump import Pump
from tests.rdvpump.test_processes import RDVPUMP, TOKEN, spawn

pytestmark = pytest.mark.slow


def server_args(manager: tuple[str, int], directory: pathlib.Path) -> list[str]:
    return ["broker", "run", "--id", "s1", "--universe", "q", "--manager",
            f"{manager[0]}:{manager[1]}", "--role", "server", "--mq-dir", str(directory),
            "--topic", "orders", "--durability", "sync"]


async def test_sigkill_of_the_server_loses_nothing_acknowledged(tmp_path: pathlib.Path) -> None:
    universe = BrokerManager("q", token=TOKEN, pump=Pump(name="test"))
    async with spawn("manager", "serve", "--universe", "q", "--listen", "127.0.0.1:0") as (
            _, manager), trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        acked: dict[int, bytes] = {}
        uncertain: set[bytes] = set()
        n = 0
        async with spawn(*server_args(manager, tmp_path)) as (server, address):
            universe.directory["s1"] = address
            producer = MqClient(universe.add_broker("producer"), "s1:15555", timeout=5)
            await producer.connected()
            while len(acked) < 400:
                bodies = [b"m%06d" % (n + i) for i in range(7)]
                n += len(bodies)
                for stored, body in zip(await producer.publish_many("orders", bodies), bodies,
                                        strict=True):
                    acked[stored.offset] = body
            # mid-stream: publishes in flight when the kill lands
            async with trio.open_nursery() as inner:
                async def publish_on() -> None:
                    nonlocal n
                    while True:
                        body = b"m%06d" % n
                        n += 1
                        try:
                            stored = await producer.publish("orders", body)
                        except MqRequestError:
                            uncertain.add(body)  # may or may not be stored
                            return
                        acked[stored.offset] = body

                inner.start_soon(publish_on)
                await trio.sleep(0.2)
                server.send_signal(signal.SIGKILL)
        producer.close()
        # the same directory, a new process (and port)
        async with spawn(*server_args(manager, tmp_path)) as (_, address):
            universe.directory["s1"] = address
            consumer = MqClient(universe.add_broker("consumer"), "s1:15555", timeout=5)
            await consumer.connected()
            subscription = await consumer.subscribe("orders", window=500)
            got: dict[int, bytes] = {}
            with trio.fail_after(30):
                while len(got) < max(acked) + 1:
                    message = await subscription.receive()
                    got[message.offset] = message.body
                    await message.ack()
            for offset, body in acked.items():
                assert got[offset] == body  # every acknowledged message, at its offset
            extra = {body for offset, body in got.items() if offset not in acked}
            assert extra <= uncertain  # anything else was a publish with no answer
            assert [got[o] for o in sorted(got)] == sorted(got.values())  # in order
            consumer.close()
        nursery.cancel_scope.cancel()


async def test_a_killed_consumer_s_messages_reach_the_other(tmp_path: pathlib.Path) -> None:
    universe = BrokerManager("q", token=TOKEN, pump=Pump(name="test"))
    async with spawn("manager", "serve", "--universe", "q", "--listen", "127.0.0.1:0") as (
            _, manager), spawn(*server_args(manager, tmp_path)) as (
            _, address), trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        universe.directory["s1"] = address
        client = MqClient(universe.add_broker("client"), "s1:15555", timeout=5)
        await client.connected()
        await client.publish_many("orders", [b"%d" % i for i in range(200)])
        where = f"s1@{address[0]}:{address[1]}"
        killed = await trio.lowlevel.open_process(
            [*RDVPUMP, "mq", "consume", "orders", "--server", where, "--universe", "q",
             "--window", "1000", "--idle", "30", "--json"],  # acks every 500: none here
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
        printed: list[int] = []
        try:
            assert killed.stdout is not None
            buffer = b""
            with trio.fail_after(30):
                while len(printed) < 50:
                    buffer += await killed.stdout.receive_some(65536)
                    *lines, buffer = buffer.split(b"\n")
                    printed += [json.loads(line)["offset"] for line in lines if line]
            killed.send_signal(signal.SIGKILL)
            with trio.fail_after(10):  # everything it printed, so everything it acked
                while chunk := await killed.stdout.receive_some(65536):
                    buffer += chunk
            *whole, _cut = buffer.split(b"\n")  # a line cut by the kill was not acked
            printed += [json.loads(line)["offset"] for line in whole if line]
        finally:
            killed.kill()
            with trio.move_on_after(10):
                await killed.wait()
        subscription = await client.subscribe("orders", window=500)
        got: set[int] = set()
        with trio.fail_after(30):
            while got != set(range(200)):
                message = await subscription.receive()
                got.add(message.offset)
                await message.ack()
        # it held all 200 unacknowledged when it was killed: they all came here
        assert got == set(range(200)) and len(printed) >= 50
        client.close()
        nursery.cancel_scope.cancel()
