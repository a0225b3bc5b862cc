"""Replicated groups in the name service: RocketMQ's tables, routes from them, and the
master epoch that fences a former master (the tables alone, then over the name service
on trio's mock clock)."""

from __future__ import annotations

import pytest

from brokermgr import GroupMember, GroupTables, NameClient, ServiceError, Status
from rdv import Address

from .test_names import MANAGER as _MANAGER
from .test_names import wait_until, world

MANAGER = Address(*_MANAGER)


def member(group: str, member_id: int, epoch: int = 1, role: str | None = None,
           cluster: str = "c1") -> GroupMember:
    return GroupMember(group, member_id, role or ("master" if member_id == 0 else "slave"),
                       epoch, cluster)


def test_the_tables_follow_the_masters_declarations_not_the_slaves() -> None:
    t = GroupTables()
    t.update("a0", ("h", 1), member("a", 0), ("orders", "audit"), version=7)
    t.update("a1", ("h", 2), member("a", 1), ("orders", "slaves-only"), version=3)
    t.update("b0", ("h", 3), member("b", 0, cluster="c2"), ("orders",), version=1)
    assert sorted(t.topics) == ["audit", "orders"]  # a slave's list changes nothing
    assert t.clusters() == {"c1": ["a"], "c2": ["b"]}
    route = t.route("orders")
    assert sorted(route["groups"]) == ["a", "b"]
    a = route["groups"]["a"]
    assert (a["cluster"], a["epoch"], a["perm"], a["master"]) == ("c1", 1, "rw", "a0")
    assert [(m["id"], m["broker"], m["role"], m["version"]) for m in a["members"]] == [
        (0, "a0", "master", 7), (1, "a1", "slave", 3)]
    # the master no longer declares audit: the topic goes; a new one comes
    t.update("a0", ("h", 1), member("a", 0), ("orders", "new"), version=8)
    assert sorted(t.topics) == ["new", "orders"]
    with pytest.raises(LookupError, match="no route to topic 'audit': no group's master"):
        t.route("audit")


def test_without_a_master_a_group_is_read_only_and_without_members_it_leaves() -> None:
    t = GroupTables()
    t.update("a0", ("h", 1), member("a", 0), ("orders",), version=1)
    t.update("a1", ("h", 2), member("a", 1), (), version=1)
    t.forget("a0")
    a = t.route("orders")["groups"]["a"]
    assert (a["perm"], a["master"], [m["broker"] for m in a["members"]]) == ("r", None, ["a1"])
    t.forget("a1")
    with pytest.raises(LookupError):
        t.route("orders")
    assert t.clusters() == {}


def test_an_older_epoch_or_a_second_master_in_one_epoch_is_refused() -> None:
    t = GroupTables()
    t.update("a0", ("h", 1), member("a", 0, epoch=1), ("orders",), version=1)
    assert t.refusal("a0", member("a", 0, epoch=1)) is None  # its own heartbeat
    assert t.refusal("a1", member("a", 1, epoch=1)) is None  # a slave
    why = t.refusal("a1", member("a", 1, epoch=1, role="master"))
    assert why == ("stale epoch: group a has master a0 at epoch 1; a1 registered as master "
                   "at epoch 1")
    # a promotion: a1 is master at epoch 2; a0, back at epoch 1, is fenced
    assert t.refusal("a1", member("a", 1, epoch=2, role="master")) is None
    t.update("a1", ("h", 2), member("a", 1, epoch=2, role="master"), ("orders",), version=2)
    assert t.route("orders")["groups"]["a"]["master"] == "a1"
    assert t.refusal("a0", member("a", 0, epoch=1))
    assert t.refusal("a0", member("a", 0, epoch=2, role="slave")) is None  # it rejoins
    # the newest epoch outlives every member
    t.forget("a1")
    assert t.refusal("a0", member("a", 0, epoch=1)) is not None


def test_a_group_member_is_checked_whole() -> None:
    for bad, says in (({"name": "a", "id": -1, "role": "master", "epoch": 1}, "member id"),
                      ({"name": "a", "id": 0, "role": "leader", "epoch": 1}, "master or slave"),
                      ({"name": "a", "id": 0, "role": "master", "epoch": "1"}, "integers"),
                      ({"name": "", "id": 0, "role": "master", "epoch": 1}, "a name"),
                      ([], "an object")):
        with pytest.raises(ValueError, match=says):
            GroupMember.from_json(bad)
    m = member("a", 2, epoch=5)
    assert GroupMember.from_json(m.to_json()) == m


