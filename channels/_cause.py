"""Why a link ended, as a type: listeners and the async face use it instead of parsing reasons."""

from __future__ import annotations

import enum

from pump.schema import Outcome


class CloseCause(enum.Enum):
    """How a link ended (the reason string says more, for people).

    * ``CLEAN`` -- closed on purpose by one side (``close()``, or the peer's end of
      stream); everything sent before was delivered.
    * ``ABORTED`` -- ended at once on purpose (``abort()``, a listener that raised, a
      broker that failed or closed); queued messages may have been dropped.
    * ``LOST`` -- the connection was lost (a reset, a peer process that died).
    * ``PROTOCOL_ERROR`` -- one side sent bytes that are not a valid frame stream.
    * ``REFUSED`` -- a connect that never became a link.

    The values of the first four are the trace's ``disconnect`` outcomes
    (:class:`pump.schema.Outcome`).
    """

    CLEAN = Outcome.CLEAN
    ABORTED = Outcome.ABORTED
    LOST = Outcome.LOST
    PROTOCOL_ERROR = Outcome.PROTOCOL_ERROR
    REFUSED = "refused"
