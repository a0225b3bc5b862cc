"""Replicated groups: a master's topics copied by its slaves, and a member's role.

It owns the master's side (``_shipper``: records shipped as they are written, consume
groups' positions every 0.1 s, the in-sync set and ``sync`` acknowledgements), the
replica's side (``_follower``: a master's records copied, checked and stored, where a
copy parts from it cut back), and a server's role in its group with the loop that keeps
it as the name services hold it (``_member``: :func:`keep_role`).  It imports
:mod:`mq.topics` and :mod:`mq.storage`; the server it serves is a protocol of what it
uses.
"""


from ._follower import Follower as Follower
from ._member import GroupRole as GroupRole
from ._member import keep_role as keep_role
from ._shipper import DEFAULT_INSYNC_LAG as DEFAULT_INSYNC_LAG
from ._shipper import Shipper as Shipper