async def test_the_name_service_answers_routes_and_refuses_a_fenced_master(
        autojump_clock: object) -> None:
    async with world() as w:
        service, _ = await w.manager(MANAGER, expiry=120, scan_interval=10)
        places = {"a0": member("a", 0), "a1": member("a", 1)}
        procs = {}
        for name in places:
            proc = procs[name] = await w.process(name)
            proc.u.add_broker(name)
            NameClient(proc.u, [MANAGER], topics=lambda b: ("orders",),
                       groups=lambda b: places.get(b)).start()
        asker = await w.process("asker")
        names = NameClient(asker.u, [MANAGER])
        names.start()
        await wait_until(lambda: "a0" in service.table and "a1" in service.table
                         and names.links[0].queue is not None)
        route = await names.route("orders")
        a = route["groups"]["a"]
        assert (a["master"], a["perm"], a["epoch"]) == ("a0", "rw", 1)
        listed = {b["id"]: b.get("group") for b in await names.list() or []}
        assert listed["a1"] == {"name": "a", "id": 1, "role": "slave", "epoch": 1,
                                "cluster": "c1"}
        with pytest.raises(ServiceError) as caught:
            await names.route("nothing")
        assert caught.value.status == Status.NOT_FOUND
        assert "no route to topic 'nothing'" in caught.value.reason
        # the master's process dies: its group can be read from the slave only
        procs["a0"].scope.cancel()
        await wait_until(lambda: "a0" not in service.table, step=0.001)
        a = (await names.route("orders"))["groups"]["a"]
        assert (a["master"], a["perm"]) == (None, "r")
        # a1 is promoted (epoch 2); a0 comes back still thinking it is master at epoch 1
        places["a1"] = member("a", 1, epoch=2, role="master")
        await wait_until(lambda: service.groups.master("a") is not None)  # next heartbeat
        back = await w.process("a0 again")
        back.u.add_broker("a0")
        again = NameClient(back.u, [MANAGER], topics=lambda b: ("orders",),
                           groups=lambda b: places.get(b))
        again.start()
        await wait_until(lambda: again.links[0].fenced is not None)  # refused, and told
        assert "stale epoch: group a has master a1 at epoch 2" in str(again.links[0].fenced)
        # a member all the same, as a slave: not the master
        a = (await names.route("orders"))["groups"]["a"]
        assert (a["master"], a["epoch"], [(m["broker"], m["role"]) for m in a["members"]]
                ) == ("a1", 2, [("a0", "slave"), ("a1", "master")])


def test_a_group_shows_its_masters_in_sync_members_and_each_member_s_lag() -> None:
    from brokermgr import GroupProgress

    t = GroupTables()
    t.update("a0", ("h", 1), member("a", 0), ("orders",), 1, GroupProgress(500, ("a1",)))
    t.update("a1", ("h", 2), member("a", 1), (), 1, GroupProgress(498))
    t.update("a2", ("h", 3), member("a", 2), (), 1)
    a = t.group("a")
    assert a["insync"] == ["a1"]
    assert [(m["broker"], m["held"], m["lag"]) for m in a["members"]] == [
        ("a0", 500, 0), ("a1", 498, 2), ("a2", None, None)]
    with pytest.raises(ValueError, match="insync must be a list of broker ids"):
        GroupProgress.from_json({"held": 1, "insync": "a1"})
    assert GroupProgress.from_json(GroupProgress(3, ("x",)).to_json()) == GroupProgress(3, ("x",))


def test_when_the_master_is_lost_the_in_sync_member_holding_most_is_promoted() -> None:
    from brokermgr import GroupProgress

    t = GroupTables()
    t.update("a0", ("h", 1), member("a", 0), ("orders",), 1,
             GroupProgress(100, ("a1", "a2")))
    t.update("a1", ("h", 2), member("a", 1), (), 1, GroupProgress(90))
    t.update("a2", ("h", 3), member("a", 2), (), 1, GroupProgress(95))
    t.update("a3", ("h", 4), member("a", 3), (), 1, GroupProgress(99))  # not in sync
    assert t.forget("a1") is None  # a slave leaves: nothing to decide
    t.update("a1", ("h", 2), member("a", 1), (), 1, GroupProgress(90))
    said = t.forget("a0")
    assert said == ("group a: master a0 lost at epoch 1; a2 promoted at epoch 2 (in sync, "
                    "holding 95 records)")
    a = t.route("orders")["groups"]["a"]
    assert (a["master"], a["epoch"], a["perm"]) == ("a2", 2, "rw")
    # it registers as master at its epoch; the old master is fenced, and rejoins as a slave
    assert t.refusal("a2", member("a", 2, epoch=2, role="master")) is None
    t.update("a2", ("h", 3), member("a", 2, epoch=2, role="master"), ("orders",), 2,
             GroupProgress(95, ("a1",)))
    assert t.refusal("a0", member("a", 0, epoch=1)) is not None
    assert t.refusal("a0", member("a", 0, epoch=2, role="slave")) is None
    # the promoted master lost too: a1 (in sync with it) next; then nobody in sync is left
    assert "a1 promoted at epoch 3" in str(t.forget("a2"))
    assert t.forget("a1") == ("group a: master a1 lost at epoch 3; no member it reported "
                              "in sync is alive: no master")
    assert t.master("a") is None and t.route("orders")["groups"]["a"]["perm"] == "r"


