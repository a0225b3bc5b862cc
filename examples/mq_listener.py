"""The listener face of the MQ client: callbacks on the pump, no trio, simulated time."""

import tempfile

from brokermgr import BrokerManager, ServiceError
from brokermgr.tracking import TrackNode
from mq import Message, MqClient, MqServer, Stored

with tempfile.TemporaryDirectory() as data:
    universe = BrokerManager("shop")
    node = TrackNode(universe.add_broker("s1"), role="server", state_dir=data)
    server = MqServer(node, data, fsync_thread=False)  # fsyncs on the pump
    server.handle_local({"cmd": "declare", "topic": "orders"})
    client = MqClient(universe.add_broker("shop"), "s1:15555")
    universe.pump.run_for(0.1)  # the link opens

    def stored(result: list[Stored] | ServiceError) -> None:
        if isinstance(result, ServiceError):
            print("not stored:", result)
        else:
            print("stored:", [s.offset for s in result])

    def on_message(message: Message) -> None:
        print("got", message.body, "at offset", message.offset)
        message.ack_nowait()

    client.publish_nowait("orders", [b"order 1", b"order 2"], on_stored=stored)
    client.subscribe_nowait("orders", on_message, window=10)
    universe.pump.run_for(1.0)
    server.close()
    universe.close()
