"""Topics over logs and their delivery: what a server's topics are and how their
messages reach consumers.

It owns a topic's consume groups (start, filter, credits, acks, redelivery, dead
letters: ``_topic``, ``_filter``), the recent publishes by producer that make a retry
a duplicate (``_dedupe``), the server's requests parsed and checked (``_requests``), a
topic's ``meta.json`` (``_meta``), a server's topics on disk and their error states
(``_catalogue``), durability and the group commit (``_commit``), the links and the
frames delivered on them (``_delivery``, ``_wire``), offsets held for a consumer
(``_held``), the bodies a root sent a relaying server and names again (``_stretch``)
and the offline check of queue directories (``_verify``).  It imports
:mod:`mq.storage`, nothing above it.
"""


from ._commit import Durability as Durability
from ._filter import MAX_FILTER_BYTES as MAX_FILTER_BYTES
from ._filter import FilterError as FilterError
from ._filter import TagFilter as TagFilter
from ._filter import matches as matches
from ._group import DEFAULT_WINDOW as DEFAULT_WINDOW
from ._group import Delivery as Delivery
from ._group import Start as Start
from ._group import UnknownGroupError as UnknownGroupError
from ._topic import DEFAULT_ACK_TIMEOUT as DEFAULT_ACK_TIMEOUT
from ._topic import DEFAULT_MAX_DELIVERIES as DEFAULT_MAX_DELIVERIES
from ._topic import Topic as Topic
from ._verify import Finding as Finding
from ._verify import Report as Report
from ._verify import verify as verify
