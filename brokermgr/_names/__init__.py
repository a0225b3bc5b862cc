"""The name service (:mod:`.service`, a BrokerManager served to other processes, like
RocketMQ's NameServer) and its client (:mod:`.client`, a process's links to the
managers of its universe)."""

from .client import DEFAULT_NAME_RETRY as DEFAULT_NAME_RETRY
from .client import NameClient as NameClient
from .requests import BrokerRecord as BrokerRecord
from .requests import record_dict as record_dict
from .service import DEFAULT_BROKER_EXPIRY as DEFAULT_BROKER_EXPIRY
from .service import DEFAULT_HEARTBEAT as DEFAULT_HEARTBEAT
from .service import DEFAULT_LOOKUP_TIMEOUT as DEFAULT_LOOKUP_TIMEOUT
from .service import DEFAULT_MANAGER_PORT as DEFAULT_MANAGER_PORT
from .service import DUPLICATE_ID as DUPLICATE_ID
from .service import EXPIRY_BEATS as EXPIRY_BEATS
from .service import GROUP_HEARTBEAT as GROUP_HEARTBEAT
from .service import MANAGER_ID as MANAGER_ID
from .service import NAME_PORT as NAME_PORT
from .service import QUIET as QUIET
from .service import SUSPECT_BEATS as SUSPECT_BEATS
from .service import NameService as NameService
