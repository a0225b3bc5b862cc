"""Both ends of the protocol between ``universe up`` and its children
(:mod:`rdvpump.children`): a real child's ``ready`` line, one that never says it, and
the lines a parent reads into a broker's state."""

from __future__ import annotations

import os
import signal

import pytest
import trio
import trio.testing

from rdv import Address
from rdvpump._errors import RunError
from rdvpump.children import (
    STDERR_KEPT,
    ChildState,
    StderrTail,
    ready_line,
    report,
    start_child,
    stop_all,
)

pytestmark = pytest.mark.slow  # real processes


async def test_children_are_started_at_their_ready_lines_and_stop_cleanly_at_once() -> None:
    """SIGINT the moment a child says ``ready`` is a clean shutdown (exit 0): the signals
    are caught before the line is printed.  (Children that caught them only after it
    died of a KeyboardInterrupt, with a traceback and exit 1, in 11 of 12 such stops
    from a blocking reader; from this parent the window is hit less often.)"""
    children: list[trio.Process] = []
    async with trio.open_nursery() as nursery:
        try:
            manager = await start_child(["manager", "serve", "--universe", "c", "--listen",
                                         "127.0.0.1:0"], os.environ, children, nursery)
            assert manager.address[0] == "127.0.0.1" and manager.address[1] > 0
            where = f"127.0.0.1:{manager.address[1]}"
            for n in range(4):
                broker = await start_child(["broker", "run", "--universe", "c", "--id",
                                            f"b{n}", "--manager", where, "--echo", "80"],
                                           os.environ, children, nursery)
                broker.process.send_signal(signal.SIGINT)
                assert await broker.process.wait() == 0, n
                assert await broker.why("when stopped") == "exited with status 0 when stopped"
            assert manager.process.returncode is None
        finally:
            with trio.CancelScope(shield=True):
                await stop_all(children)
    assert [p.returncode for p in children] == [0] * 5  # not killed, no traceback


async def test_a_child_that_exits_before_its_ready_line_says_why_in_its_error() -> None:
    """Its status and its own one-line error: the parent reads its stderr to the end."""
    children: list[trio.Process] = []
    async with trio.open_nursery() as nursery:
        try:
            with pytest.raises(RunError, match="^manager serve exited with status 1 before it "
                                               "was ready: error: address 'nowhere' must be "
                                               "HOST:PORT$"):
                await start_child(["manager", "serve", "--listen", "nowhere"], os.environ,
                                  children, nursery)
        finally:
            await stop_all(children)
    assert children[0].returncode == 1


async def test_a_child_s_last_word_is_its_last_line_that_says_something() -> None:
    """What :class:`StderrTail` keeps of a chatty child: the end only, colour codes
    dropped; a child killed by a signal is said so, whatever it printed last."""
    tail = StderrTail()
    send, receive = trio.testing.memory_stream_one_way_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tail.keep, receive)
        await send.send_all(b"broker b: connected\n" * 10_000)  # far past what is kept
        await send.send_all(b"\x1b[31merror: disk full\x1b[0m\n  \n")
        await send.aclose()
    assert len(tail.data) <= STDERR_KEPT
    assert await tail.why(1, "while the universe ran") == \
        "exited with status 1 while the universe ran: error: disk full"
    assert await tail.why(-9, "before it was ready") == "killed by SIGKILL before it was ready"


def test_the_lines_a_child_prints_are_the_state_its_parent_reads(
        capsys: pytest.CaptureFixture[str]) -> None:
    ready_line("brokers")(Address("127.0.0.1", 4321))
    report("stats", {"links": 1, "messages": 5, "bytes": 50, "errors": []})
    report("error", {"message": "link lost"})
    report("done", {"reports": [{"workload": "echo a->b:80"}]})
    first, *lines = capsys.readouterr().out.splitlines()
    assert first == "ready brokers 127.0.0.1:4321"
    state = ChildState("a")
    for line in lines:
        state.take(line)
    assert state.stats["messages"] == 5 and state.error == "link lost"
    assert state.reports == [{"workload": "echo a->b:80"}]


def test_a_workload_that_broke_off_is_the_child_s_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Its sinks would wait for ever for what it never sent: the universe stops with the
    reason instead (a workload that ran to its end unchecked is not an error here)."""
    report("done", {"reports": [
        {"workload": "echo a->b:80", "verified": False},
        {"workload": "stream a->c:7", "verified": False,
         "error": "c refused the link: nothing listens on port 7"}]})
    state = ChildState("a")
    state.take(capsys.readouterr().out.strip())
    assert state.error == ("workload stream a->c:7 failed: c refused the link: nothing "
                           "listens on port 7")
    report("done", {"reports": [{"workload": "echo a->b:80", "verified": False}]})
    state = ChildState("a")
    state.take(capsys.readouterr().out.strip())
    assert state.error is None and state.reports is not None
