"""Channels: the C ring buffer, full-duplex channels over pairs of rings, the frame codec,
message queues and their trio face."""

from ._async import DEFAULT_RECEIVE_BUFFER as DEFAULT_RECEIVE_BUFFER
from ._async import AsyncMessageQueue as AsyncMessageQueue
from ._cause import CloseCause as CloseCause
from ._channel import DEFAULT_RING_CAPACITY as DEFAULT_RING_CAPACITY
from ._channel import Channel as Channel
from ._channel import ChannelManager as ChannelManager
from ._channel import LinkGate as LinkGate
from ._codec import CLOSE_MARK as CLOSE_MARK
from ._codec import DEFAULT_FRAME_BUDGET as DEFAULT_FRAME_BUDGET
from ._codec import MAX_MESSAGE_BODY as MAX_MESSAGE_BODY
from ._codec import PROCESS_FRAME_BUDGET as PROCESS_FRAME_BUDGET
from ._codec import FrameBudget as FrameBudget
from ._codec import FrameDecoder as FrameDecoder
from ._codec import FrameEncoder as FrameEncoder
from ._codec import close_frame as close_frame
from ._errors import MessageTooLargeError as MessageTooLargeError
from ._errors import ProtocolError as ProtocolError
from ._errors import QueueFullError as QueueFullError
from ._faults import Direction as Direction
from ._faults import FaultLink as FaultLink
from ._faults import FaultLink as RelayedLink  # its name before 0.2, kept for a release
from ._messages import SMALL_PIECE as SMALL_PIECE
from ._messages import Batch as Batch
from ._messages import Gather as Gather
from ._messages import coalesce as coalesce
from ._messages import gather as gather
from ._protocols import ChannelListener as ChannelListener
from ._protocols import LinkObserver as LinkObserver
from ._protocols import LinkPeer as LinkPeer
from ._queue import DEFAULT_HIGH_WATER as DEFAULT_HIGH_WATER
from ._queue import DEFAULT_MAX_MESSAGE_SIZE as DEFAULT_MAX_MESSAGE_SIZE
from ._queue import DEFAULT_STALL_TIMEOUT as DEFAULT_STALL_TIMEOUT
from ._queue import MessageQueue as MessageQueue
from ._queue import ObservedMessageQueue as ObservedMessageQueue
from ._queue import QueueListener as QueueListener
from ._queue import QueueStatistics as QueueStatistics
from ._ring import HEADER_SIZE as HEADER_SIZE
from ._ring import MAX_CAPACITY as MAX_CAPACITY
from ._ring import MIN_CAPACITY as MIN_CAPACITY
from ._ring import RingBuffer as RingBuffer
from ._ring import keep_freed_memory as keep_freed_memory
from ._ring import split_bodies as split_bodies
from ._stream import DEFAULT_ADAPTIVE_POLL as DEFAULT_ADAPTIVE_POLL
from ._stream import StreamLink as StreamLink

__all__ = [
    "CLOSE_MARK",
    "DEFAULT_ADAPTIVE_POLL",
    "DEFAULT_FRAME_BUDGET",
    "DEFAULT_HIGH_WATER",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_RECEIVE_BUFFER",
    "DEFAULT_RING_CAPACITY",
    "DEFAULT_STALL_TIMEOUT",
    "Direction",
    "HEADER_SIZE",
    "MAX_CAPACITY",
    "MAX_MESSAGE_BODY",
    "MIN_CAPACITY",
    "PROCESS_FRAME_BUDGET",
    "SMALL_PIECE",
    "AsyncMessageQueue",
    "Batch",
    "Channel",
    "ChannelListener",
    "ChannelManager",
    "FrameBudget",
    "CloseCause",
    "FrameDecoder",
    "FrameEncoder",
    "Gather",
    "LinkGate",
    "LinkObserver",
    "LinkPeer",
    "MessageQueue",
    "MessageTooLargeError",
    "ObservedMessageQueue",
    "ProtocolError",
    "QueueFullError",
    "QueueListener",
    "QueueStatistics",
    "FaultLink",
    "RelayedLink",
    "RingBuffer",
    "StreamLink",
    "close_frame",
    "coalesce",
    "gather",
    "keep_freed_memory",
    "split_bodies",
]
