"""The listener face of the MQ client: callbacks on the pump, no awaits, simulated time."""

from __future__ import annotations

import pathlib

import pytest

from brokermgr import BrokerManager
from brokermgr.tracking import TrackNode
from channels import QueueFullError
from mq import Message, MqClient, MqServer, ServiceError, Stored


def world(directory: pathlib.Path, **options: object) -> tuple[BrokerManager, MqServer]:
    universe = BrokerManager("mq", **options)  # type: ignore[arg-type]
    node = TrackNode(universe.add_broker("s1"), role="server", state_dir=directory)
    server = MqServer(node, directory, fsync_thread=False)
    server.handle_local({"cmd": "declare", "topic": "orders"})
    return universe, server


def test_publish_and_consume_with_callbacks(tmp_path: pathlib.Path) -> None:
    universe, server = world(tmp_path)
    client = MqClient(universe.add_broker("c"), "s1:15555")
    universe.pump.run_for(0.1)
    stored: list[list[Stored] | ServiceError] = []
    refused: list[list[Stored] | ServiceError] = []
    client.publish_nowait("orders", [b"a", b"b"], on_stored=stored.append)
    client.publish_nowait("nope", [b"x"], on_stored=refused.append)  # answered at once
    got: list[Message] = []

    def on_message(message: Message) -> None:
        got.append(message)
        message.ack_nowait()

    client.subscribe_nowait("orders", on_message, window=10)
    universe.pump.run_for(1.5)  # past the cursor save
    assert [s.offset for s in stored[0]] == [0, 1]  # type: ignore[union-attr]
    assert isinstance(refused[0], ServiceError) and refused[0].status == 404
    assert [m.body for m in got] == [b"a", b"b"]
    assert server.catalogue.describe("orders")["groups"]["orders"]["lag"] == 0
    server.close()
    universe.close()


def test_past_the_high_water_mark_publish_raises_and_drained_says_when_to_go_on(
        tmp_path: pathlib.Path) -> None:
    universe, server = world(tmp_path, ring_capacity=1024, high_water=4096)
    client = MqClient(universe.add_broker("c"), "s1:15555")
    universe.pump.run_for(0.1)
    body = b"x" * 1000
    sent = 0
    with pytest.raises(QueueFullError, match="publish again from on_drained"):
        for _ in range(100):  # nothing runs the pump meanwhile: the link fills up
            client.publish_nowait("orders", [body])
            sent += 1
    assert 0 < sent < 100
    resumed: list[int] = []
    client.on_drained = lambda: resumed.append(1)
    universe.pump.run_for(1)
    assert resumed  # the producer hears when to go on
    client.publish_nowait("orders", [body])
    universe.pump.run_for(1)
    assert server.catalogue.topics["orders"].topic.log.next_offset == sent + 1  # none lost
    server.close()
    universe.close()