def test_a_promotion_chooses_and_reports_by_each_member_s_latest_registration() -> None:
    """Each beat of a member replaces what it said it holds: the failover chooses by the
    latest numbers and says them; a member that said nothing of its records comes after
    every one that did, and the log says so."""
    from brokermgr import GroupProgress

    t = GroupTables()
    t.update("a0", ("h", 1), member("a", 0), ("orders",), 1,
             GroupProgress(500, ("a1", "a2", "a3")))
    t.update("a1", ("h", 2), member("a", 1), (), 1, GroupProgress(300))
    t.update("a2", ("h", 3), member("a", 2), (), 1, GroupProgress(400))
    t.update("a3", ("h", 4), member("a", 3), (), 1, None)
    t.update("a1", ("h", 2), member("a", 1), (), 2, GroupProgress(440))  # its next beat
    assert t.forget("a0") == ("group a: master a0 lost at epoch 1; a1 promoted at epoch 2 "
                              "(in sync, holding 440 records)")
    t.update("a1", ("h", 2), member("a", 1, epoch=2, role="master"), ("orders",), 3,
             GroupProgress(450, ("a3",)))
    assert t.forget("a1") == ("group a: master a1 lost at epoch 2; a3 promoted at epoch 3 "
                              "(in sync, its records not reported)")


def test_a_group_left_without_a_master_gets_one_when_a_member_holding_all_is_back(
        ) -> None:
    """The master is lost while no member it reported in sync lives: no master.  A member
    that was not in sync coming back changes nothing (it may lack acknowledged
    messages); one the master reported in sync coming back is promoted at the next
    epoch; the former master coming back, even fenced (a restart registers as master at
    the first epoch), is named master at the epoch it held (it stored all it
    acknowledged), which it resumes."""
    from brokermgr import GroupProgress

    def lost_group() -> GroupTables:
        t = GroupTables()
        t.update("a0", ("h", 1), member("a", 0), ("orders",), 1, GroupProgress(100, ("a1",)))
        t.update("a2", ("h", 3), member("a", 2), (), 1, GroupProgress(40))  # behind
        assert t.forget("a2") is None
        assert "no master" in str(t.forget("a0"))
        assert t.recover("a") is None  # nobody is back
        return t

    t = lost_group()
    t.update("a2", ("h", 3), member("a", 2), (), 1, GroupProgress(40))
    assert t.recover("a") is None and t.master("a") is None  # not in sync: not a master
    t.update("a1", ("h", 2), member("a", 1), (), 1, GroupProgress(100))  # in sync: back
    assert t.recover("a") == ("group a: without a master since epoch 1; a1 is back and "
                              "promoted at epoch 2 (holding 100 records)")
    assert t.group("a")["master"] == "a1" and t.epochs["a"] == (2, "a1")

    t = lost_group()
    t.update("a0", ("h", 1), member("a", 0, epoch=1), (), 1, GroupProgress(100))
    assert t.recover("a") is None and t.group("a")["master"] == "a0"  # it resumes


def test_a_claim_is_granted_once_per_epoch_and_only_to_a_member_holding_all() -> None:
    """Several name services that name different masters are brought to one by claims:
    each table grants an epoch newer than any it has seen, once, to a live member that
    holds every acknowledged message as far as it knows (its newest master, or one that
    master reported in sync)."""
    from brokermgr import GroupProgress

    t = GroupTables()
    t.update("a0", ("h", 1), member("a", 0), ("orders",), 1, GroupProgress(100, ("a1",)))
    t.update("a1", ("h", 2), member("a", 1), (), 1, GroupProgress(100))
    t.update("a2", ("h", 3), member("a", 2), (), 1, GroupProgress(60))  # not in sync
    assert t.claim("a", "a2", 2) == (False, 1)  # may lack acknowledged messages
    assert t.claim("a", "a9", 2) == (False, 1)  # not a live member
    assert t.claim("a", "a1", 1) == (False, 1)  # not newer than what this table saw
    assert t.claim("a", "a1", 2) == (True, 2)
    assert t.group("a")["master"] == "a1" and t.epochs["a"] == (2, "a1")
    assert t.claim("a", "a0", 2) == (False, 2)  # epoch 2 went to a1: once per epoch
    assert t.claim("a", "a0", 3) == (False, 2)  # a0 is neither a1 nor in sync with it
    assert t.claim("a", "a1", 3) == (True, 3)  # the master itself, at a newer epoch


