"""The MQ server on a broker's tracking port: commands, links and timers.

It owns the server (``_server``: :class:`MqServer`, its command table, the topics'
commands, its links and timers), ``produce`` (``_produce``), the consumers' commands
(``_consumers``) and RPC replies and pushes (``_push``).  It wires the layers below:
:mod:`mq.replication` and :mod:`mq.cluster`, over :mod:`mq.topics` and
:mod:`mq.storage`.
"""


from ._server import FLAGS as FLAGS
from ._server import MqServer as MqServer
