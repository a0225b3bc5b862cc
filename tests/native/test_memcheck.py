"""The C ring under valgrind memcheck (and AddressSanitizer): zero errors, zero leaks."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
DRIVER = pathlib.Path(__file__).with_name("ringbuf_check.c")

pytestmark = pytest.mark.slow


def build(tmp_path: pathlib.Path, *flags: str) -> pathlib.Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "ringbuf_check"
    subprocess.run([gcc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-g", *flags,
                    f"-I{NATIVE}", str(NATIVE / "ringbuf.c"), str(DRIVER), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


def test_valgrind_memcheck_reports_no_errors(tmp_path: pathlib.Path) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    exe = build(tmp_path, "-O1")
    proc = subprocess.run(
        [valgrind, "--tool=memcheck", "--error-exitcode=99", "--leak-check=full",
         "--errors-for-leak-kinds=all", str(exe)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ringbuf_check: ok" in proc.stdout
    assert "ERROR SUMMARY: 0 errors" in proc.stderr


def test_address_sanitizer_reports_no_errors(tmp_path: pathlib.Path) -> None:
    exe = build(tmp_path, "-O1", "-fsanitize=address,undefined", "-fno-omit-frame-pointer")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ringbuf_check: ok" in proc.stdout
