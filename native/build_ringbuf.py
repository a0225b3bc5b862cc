"""cffi API-mode build of the C ring buffer into ``channels._ringbuf``.

The cdef is read from ``native/ringbuf.h`` (between the CDEF markers), so the
declarations cffi sees are exactly the ones the C code is compiled against.
"""

from __future__ import annotations

import pathlib
import re

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent


def read_cdef() -> str:
    header = (HERE / "ringbuf.h").read_text()
    match = re.search(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", header, re.S)
    if match is None:
        raise RuntimeError("native/ringbuf.h has no CDEF-BEGIN/CDEF-END block")
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

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