def test_a_bad_claim_is_a_400_naming_the_field_and_changes_nothing() -> None:
    from brokermgr import BrokerManager, NameService
    from pump import Pump

    service = NameService(BrokerManager("u", pump=Pump(name="m"), token="t"))
    for request, field in (({"group": "a", "id": "s1", "epoch": "2"}, "epoch"),
                           ({"group": "a", "id": "s1", "epoch": 0}, "epoch"),
                           ({"group": "a", "epoch": 2}, "id"),
                           ({"group": 7, "id": "s1", "epoch": 2}, "group")):
        reply = service.commands.answer({"cmd": "claim", **request}, None)
        assert reply is not None and reply["status"] == 400, reply
        assert f"claim: {field}" in reply["error"], reply
    assert service.groups.epochs == {}
    # a claim of a group nobody registered is refused, not an error
    assert service.commands.answer({"cmd": "claim", "group": "a", "id": "s1", "epoch": 2},
                                   None) == {"cmd": "claim", "granted": False, "epoch": 0}
    service.close()


def test_a_failover_by_hand_goes_only_to_a_live_member_in_sync() -> None:
    from brokermgr import GroupProgress

    t = GroupTables()
    t.update("a0", ("h", 1), member("a", 0), ("orders",), 1, GroupProgress(10, ("a1",)))
    t.update("a1", ("h", 2), member("a", 1), (), 1, GroupProgress(10))
    t.update("a2", ("h", 3), member("a", 2), (), 1, GroupProgress(4))
    with pytest.raises(ValueError, match="a2 is not in sync with master a0: it may lack "
                                         "acknowledged messages"):
        t.switch("a", "2")
    with pytest.raises(ValueError, match="a0 is the master of group a already"):
        t.switch("a", "a0")
    with pytest.raises(LookupError, match="no live member '9'"):
        t.switch("a", "9")
    with pytest.raises(LookupError, match="group 'b' has no master"):
        t.switch("b", "a1")
    assert t.epochs["a"] == (1, "a0")  # nothing changed
    assert t.switch("a", "1") == 2
    assert t.master("a") is not None and t.master("a").broker_id == "a1"  # type: ignore[union-attr]
    assert t.refusal("a0", member("a", 0, epoch=1)) is not None  # the old master steps down
    assert t.insync["a"] == ("a0",)


def test_a_master_that_dies_right_after_its_promotion_is_followed_by_the_next_in_sync() -> None:
    """A member promoted registers as master before any member is in sync with it (its
    in-sync set empty): the set it was promoted with stands until it reports one of its
    own, so if it dies then, the other member that was in sync is promoted, not nobody.
    Once it reports a set of its own, that one is the set."""
    from brokermgr import GroupProgress

    t = GroupTables()
    t.update("a0", ("h", 1), member("a", 0), ("orders",), 1, GroupProgress(100, ("a1", "a2")))
    t.update("a1", ("h", 2), member("a", 1), (), 1, GroupProgress(100))
    t.update("a2", ("h", 3), member("a", 2), (), 1, GroupProgress(100))
    assert "a1 promoted at epoch 2" in str(t.forget("a0"))
    t.update("a1", ("h", 2), member("a", 1, epoch=2, role="master"), ("orders",), 2,
             GroupProgress(100, ()))  # promoted; a2 not following it yet
    assert t.insync["a"] == ("a2",)
    assert "a2 promoted at epoch 3" in str(t.forget("a1"))
    assert t.group("a")["master"] == "a2"
    # a set of its own replaces the inherited one, and an empty one later is taken as is
    t.update("a2", ("h", 3), member("a", 2, epoch=3, role="master"), ("orders",), 3,
             GroupProgress(100, ("a1",)))
    t.update("a2", ("h", 3), member("a", 2, epoch=3, role="master"), ("orders",), 4,
             GroupProgress(100, ()))
    assert t.insync["a"] == ()
