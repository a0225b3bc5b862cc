"""Both ends of the protocol between ``universe up`` and its children
(:mod:`rdvpump.children`): a real child's ``ready`` line, one that never says it, and
the lines a parent reads into a broker's state."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from rdv import Address
from rdvpump._errors import RunError
from rdvpump.children import ChildState, ready_line, report, start_child, stop_all

pytestmark = pytest.mark.slow  # real processes


async def test_children_are_started_at_their_ready_lines_and_stop_cleanly_at_once() -> None:
    """SIGINT the moment a child says ``ready`` is a clean shutdown (exit 0): the signals
    are caught before the line is printed.  (Children that caught them only after it
    died of a KeyboardInterrupt, with a traceback and exit 1, in 11 of 12 such stops
    from a blocking reader; from this parent the window is hit less often.)"""
    children: list[trio.Process] = []
    try:
        manager = await start_child(["manager", "serve", "--universe", "c", "--listen",
                                     "127.0.0.1:0"], os.environ, children)
        assert manager.address[0] == "127.0.0.1" and manager.address[1] > 0
        where = f"127.0.0.1:{manager.address[1]}"
        for n in range(4):
            broker = await start_child(["broker", "run", "--universe", "c", "--id", f"b{n}",
                                        "--manager", where, "--echo", "80"], os.environ,
                                       children)
            broker.process.send_signal(signal.SIGINT)
            assert await broker.process.wait() == 0, n
        assert manager.process.returncode is None
    finally:
        with trio.CancelScope(shield=True):
            await stop_all(children)
    assert [p.returncode for p in children] == [0] * 5  # not killed, no traceback


async def test_a_child_that_exits_before_its_ready_line_is_a_clear_error() -> None:
    children: list[trio.Process] = []
    try:
        with pytest.raises(RunError, match="^manager serve exited with status 1 before it "
                                             "was ready$"):
            await start_child(["manager", "serve", "--listen", "nowhere"], os.environ,
                              children)
    finally:
        await stop_all(children)
    assert children[0].returncode == 1


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
