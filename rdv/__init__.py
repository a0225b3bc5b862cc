"""Rendezvous: bind, listen, unbind, connect, accept and refuse, as a table and on a pump."""

from ._address import Address as Address
from ._address import BrokerPort as BrokerPort
from ._address import parse_located as parse_located
from ._core import BUSY as BUSY
from ._core import MAX_PORT as MAX_PORT
from ._core import NOT_BOUND as NOT_BOUND
from ._core import REFUSAL_REASONS as REFUSAL_REASONS
from ._core import TRANSITIONS as TRANSITIONS
from ._core import UNAUTHORIZED as UNAUTHORIZED
from ._core import UNKNOWN_BROKER as UNKNOWN_BROKER
from ._core import Action as Action
from ._core import PortState as PortState
from ._core import RdvEvent as RdvEvent
from ._core import RdvUsageError as RdvUsageError
from ._core import Refusal as Refusal
from ._core import RefusalReason as RefusalReason
from ._core import Rendezvous as Rendezvous
from ._core import Transition as Transition
from ._core import is_final as is_final
from ._core import state_diagram as state_diagram
from ._handshake import NEED_DATA as NEED_DATA
from ._handshake import Handshake as Handshake
from ._handshake import HandshakeState as HandshakeState
from ._handshake import Role as Role
from ._handshake import state_diagram as handshake_diagram
from ._identity import EVERYTHING as EVERYTHING
from ._identity import OPEN as OPEN
from ._identity import TOKEN_IDENTITY as TOKEN_IDENTITY
from ._identity import Credential as Credential
from ._identity import Identities as Identities
from ._identity import Identity as Identity
from ._identity import IdentityError as IdentityError
from ._identity import Right as Right
from ._listeners import Accepting as Accepting
from ._listeners import AcceptListener as AcceptListener
from ._listeners import Connecting as Connecting
from ._listeners import ConnectListener as ConnectListener
from ._listeners import RefusedError as RefusedError
from ._net import DEFAULT_HANDSHAKE_TIMEOUT as DEFAULT_HANDSHAKE_TIMEOUT
from ._net import DEFAULT_MAX_PENDING as DEFAULT_MAX_PENDING
from ._net import DEFAULT_TCP_USER_TIMEOUT as DEFAULT_TCP_USER_TIMEOUT
from ._net import LOCAL_CONGESTION as LOCAL_CONGESTION
from ._net import UNREACHABLE as UNREACHABLE
from ._net import NetNode as NetNode
from ._net import is_loopback as is_loopback
from ._net import local_congestion as local_congestion
from ._net import open_tcp_stream as open_tcp_stream
from ._net import tls_contexts as tls_contexts
from ._node import RdvNode as RdvNode
from ._resolve import NameSource as NameSource
from ._resolve import Resolver as Resolver
from ._wire import MAX_HANDSHAKE_SIZE as MAX_HANDSHAKE_SIZE
from ._wire import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._wire import HandshakeError as HandshakeError
from ._wire import Hello as Hello
from ._wire import Reply as Reply

__all__ = [
    "EVERYTHING",
    "OPEN",
    "TOKEN_IDENTITY",
    "Credential",
    "Identities",
    "Identity",
    "IdentityError",
    "Right",
    "Address",
    "BrokerPort",
    "BUSY",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_TCP_USER_TIMEOUT",
    "LOCAL_CONGESTION",
    "MAX_HANDSHAKE_SIZE",
    "PROTOCOL_VERSION",
    "UNREACHABLE",
    "NEED_DATA",
    "Handshake",
    "HandshakeError",
    "HandshakeState",
    "Hello",
    "NetNode",
    "is_loopback",
    "local_congestion",
    "open_tcp_stream",
    "Reply",
    "MAX_PORT",
    "NOT_BOUND",
    "REFUSAL_REASONS",
    "TRANSITIONS",
    "UNAUTHORIZED",
    "UNKNOWN_BROKER",
    "AcceptListener",
    "Accepting",
    "Connecting",
    "Action",
    "ConnectListener",
    "PortState",
    "RdvEvent",
    "RdvNode",
    "NameSource",
    "Resolver",
    "RdvUsageError",
    "Refusal",
    "RefusalReason",
    "RefusedError",
    "Rendezvous",
    "Role",
    "Transition",
    "handshake_diagram",
    "is_final",
    "state_diagram",
    "tls_contexts",
    "parse_located",
]
