"""How soon a replicated group's member promoted takes over when its master crashes:
its link to the master closes at the moment the name service's does, and it asks the
name service at once (then every few milliseconds for a while), not at its next
question of every :data:`mq.replication._member.GROUP_POLL` seconds.  A simulation on
the virtual clock, the members kept as ``broker run --group`` keeps them
(:func:`mq.keep_role`)."""

from __future__ import annotations

import pathlib
from typing import Any

import trio

from brokermgr import NameService, ServiceError
from brokermgr.tracking import TrackNode
from mq.replication._member import GROUP_POLL
from rdvpump.testing import open_simulation, run_simulation

from .chaos import memory_dir
from .test_group_simulation import NAMES, SERVERS, TIMING, TRACKER, Member


async def in_sync(faults: Any, store: pathlib.Path, nursery: trio.Nursery
                  ) -> dict[str, Member]:
    """A group of three under a name service (and a tracker) in the simulation
    ``faults``, s1 its master with a topic, once both slaves are in sync: its members."""
    universe = faults.universe
    NameService(universe, expiry=3.0, scan_interval=0.5)
    TrackNode(universe.add_broker(TRACKER), role="tracker", **TIMING)
    members = {name: Member(universe.add_broker(name), i, store, nursery, "sync", NAMES[1])
               for i, name in enumerate(SERVERS)}
    master = members["s1"].server
    with trio.fail_after(10):
        while True:  # once the name service confirms s1 as the master
            try:
                master.handle_local({"cmd": "declare", "topic": "orders"})
                break
            except ServiceError:
                await trio.sleep(0.01)
        while len(master.role.progress().insync) < 2:
            await trio.sleep(0.01)  # the slaves follow it: the clock driven
    return members


async def one_kill(phase: float, store: pathlib.Path, during_question: bool = False
                   ) -> float:
    """A group of three, s1 its master; s1 crashes ``phase`` seconds after the slaves
    are in sync (or, ``during_question``, while both slaves wait for the name service's
    answer to a question, which still names s1): the seconds until another member is
    master."""
    async with open_simulation("takeover", seed=0) as faults, trio.open_nursery() as nursery:
        members = await in_sync(faults, store, nursery)
        await trio.sleep(phase)
        if during_question:
            asked = trio.Event()
            for name in ("s2", "s3"):
                members[name].names.group_views = _told(  # type: ignore[method-assign]
                    members[name].names.group_views, asked)
            await asked.wait()
        killed_at = trio.current_time()
        members["s1"].crash()
        faults.crash("s1")

        def promoted() -> bool:
            return any(m.id != "s1" and (group := m.server.group) is not None
                       and group.role == "master" for m in members.values())

        with trio.fail_after(10):
            while not promoted():
                await trio.sleep(0.001)  # the clock driven by 1 ms steps
        took = trio.current_time() - killed_at
        for member in members.values():
            if member.id != "s1":
                member.crash()
        nursery.cancel_scope.cancel()
    return took


def _told(ask: Any, asked: trio.Event) -> Any:
    """``ask`` (a name client's ``group_views``), setting ``asked`` and waiting a
    millisecond before its answer is given."""
    async def answer(group: str) -> Any:
        views = await ask(group)
        asked.set()
        await trio.sleep(0.001)
        return views
    return answer


def test_the_member_promoted_takes_over_at_once_whatever_the_phase_of_its_questions(
        ) -> None:
    """Ten crashes, each at another phase of the members' questions: each time a slave
    is master within 20 ms (it would wait up to ``GROUP_POLL`` = 0.1 s for its next
    question)."""
    took = []
    for step in range(10):
        with memory_dir("rdvpump-takeover-") as store:
            took.append(run_simulation(one_kill, step * GROUP_POLL / 10, store))
    assert max(took) < 0.02, took


def test_a_master_lost_while_its_slaves_ask_is_not_missed() -> None:
    """The master crashes while its slaves wait for an answer that still names it: the
    loss is seen when the answer comes, not at the next question 0.1 s later."""
    with memory_dir("rdvpump-takeover-") as store:
        took = run_simulation(one_kill, 0.0, store, True)
    assert took < 0.02, took


async def closed_while_asking(store: pathlib.Path) -> tuple[str, str]:
    """A group of three, s1 its master; s1 crashes, and the member the name service then
    names master has its server closed while that answer is on its way to it (as ``broker
    run`` closes its topics on SIGTERM, then unregisters while its role is still kept):
    that member's name and its role once its role keeper ended."""
    async with open_simulation("takeover", seed=0) as faults, trio.open_nursery() as nursery:
        members = await in_sync(faults, store, nursery)
        closed: list[str] = []
        for name in ("s2", "s3"):
            members[name].names.group_views = _closing(  # type: ignore[method-assign]
                members[name], closed)
        members["s1"].crash()
        faults.crash("s1")
        with trio.fail_after(10):
            while not closed:
                await trio.sleep(0.001)
            await members[closed[0]].kept.wait()
        group = members[closed[0]].server.group
        assert group is not None
        for member in members.values():
            member.crash()
        nursery.cancel_scope.cancel()
    return closed[0], group.role


def _closing(member: Member, closed: list[str]) -> Any:
    """``member``'s ``group_views``, closing its server while an answer that names it
    master is on its way (once)."""
    ask = member.names.group_views

    async def answer(group: str) -> Any:
        views = await ask(group)
        if not closed and any(v.get("master") == member.id for v in views):
            closed.append(member.id)
            member.server.close()
        return views
    return answer


def test_a_member_closed_while_named_master_ends_its_role_without_an_error() -> None:
    """The member named master after a crash is stopping: its topics are closed when the
    answer comes.  It takes no role (it stays a slave, its logs shut) and its role keeper
    ends quietly: a promotion on closed logs fails (an IndexError), and ``broker run``
    would stop with a traceback and exit status 1."""
    with memory_dir("rdvpump-takeover-") as store:
        name, role = run_simulation(closed_while_asking, store)
    assert name in ("s2", "s3") and role == "slave", (name, role)
