"""A topic's log, on disk and in memory: what mq stores and how it survives a crash.

It owns the records and their checksums (``_record``), a segment's file and its sparse
index (``_segment``, ``_scan``: each record checked as it is read, damage skipped), the
newest records kept in memory and a server's budget for them (``_tail``), durable
writes and fsyncs (``_files``), the epochs at which a copy parts from its master
(``_epochs``), the log itself (``_log``: :class:`TopicLog`), a memory topic's bounded
ring (``_memory``), consume groups' cursors on disk (``_cursor``) and names made file
names (``_names``).  It imports nothing else of mq; the format is
``docs/mq-format.md``.
"""


from ._cursor import CursorStore as CursorStore
from ._log import DEFAULT_SEGMENT_BYTES as DEFAULT_SEGMENT_BYTES
from ._log import TopicLog as TopicLog
from ._memory import MemoryLog as MemoryLog
from ._names import MAX_NAME_BYTES as MAX_NAME_BYTES
from ._names import check_name as check_name
from ._names import disk_name as disk_name
from ._record import FORMAT_VERSION as FORMAT_VERSION
from ._record import FormatError as FormatError
from ._record import Record as Record
from ._record import StoreError as StoreError
from ._scan import INDEX_INTERVAL as INDEX_INTERVAL
from ._scan import Corruption as Corruption
