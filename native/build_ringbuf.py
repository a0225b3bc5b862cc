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


def builder(module: str, name: str, std: str) -> FFI:
    """The cffi build of ``native/{name}.c`` into ``module``, declared by its header."""
    ffi = FFI()
    ffi.cdef(read_cdef(f"{name}.h"))
    ffi.set_source(
        module,
        f'#include "{name}.h"',
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

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
    records_builder.compile(verbose=True)
