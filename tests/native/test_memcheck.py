"""The C ring and the MQ records' C checks under valgrind memcheck (and
AddressSanitizer): zero errors, zero leaks."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
#: Each C file with the program that exercises it.
DRIVERS = {"ringbuf": "ringbuf_check.c", "records": "records_check.c"}

pytestmark = pytest.mark.slow


def build(tmp_path: pathlib.Path, name: str, *flags: str) -> pathlib.Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / f"{name}_check"
    subprocess.run([gcc, "-std=gnu99", "-Wall", "-Wextra", "-Werror", "-g", *flags,
                    f"-I{NATIVE}", str(NATIVE / f"{name}.c"),
                    str(pathlib.Path(__file__).with_name(DRIVERS[name])), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


@pytest.mark.parametrize("name", DRIVERS)
def test_valgrind_memcheck_reports_no_errors(tmp_path: pathlib.Path, name: str) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    exe = build(tmp_path, name, "-O1")
    proc = subprocess.run(
        [valgrind, "--tool=memcheck", "--error-exitcode=99", "--leak-check=full",
         "--errors-for-leak-kinds=all", str(exe)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{name}_check: ok" in proc.stdout
    assert "ERROR SUMMARY: 0 errors" in proc.stderr


@pytest.mark.parametrize("name", DRIVERS)
def test_address_sanitizer_reports_no_errors(tmp_path: pathlib.Path, name: str) -> None:
    exe = build(tmp_path, name, "-O1", "-fsanitize=address,undefined",
                "-fno-omit-frame-pointer")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{name}_check: ok" in proc.stdout
