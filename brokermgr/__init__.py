"""Brokers and universes (BrokerManager), the name service with its liveness table, and
zbus-style tracking (:mod:`brokermgr.tracking`)."""

from ._broker import DEFAULT_CLOSE_TIMEOUT as DEFAULT_CLOSE_TIMEOUT
from ._broker import Broker as Broker
from ._broker import BrokerManager as BrokerManager
from ._broker import EchoListener as EchoListener
from ._broker import echo as echo
from ._fence import EPOCHS_EXHAUSTED as EPOCHS_EXHAUSTED
from ._fence import MAX_EPOCH as MAX_EPOCH
from ._fence import STALE_EPOCH as STALE_EPOCH
from ._fence import EpochError as EpochError
from ._fence import check_epoch as check_epoch
from ._fence import fenced as fenced
from ._fence import next_epoch as next_epoch
from ._groups import GroupMember as GroupMember
from ._groups import GroupProgress as GroupProgress
from ._groups import GroupTables as GroupTables
from ._link import DEFAULT_RETRY as DEFAULT_RETRY
from ._link import BrokerLink as BrokerLink
from ._link import ReconnectingLink as ReconnectingLink
from ._link import ReplyOrError as ReplyOrError
from ._liveness import DEFAULT_SCAN_INTERVAL as DEFAULT_SCAN_INTERVAL
from ._liveness import LivenessEntry as LivenessEntry
from ._liveness import LivenessTable as LivenessTable
from ._names import DEFAULT_BROKER_EXPIRY as DEFAULT_BROKER_EXPIRY
from ._names import DEFAULT_HEARTBEAT as DEFAULT_HEARTBEAT
from ._names import DEFAULT_MANAGER_PORT as DEFAULT_MANAGER_PORT
from ._names import DEFAULT_NAME_RETRY as DEFAULT_NAME_RETRY
from ._names import EXPIRY_BEATS as EXPIRY_BEATS
from ._names import GROUP_HEARTBEAT as GROUP_HEARTBEAT
from ._names import MANAGER_ID as MANAGER_ID
from ._names import QUIET as QUIET
from ._names import SUSPECT_BEATS as SUSPECT_BEATS
from ._names import BrokerRecord as BrokerRecord
from ._names import NameClient as NameClient
from ._names import NameService as NameService
from ._rpc import Body as Body
from ._rpc import Sent as Sent
from ._rpc import ServiceSession as ServiceSession
from ._rpc import Template as Template
from ._rpc import decode as decode
from ._rpc import encode as encode
from ._rpc import send as send
from ._service import MAX_INT as MAX_INT
from ._service import Call as Call
from ._service import Command as Command
from ._service import CommandTable as CommandTable
from ._service import Deferred as Deferred
from ._service import Fields as Fields
from ._service import Push as Push
from ._service import PushTable as PushTable
from ._service import ReplyObject as ReplyObject
from ._service import SendReply as SendReply
from ._service import ServiceError as ServiceError
from ._service import Status as Status
from ._service import audit_log as audit_log
from ._service import peer_of as peer_of
from ._service import request_seq as request_seq
from ._service import require as require
from ._service import require_member as require_member
from ._universe import open_universe as open_universe

__all__ = [
    "DEFAULT_BROKER_EXPIRY",
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_HEARTBEAT",
    "EXPIRY_BEATS",
    "GROUP_HEARTBEAT",
    "QUIET",
    "SUSPECT_BEATS",
    "DEFAULT_MANAGER_PORT",
    "DEFAULT_NAME_RETRY",
    "DEFAULT_RETRY",
    "DEFAULT_SCAN_INTERVAL",
    "MANAGER_ID",
    "MAX_INT",
    "EPOCHS_EXHAUSTED",
    "MAX_EPOCH",
    "STALE_EPOCH",
    "Body",
    "Call",
    "Deferred",
    "Push",
    "PushTable",
    "SendReply",
    "Command",
    "CommandTable",
    "Broker",
    "BrokerManager",
    "BrokerLink",
    "BrokerRecord",
    "EchoListener",
    "EpochError",
    "GroupMember",
    "GroupProgress",
    "GroupTables",
    "LivenessEntry",
    "Fields",
    "LivenessTable",
    "NameClient",
    "NameService",
    "ReplyOrError",
    "ReconnectingLink",
    "ReplyObject",
    "Sent",
    "ServiceError",
    "ServiceSession",
    "Status",
    "check_epoch",
    "decode",
    "echo",
    "encode",
    "Template",
    "fenced",
    "next_epoch",
    "open_universe",
    "audit_log",
    "peer_of",
    "request_seq",
    "require",
    "require_member",
    "send",
]
