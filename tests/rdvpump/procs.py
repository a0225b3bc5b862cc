"""Helpers for tests that drive real rdvpump processes: read a pipe up to a marker, list
the processes running with their command lines, and reap a child however a test ends."""

from __future__ import annotations

import os
import pathlib
import selectors
import subprocess
import time
from typing import IO

import trio

DEADLINE = 60.0


def read_until(proc: subprocess.Popen[bytes], stream: IO[bytes] | None, marker: bytes) -> bytes:
    """What ``proc`` wrote on ``stream`` up to ``marker`` (waiting on the pipe, bounded)."""
    assert stream is not None
    got = b""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    deadline = time.monotonic() + DEADLINE
    while marker not in got:
        left = deadline - time.monotonic()
        assert left > 0 and proc.poll() is None, got.decode()[-2000:]
        if sel.select(timeout=left):
            got += os.read(stream.fileno(), 65536)
    return got


def processes() -> dict[int, list[bytes]]:
    """Every live process of this machine that can be read, with its argv.  Zombies
    (dead, not yet reaped) are left out: they run nothing, and an orphan's lingers where
    init does not reap (this VM's PID 1 does not)."""
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                found[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, IndexError):
                continue
    return found


def finish(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> tuple[bytes, bytes]:
    """stdout and stderr of ``proc`` once it ends; killed, reaped and its pipes closed if
    it does not end within ``timeout`` (the failure then shows the end of its stderr)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, errs = proc.communicate()
        raise AssertionError(f"{proc.args!r} did not end within {timeout} s; its stderr "
                             f"ends: {(errs or b'').decode(errors='replace')[-2000:]}"
                             ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


async def reap(proc: trio.Process, timeout: float = 10.0) -> None:
    """Kill ``proc`` if it runs, wait for it and close its pipes, shielded: a test that
    fails inside a nursery runs its cleanup in a cancelled scope, where an unshielded
    wait returns at once and leaves the child running and unreaped."""
    if proc.returncode is None:
        proc.kill()
    with trio.move_on_after(timeout, shield=True):
        await proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()


def drain_pty(terminal: int) -> bytes:
    """What is left to read on the master side of a pty whose process has ended (read
    until EIO, which says the other side is closed and everything was read)."""
    got = b""
    while True:
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # EIO: the process is gone and the pty drained
            return got
        if not chunk:
            return got
        got += chunk
