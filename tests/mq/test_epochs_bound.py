"""Every epoch has one bound: claims, announcements, registrations and files at it or
past it are refused, and no step to a new epoch reaches it; a group or a cluster at the
last epoch below it keeps serving, and says why it cannot move on."""

from __future__ import annotations

import json
import pathlib

import pytest

from brokermgr import (
    MAX_EPOCH,
    BrokerManager,
    EpochError,
    GroupMember,
    GroupProgress,
    NameService,
    check_epoch,
    next_epoch,
)
from pump import ConfigError, Pump

LAST = MAX_EPOCH - 1  # the last epoch below the bound


def test_the_bound_is_one_and_nothing_reaches_it() -> None:
    assert MAX_EPOCH == 2**53 - 1  # every JSON reader holds it exactly
    assert check_epoch(0) == 0 and check_epoch(LAST) == LAST
    for bad in (MAX_EPOCH, 2**63 - 1, 2**63, -1, True, 1.0, "3", None):
        with pytest.raises(EpochError, match="must be an integer from 0 below"):
            check_epoch(bad)
    assert next_epoch(LAST - 1) == LAST
    with pytest.raises(EpochError, match="epochs exhausted: epoch .* is the last below"):
        next_epoch(LAST)
    with pytest.raises(EpochError):
        GroupMember("a", 0, "master", MAX_EPOCH)


def test_a_group_at_the_last_epoch_keeps_its_master_and_refuses_to_move_on() -> None:
    """The claim at 2^63 - 1, then failovers, that once left a group unable to follow:
    the claim past the bound is refused; one at the last epoch is granted; a failover
    by hand and a lost master's promotion are refused with the reason, and the master
    named stays."""
    service = NameService(BrokerManager("u", pump=Pump(name="m"), token="t"))
    t = service.groups
    t.update("a0", ("h", 1), GroupMember("a", 0, "master", 1, "c1"), ("orders",), 1,
             GroupProgress(10, ("a1",)))
    t.update("a1", ("h", 2), GroupMember("a", 1, "slave", 1, "c1"), (), 1, GroupProgress(10))
    for epoch in (2**63 - 1, MAX_EPOCH):
        reply = service.commands.answer({"cmd": "claim", "group": "a", "id": "a1",
                                         "epoch": epoch}, None)
        assert reply is not None and reply["status"] == 400, reply
        assert "claim: epoch must be an integer within 1.." in reply["error"]
    assert t.epochs["a"] == (1, "a0")
    assert t.claim("a", "a1", LAST) == (True, LAST)
    t.update("a1", ("h", 2), GroupMember("a", 1, "master", LAST, "c1"), ("orders",), 1,
             GroupProgress(10, ("a0",)))
    t.update("a0", ("h", 1), GroupMember("a", 0, "slave", LAST, "c1"), (), 1,
             GroupProgress(10))
    reply = service.commands.answer({"cmd": "failover", "group": "a", "to": "a0"}, None)
    assert reply is not None and reply["status"] == 409, reply
    assert "epochs exhausted" in reply["error"]
    assert t.epochs["a"] == (LAST, "a1") and t.group("a")["master"] == "a1"
    said = t.forget("a1")
    assert said is not None and "no master: epochs exhausted" in said
    assert t.epochs["a"] == (LAST, "a1")  # held: the master coming back resumes
    # a registration at the bound is refused whole, naming the epoch
    reply = service.commands.answer({"cmd": "register", "brokers": [
        {"id": "a2", "address": ["h", 3], "group": {
            "name": "a", "id": 2, "role": "slave", "epoch": MAX_EPOCH}}]}, None)
    assert reply is not None and reply["status"] == 400 and "epoch" in reply["error"]
    service.close()


def test_a_cluster_vote_at_the_last_epoch_stays_as_it_was() -> None:
    from mq.cluster._file import parse_cluster
    from mq.cluster._root import ballot

    config = parse_cluster({"cluster": {"name": "k"}, "server": [
        {"id": s, "address": "127.0.0.1:1", "type": "primary"} for s in ("a", "b")]})
    assert ballot(config, {"a", "b"}, ("a", 7), 7, "a", []) == ("a", 7)
    assert ballot(config, {"b"}, ("a", 7), 7, "a", []) == ("b", 8)  # a gone: b, next
    # at the last epoch, no vote for a next one: the vote stays, nothing wraps
    assert ballot(config, {"b"}, ("a", LAST), LAST, "a", []) == ("a", LAST)


@pytest.mark.parametrize("field", ["epoch", "ballot", "state"])
def test_a_cluster_state_file_with_an_epoch_out_of_range_is_refused_with_its_repair(
        tmp_path: pathlib.Path, field: str) -> None:
    from mq.cluster._votes import load_votes

    kept: dict[str, object] = {"epoch": 3, "ballot": ["a", 3],
                               "state": {"version": 1, "state_epoch": 3, "topics": {}}}
    if field == "epoch":
        kept["epoch"] = 2**63
    elif field == "ballot":
        kept["ballot"] = ["a", MAX_EPOCH]
    else:
        kept["state"] = {"version": 1, "state_epoch": -1, "topics": {}}
    path = tmp_path / "cluster-a.json"
    path.write_text(json.dumps(kept))
    with pytest.raises(ConfigError) as info:
        load_votes(path)
    said = str(info.value)
    assert said.startswith(f"{path}: ") and "\n" not in said
    assert "must be an integer from 0 below" in said
    assert "stop this server and remove the file" in said
    kept.update(epoch=3, ballot=["a", 3],
                state={"version": 1, "state_epoch": 3, "topics": {}})
    path.write_text(json.dumps(kept))
    assert load_votes(path)[0] == 3  # in range: read as written


def test_a_topic_s_epochs_file_past_the_bound_is_damage_named_at_open(
        tmp_path: pathlib.Path) -> None:
    from mq import FormatError
    from mq.storage._epochs import EPOCHS, EPOCHS_VERSION, Epochs

    (tmp_path / EPOCHS).write_text(json.dumps({"version": EPOCHS_VERSION,
                                               "epochs": [[0, 0], [MAX_EPOCH, 5]]}))
    with pytest.raises(FormatError, match="must be an integer from 0 below"):
        Epochs.read(tmp_path)


def test_a_cluster_announcement_past_the_bound_is_a_400_and_changes_nothing() -> None:
    """The ``root`` claim at 2^63 - 1 that once left a cluster without a root for good:
    refused at the edge, naming the field; the server follows whom it followed."""
    from mq import ClusterNode
    from mq.cluster._file import parse_cluster

    config = parse_cluster({"cluster": {"name": "k"}, "server": [
        {"id": s, "address": "127.0.0.1:1", "type": t}
        for s, t in (("a", "primary"), ("b", "primary"), ("e", "fanout"))]})
    universe = BrokerManager("u", pump=Pump(name="m"), token="t")
    node = ClusterNode(universe.add_broker("a"), config)
    for cmd in ("root", "state", "hello"):
        for field in ("epoch", "vote_epoch", "state_epoch"):
            reply = node.table.answer({"cmd": cmd, "cluster": "k", "id": "b",
                                       "checksum": config.checksum, "root": "b",
                                       "version": 1, "topics": {}, field: 2**63 - 1}, None)
            assert reply is not None and reply["status"] == 400, (cmd, field, reply)
            assert f"{cmd}: {field} must be an integer within 0..{LAST}" in reply["error"]
    assert (node.root, node.epoch) == (None, 0)
