"""cffi API-mode builds of the C ring buffer into ``channels._ringbuf``, of the MQ
log's record checks into ``mq.storage._records``, and of the group commit's fsync thread
into ``mq.storage._syncer``.

The cdef is read from ``native/ringbuf.h`` (between the CDEF markers), so the
declarations cffi sees are exactly the ones the C code is compiled against.
"""

from __future__ import annotations

import pathlib
import re

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent


def read_cdef(name: str = "ringbuf.h") -> str:
    header = (HERE / name).read_text()
    match = re.search(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", header, re.S)
    if match is None:
        raise RuntimeError(f"native/{name} has no CDEF-BEGIN/CDEF-END block")
    # cffi's cdef does not accept C comments inside declarations it parses
    # as well as a compiler does; strip them.
    return re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)


#: Put after the header in each module's source: cffi's wrappers release the GIL around
#: every call, and every function here is short and never waits (sockets are
#: non-blocking, copies and checksums are bounded by their arguments).  In a process
#: with other threads (an MQ server's fsync and cursor threads), each release could hand
#: the GIL to one of them, and the pump's thread then waited to take it back: so the
#: calls keep it.
KEEP_GIL = """
#undef Py_BEGIN_ALLOW_THREADS
#undef Py_END_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#define Py_END_ALLOW_THREADS }
"""


def builder(module: str, name: str, std: str) -> FFI:
    """The cffi build of ``native/{name}.c`` into ``module``, declared by its header."""
    ffi = FFI()
    ffi.cdef(read_cdef(f"{name}.h"))
    ffi.set_source(
        module,
        f'#include "{name}.h"\n{KEEP_GIL}',
        # Relative paths: setuptools runs the build from the project root.
        sources=[f"native/{name}.c"],
        include_dirs=["native"],
        extra_compile_args=["-O2", f"-std={std}", "-Wall", "-Wextra"],
    )
    return ffi


ffibuilder = builder("channels._ringbuf", "ringbuf", "c99")
#: The MQ log's records checked in C (a replica's copies); gnu99 for the CPU's
#: carry-less multiplies, used where it has them.
records_builder = builder("mq.storage._records", "records", "gnu99")
#: The group commit's fsyncs in a C thread of their own (it never takes the GIL).
syncer_builder = builder("mq.storage._syncer", "syncer", "gnu99")

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
    records_builder.compile(verbose=True)
    syncer_builder.compile(verbose=True)
