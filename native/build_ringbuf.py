"""cffi API-mode builds of the C ring buffer into ``channels._ringbuf``, and of the MQ
log's record checks into ``mq.storage._records``.

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


ffibuilder = FFI()
ffibuilder.cdef(read_cdef())
ffibuilder.set_source(
    "channels._ringbuf",
    '#include "ringbuf.h"',
    # Relative paths: setuptools runs the build from the project root.
    sources=["native/ringbuf.c"],
    include_dirs=["native"],
    extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra"],
)

#: The MQ log's records checked in C (a replica's copies): ``mq.storage._records``.
records_builder = FFI()
records_builder.cdef(read_cdef("records.h"))
records_builder.set_source(
    "mq.storage._records",
    '#include "records.h"',
    sources=["native/records.c"],
    include_dirs=["native"],
    extra_compile_args=["-O2", "-std=gnu99", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
    records_builder.compile(verbose=True)
