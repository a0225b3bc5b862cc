"""setuptools entry point: wires the cffi extension (everything else is in pyproject.toml).

The extension is built against Python's stable ABI (cffi's default, ``_ringbuf.abi3.so``),
so the wheel is tagged ``cp311-abi3``: one wheel for CPython 3.11 and every later one.
"""

from setuptools import setup

setup(cffi_modules=["native/build_ringbuf.py:ffibuilder",
                     "native/build_ringbuf.py:records_builder",
                     "native/build_ringbuf.py:syncer_builder"],
      options={"bdist_wheel": {"py_limited_api": "cp311"}})
