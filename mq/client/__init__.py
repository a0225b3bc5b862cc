"""Clients of MQ servers: requests, subscriptions, and producers and consumers that
follow route tables.

It owns :class:`MqClient` and its link (``_client``), subscriptions and the messages
they receive (``_subscription``), :class:`Producer` and :class:`Consumer` over
tracking's route tables (``_routed``) and RPC over ``rpc`` topics (``_rpc``).  It
imports :mod:`mq.topics` for the frames' columns and held offsets, and nothing of the
server, its replication or its cluster.
"""


from ._client import MqClient as MqClient
from ._client import Stored as Stored
from ._routed import SLAVES_AFTER as SLAVES_AFTER
from ._routed import Consumer as Consumer
from ._routed import Producer as Producer
from ._rpc import Caller as Caller
from ._rpc import RpcTimeout as RpcTimeout
from ._rpc import Service as Service
from ._subscription import Message as Message
from ._subscription import MessageBatch as MessageBatch
from ._subscription import Pushed as Pushed
from ._subscription import Receiver as Receiver
from ._subscription import Subscription as Subscription
