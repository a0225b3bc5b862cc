"""setuptools entry point: only wires the cffi extension (everything else is in pyproject.toml)."""

from setuptools import setup

setup(cffi_modules=["native/build_ringbuf.py:ffibuilder"])
