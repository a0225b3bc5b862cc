"""Replicated groups in the name service: RocketMQ's NameServer tables (sans-I/O).

A group is a set of servers that hold the same topics (RocketMQ's brokerName): each
member has an id (0 the preferred master), a role (``master`` or ``slave``) and the
master epoch it knows; a group belongs to a cluster.  The tables, kept from the
registrations of live brokers:

* topic -> {group -> permission}: ``rw`` while the group has a master, ``r`` while only
  slaves are left; only the group's current master's registrations change which topics
  a group serves (a slave's topic list never does);
* group -> cluster, and member id -> broker;
* cluster -> groups;
* each live broker's data version (its registration's ``version``).

The master epoch fences: a registration as master with an epoch older than the
group's newest is refused (the master it would have been is a former one), and so is
one with the newest epoch from a broker that is not the master holding it.  The newest
epoch of each group is kept while the name service runs, even when no member is left.

Failover, the rule: when the broker holding a group's newest epoch leaves (its link to
the name service lost, or its heartbeats stopped), the name service promotes the live
member, among those its master last reported in sync, that holds the most records (the
lowest member id on a tie), at the next epoch; with no in-sync member alive the group
has no master until one registers.  The promoted member takes over only once its own
link to the old master is gone too (:mod:`rdvpump.processes`), so a master cut off from
the name service alone is not doubled.  One name service decides; several deciding by
majority is not built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._fence import STALE_EPOCH, EpochError, check_epoch, fenced, next_epoch

#: The roles of a group's member.
ROLES = ("master", "slave")
DEFAULT_CLUSTER = "default"


@dataclass(frozen=True, slots=True)
class GroupMember:
    """What a broker registers about its group."""

    group: str
    member_id: int
    role: str
    epoch: int
    cluster: str = DEFAULT_CLUSTER

    def __post_init__(self) -> None:
        if not self.group:
            raise ValueError("a group needs a name")
        if type(self.member_id) is not int or self.member_id < 0:
            raise ValueError(f"a member id is a non-negative integer, not {self.member_id!r}")
        if self.role not in ROLES:
            raise ValueError(f"a role is master or slave, not {self.role!r}")
        check_epoch(self.epoch, "a group's epoch")
        if not self.cluster:
            raise ValueError("a cluster needs a name")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.group, "id": self.member_id, "role": self.role,
                "epoch": self.epoch, "cluster": self.cluster}

    @classmethod
    def from_json(cls, value: Any) -> GroupMember:
        if not isinstance(value, dict):
            raise ValueError("its group must be an object: name, id, role, epoch, cluster")
        name, cluster = value.get("name"), value.get("cluster", DEFAULT_CLUSTER)
        member_id, role, epoch = value.get("id"), value.get("role"), value.get("epoch")
        if not isinstance(name, str) or not isinstance(cluster, str):
            raise ValueError("its group's name and cluster must be strings")
        if type(member_id) is not int or type(epoch) is not int:
            raise ValueError("its group's id and epoch must be integers")
        if not isinstance(role, str):
            raise ValueError("its group's role must be master or slave")
        return cls(name, member_id, role, epoch, cluster)


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """How far a member's copy is, registered with each heartbeat: the records it holds
    (over every topic of the group), and, from a master, its in-sync members (broker
    ids)."""

    held: int = 0
    insync: tuple[str, ...] = ()
    #: From a slave copying its master: the seconds since the master last said anything
    #: (it answers a query every :data:`~mq.replication._follower.DEFAULT_RESCAN` while it lives).
    quiet: float | None = None
    #: The member's own timeout: a master quiet to it for this long is silent, and it is
    #: a witness of that (None: the name service's :data:`~brokermgr.QUIET`).
    silence: float | None = None

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"held": self.held, "insync": list(self.insync)}
        if self.quiet is not None:
            row["quiet"] = self.quiet
        if self.silence is not None:
            row["silence"] = self.silence
        return row

    @classmethod
    def from_json(cls, value: Any) -> GroupProgress:
        if not isinstance(value, dict):
            raise ValueError("its progress must be an object: held, insync, quiet, silence")
        held, insync = value.get("held", 0), value.get("insync", [])
        quiet, silence = value.get("quiet"), value.get("silence")
        if type(held) is not int or held < 0:
            raise ValueError("its progress's held must be a non-negative integer")
        if not isinstance(insync, list) or not all(isinstance(i, str) for i in insync):
            raise ValueError("its progress's insync must be a list of broker ids")
        if quiet is not None and (type(quiet) not in (int, float) or not 0 <= quiet < 1e9):
            raise ValueError("its progress's quiet must be a number of seconds")
        if silence is not None and (type(silence) not in (int, float)
                                    or not 0 < silence < 1e9):
            raise ValueError("its progress's silence must be a positive number of seconds")
        return cls(held, tuple(insync), None if quiet is None else float(quiet),
                   None if silence is None else float(silence))


@dataclass(frozen=True, slots=True)
class _Member:
    broker_id: str
    address: Any
    member: GroupMember
    version: int
    progress: GroupProgress | None = None


class GroupTables:
    """The tables of the module, over the live brokers that registered a group."""

    def __init__(self) -> None:
        self.members: dict[str, _Member] = {}  # by broker id
        #: topic -> group -> True (the group's master declared it)
        self.topics: dict[str, dict[str, bool]] = {}
        #: the newest master epoch of each group, and the broker holding it
        self.epochs: dict[str, tuple[int, str]] = {}
        #: the in-sync members each group's master reported last (broker ids)
        self.insync: dict[str, tuple[str, ...]] = {}
        #: groups whose in-sync set is still the one their master was promoted with (the
        #: old master's, less itself), by the epoch of that promotion
        self.inherited: dict[str, int] = {}

    # -- registrations ---------------------------------------------------------------------

    def refusal(self, broker_id: str, member: GroupMember) -> str | None:
        """Why this registration is refused (a fenced master), or None."""
        if member.role != "master":
            return None
        held = self.epochs.get(member.group)
        if held is None:
            return None
        epoch, holder = held
        if fenced(held, broker_id, member.epoch):
            return (f"{STALE_EPOCH}: group {member.group} has master {holder} at epoch "
                    f"{epoch}; {broker_id} registered as master at epoch {member.epoch}")
        return None

    def update(self, broker_id: str, address: Any, member: GroupMember,
               topics: tuple[str, ...], version: int,
               progress: GroupProgress | None = None) -> None:
        """A registration that :meth:`refusal` let through."""
        old = self.members.get(broker_id)
        if old is not None and old.member.group != member.group:
            self.forget(broker_id)
        self.members[broker_id] = _Member(broker_id, address, member, version, progress)
        if member.role == "master":
            self.epochs[member.group] = (member.epoch, broker_id)
            # a master just promoted, none of its members in sync with it yet, keeps the
            # set it was promoted with: under ``sync`` it acknowledges nothing until one
            # is, so those still hold every acknowledged message, and if it dies now one
            # of them is promoted (not nobody)
            if progress is not None and (
                    progress.insync or self.inherited.get(member.group) != member.epoch):
                self.insync[member.group] = progress.insync
                self.inherited.pop(member.group, None)
            declared = set(topics)
            for topic in declared:
                self.topics.setdefault(topic, {})[member.group] = True
            for topic in [t for t, groups in self.topics.items()
                          if member.group in groups and t not in declared]:
                self._drop(topic, member.group)

    def forget(self, broker_id: str) -> str | None:
        """A broker left (unregistered, its link lost, expired): if it held its group's
        newest epoch, the failover of the module (what happened, to log); a group with no
        live member left leaves every topic."""
        gone = self.members.pop(broker_id, None)
        if gone is None:
            return None
        group = gone.member.group
        held = self.epochs.get(group)
        said = None if held is None or held[1] != broker_id else self._promote(group, held)
        if not any(m.member.group == group for m in self.members.values()):
            for topic in [t for t, groups in self.topics.items() if group in groups]:
                self._drop(topic, group)
        return said

    def recover(self, group: str) -> str | None:
        """A group left with no master (its master lost while no member in sync lived)
        gets one as soon as a member the master reported in sync is back, at the next
        epoch.  (The former master itself back holds its epoch again: :meth:`master`
        names it, and it resumes.)  What happened, to log; None if nothing did."""
        held = self.epochs.get(group)
        if held is None or self.master(group) is not None:
            return None
        insync = set(self.insync.get(group, ())) - {held[1]}
        if not any(m.member.group == group and m.broker_id in insync
                   for m in self.members.values()):
            return None
        return self._promote(group, held, returned=True)

    def _promote(self, group: str, held: tuple[int, str], *, returned: bool = False) -> str:
        epoch, lost = held
        insync = set(self.insync.get(group, ())) - {lost}
        candidates = [m for m in self.members.values()
                      if m.member.group == group and m.broker_id in insync]
        if not candidates:
            return (f"group {group}: master {lost} lost at epoch {epoch}; no member it "
                    f"reported in sync is alive: no master")
        # the most records, as each last registered them (a member that said nothing of
        # its records comes after every one that did)
        winner = max(candidates, key=lambda m: (
            m.progress is not None, m.progress.held if m.progress is not None else 0,
            -m.member.member_id))
        try:
            new = next_epoch(epoch)
        except EpochError as exc:  # the epoch held stays: its master may come back
            return f"group {group}: master {lost} lost at epoch {epoch}; no master: {exc}"
        self.epochs[group] = (new, winner.broker_id)
        self.insync[group] = tuple(sorted(insync - {winner.broker_id}))
        self.inherited[group] = new
        records = ("its records not reported" if winner.progress is None
                   else f"holding {winner.progress.held} records")
        if returned:
            return (f"group {group}: without a master since epoch {epoch}; "
                    f"{winner.broker_id} is back and promoted at epoch {new} ({records})")
        return (f"group {group}: master {lost} lost at epoch {epoch}; {winner.broker_id} "
                f"promoted at epoch {new} (in sync, {records})")

    def claim(self, group: str, broker_id: str, epoch: int) -> tuple[bool, int]:
        """A member asks to be the group's master at ``epoch`` (several name services that
        cannot agree on one: :func:`mq.keep_role`).  Granted when ``epoch`` is newer than
        every epoch this table has seen and the member holds every acknowledged message
        as far as this table knows (the master in its newest epoch, or a member that
        master reported in sync): then it is the master at ``epoch`` here.  A table
        grants one member per epoch, so a member granted by a majority of the name
        services is the only one.  (Granted, newest epoch.)"""
        held = self.epochs.get(group)
        newest = 0 if held is None else held[0]
        member = self.members.get(broker_id)
        if member is None or member.member.group != group or epoch <= newest:
            return False, newest
        eligible = held is None or broker_id == held[1] or broker_id in self.insync.get(
            group, ())
        if not eligible:
            return False, newest
        self.epochs[group] = (epoch, broker_id)
        self.insync[group] = tuple(sorted(set(self.insync.get(group, ())) - {broker_id}))
        return True, epoch

    def switch(self, group: str, to: str) -> int:
        """A failover by hand: ``to`` (a live member's broker id, or its member id) is the
        group's master at the next epoch, if the master reported it in sync; the new
        epoch.  ValueError with the reason otherwise (nothing changes)."""
        held = self.epochs.get(group)
        if held is None:
            raise LookupError(f"group {group!r} has no master to switch from")
        members = {m.broker_id: m for m in self.members.values() if m.member.group == group}
        by_id = {str(m.member.member_id): b for b, m in members.items()}
        broker = to if to in members else by_id.get(to)
        if broker is None:
            raise LookupError(f"group {group!r} has no live member {to!r}")
        epoch, master = held
        if broker == master:
            raise ValueError(f"{broker} is the master of group {group} already (epoch "
                             f"{epoch})")
        if broker not in self.insync.get(group, ()):
            raise ValueError(f"{broker} is not in sync with master {master}: it may lack "
                             f"acknowledged messages (in sync: "
                             f"{', '.join(self.insync.get(group, ())) or 'none'})")
        new = next_epoch(epoch)  # EpochError (a ValueError) at the bound: nothing changes
        self.epochs[group] = (new, broker)
        self.insync[group] = tuple(sorted(set(self.insync[group]) - {broker} | {master}))
        return new

    def _drop(self, topic: str, group: str) -> None:
        groups = self.topics[topic]
        del groups[group]
        if not groups:
            del self.topics[topic]

    # -- answers ---------------------------------------------------------------------------

    def master(self, group: str) -> _Member | None:
        """The live member holding the group's newest epoch (a master, or a member
        promoted that has not registered as master yet), if any."""
        held = self.epochs.get(group)
        if held is None:
            return None
        member = self.members.get(held[1])
        if member is None or member.member.group != group:
            return None
        return member

    def clusters(self) -> dict[str, list[str]]:
        """cluster -> its groups with a live member."""
        found: dict[str, set[str]] = {}
        for m in self.members.values():
            found.setdefault(m.member.cluster, set()).add(m.member.group)
        return {c: sorted(g) for c, g in sorted(found.items())}

    def group(self, name: str) -> dict[str, Any]:
        """A group as a route shows it: cluster, newest epoch, permission, master, the
        members in sync (what the failover would choose from: as the master last
        reported them, less a member promoted since; the master waits for each), and the
        members (by id) with the records each holds and its lag (the master's count less
        its own; None without a master or a count)."""
        live = sorted((m for m in self.members.values() if m.member.group == name),
                      key=lambda m: (m.member.member_id, m.broker_id))
        master = self.master(name)
        epoch = self.epochs.get(name, (None, None))[0]
        top = None if master is None or master.progress is None else master.progress.held
        return {"cluster": live[0].member.cluster if live else None, "epoch": epoch,
                "perm": "rw" if master is not None else "r",
                "master": None if master is None else master.broker_id,
                "insync": sorted(self.insync.get(name, ())),
                "members": [{"id": m.member.member_id, "broker": m.broker_id,
                             "address": list(m.address), "role": m.member.role,
                             "epoch": m.member.epoch, "version": m.version,
                             "held": None if m.progress is None else m.progress.held,
                             "lag": None if top is None or m.progress is None
                             else max(0, top - m.progress.held)} for m in live]}

    def route(self, topic: str) -> dict[str, Any]:
        """The groups serving ``topic``; LookupError with the reason when none does."""
        groups = self.topics.get(topic)
        if not groups:
            raise LookupError(f"no route to topic {topic!r}: no group's master declared it")
        return {"topic": topic, "groups": {g: self.group(g) for g in sorted(groups)}}
