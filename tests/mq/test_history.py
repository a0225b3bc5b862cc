"""The history checker: each guarantee it checks is found broken exactly where it is, and
histories a correct at-least-once queue makes (a model with retries, lost links and
redeliveries, over many seeds) pass."""

from __future__ import annotations

import io
import json
import pathlib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq import History, HistoryError, check_history
from mq._history import Consumed, Published


def clean() -> History:
    """Two producers into one partition, one group: a redelivery of an unacknowledged
    message, acks confirmed."""
    h = History()
    for i in range(3):
        h.publish("orders", "a", i + 1, partition="s1", offset=2 * i, server="s1", epoch=1)
        h.publish("orders", "b", i + 1, partition="s1", offset=2 * i + 1, server="s1",
                  epoch=1)
    for offset in range(6):
        producer, sequence = "ab"[offset % 2], offset // 2 + 1
        h.consume("orders", "g", producer, sequence, partition="s1", offset=offset)
        if offset != 3:
            h.ack("orders", "g", offset, partition="s1")
    h.consume("orders", "g", "b", 2, partition="s1", offset=3)  # never acked: again
    return h


def test_a_clean_history_has_no_findings_and_counts_what_it_holds() -> None:
    report = clean().check()
    assert report.ok and report.findings == []
    assert report.counts["messages"] == report.counts["acknowledged"] == 6
    assert report.counts["deliveries"] == 7 and report.counts["redeliveries"] == 1
    assert report.counts["lost"] == 0


def test_an_acknowledged_message_a_group_never_received_is_lost() -> None:
    h = clean()
    h.publish("orders", "a", 4, partition="s1", offset=6)
    h.publish("orders", "a", 5, "unknown")  # no answer, never seen: allowed
    report = h.check()
    (lost,) = report.findings
    assert (lost.kind, lost.producer, lost.sequence, lost.group) == ("lost", "a", 4, "g")
    assert report.counts["unacknowledged never received"] == 1
    # a group named by the caller is expected to receive every message
    assert len(h.check({"orders": ["g", "audit"]}).of("lost")) == 7 + 1  # audit: all 7


def test_more_copies_than_publishes_is_stored_twice_and_retries_are_counted() -> None:
    h = clean()
    h.consume("orders", "g", "a", 1, partition="s1", offset=9)  # one publish, two copies
    (twice,) = h.check().findings
    assert twice.kind == "stored twice"
    assert twice.detail == "a#1 at offsets 0, 9 of s1 (1 publishes of it)"
    # a publish with no answer, tried again: a copy per try is at-least-once's right
    h = clean()
    h.publish("orders", "c", 1, "unknown")
    h.publish("orders", "c", 1, partition="s1", offset=7)
    h.consume("orders", "g", "c", 1, partition="s1", offset=6)
    h.consume("orders", "g", "c", 1, partition="s1", offset=7)
    h.publish("orders", "b", 1, partition="s2", offset=0)  # and elsewhere
    report = h.check()
    assert report.ok and report.counts["copies"] == 2
    # unless the servers promise to recognise a retry (idempotent publishing)
    assert [f.kind for f in h.check(idempotent=True).findings] == ["stored twice"]


def test_a_delivery_after_a_confirmed_ack_is_beyond_at_least_once() -> None:
    h = clean()
    h.consume("orders", "g", "a", 1, partition="s1", offset=0)
    h.consume("orders", "g", "a", 1, partition="s1", offset=0)  # reported once
    (again,) = h.check().findings
    assert (again.kind, again.producer, again.sequence) == ("delivered after its ack", "a", 1)
    h = clean()
    h.ack("orders", "g", 3, "unknown", partition="s1")  # only tried: not confirmed
    h.consume("orders", "g", "b", 2, partition="s1", offset=3)
    assert h.check().ok


def test_offsets_that_do_not_rise_with_a_producer_s_sequence_are_out_of_order() -> None:
    h = History()
    h.publish("t", "p", 1, partition="s1", offset=5)
    h.publish("t", "p", 2, partition="s1", offset=4)
    h.publish("t", "p", 3, partition="s1", offset=6)
    h.publish("t", "q", 1, partition="s2", offset=0)  # another partition: its own order
    (late,) = h.check().findings
    assert (late.kind, late.sequence, late.partition) == ("out of order", 2, "s1")


def test_one_offset_with_two_messages_is_two_histories() -> None:
    h = clean()
    h.consume("orders", "h", "c", 1, partition="s1", offset=5)  # a cut tail written over
    kinds = {f.kind for f in h.check({"orders": []}).findings}
    assert kinds == {"two histories"}


def test_a_refused_message_that_is_delivered_and_two_masters_in_one_epoch() -> None:
    h = History()
    h.publish("t", "p", 1, "failed")
    h.consume("t", "g", "p", 1)
    h.publish("t", "p", 2, partition="grp", offset=0, server="s1", epoch=3)
    h.publish("t", "p", 3, partition="grp", offset=1, server="s2", epoch=3)
    h.publish("t", "p", 4, partition="grp", offset=2, server="s2", epoch=4)
    report = h.check({"t": []})
    assert [f.kind for f in report.findings] == ["delivered though refused",
                                                 "two masters in one epoch"]
    assert report.findings[1].detail == "grp: epoch 3 acknowledged by s1, s2"


def test_a_history_round_trips_through_json_lines_and_bad_lines_are_named() -> None:
    out = io.StringIO()
    clean().write(out)
    again = History.read(out.getvalue().splitlines())
    assert again.operations == clean().operations
    for line, says in ((b'{"op": "publish"}', "line 2: a publish needs 'topic'"),
                       (b'[1]', "line 2: not a JSON object"),
                       (b'{"op": "send"}', "line 2: 'op' is one of publish, consume, ack"),
                       (b'{"op": "ack", "topic": "t", "group": "g", "offset": "1"}',
                        "line 2: 'offset' is an int, not '1'"),
                       (b'{"op": "publish", "topic": "t", "producer": "p", "sequence": 1, '
                        b'"status": "maybe"}', "line 2: a publish's status is one of"),
                       (b'{"op": "ack", "topic": "t", "group": "g", "offset": 1, "x": 1}',
                        "line 2: a ack has no field 'x'")):
        with pytest.raises(HistoryError) as caught:
            History.read(["", line.decode()])
        assert str(caught.value).startswith(says), caught.value


class _Model:
    """An at-least-once queue that keeps its promises: partitions that append in order
    and drop a retried publish they hold (by producer and sequence), publishes whose
    answer is lost (stored or not), retries to another partition, one group whose
    consumers lose their links (what they held comes again) and ack."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.history = History()
        self.logs: dict[str, list[tuple[str, int]]] = {"s1": [], "s2": []}
        self.read = {"s1": 0, "s2": 0}
        self.held: list[tuple[str, int]] = []  # (partition, offset) delivered, not acked
        self.again: list[tuple[str, int]] = []  # held by a lost link: delivered again
        self.sequence = {"a": 0, "b": 0}

    def store(self, partition: str, key: tuple[str, int]) -> int:
        log = self.logs[partition]
        if key in log:
            return log.index(key)
        log.append(key)
        return len(log) - 1

    def publish(self, producer: str) -> None:
        self.sequence[producer] += 1
        key = (producer, self.sequence[producer])
        partition = self.rng.choice(sorted(self.logs))
        for _ in range(3):  # the producer retries a publish with no answer
            fate = self.rng.random()
            if fate < 0.1:
                self.history.publish("t", *key, "failed")
                return
            if fate < 0.3:  # the answer is lost; stored or not
                if self.rng.random() < 0.5:
                    self.store(partition, key)
                self.history.publish("t", *key, "unknown")
                if self.rng.random() < 0.5:
                    partition = self.rng.choice(sorted(self.logs))
                continue
            offset = self.store(partition, key)
            self.history.publish("t", *key, partition=partition, offset=offset)
            return

    def deliver(self) -> None:
        partition = self.rng.choice(sorted(self.logs))
        if self.again:
            partition, offset = self.again.pop(0)
        elif self.read[partition] < len(self.logs[partition]):
            offset = self.read[partition]
            self.read[partition] += 1
        else:
            return
        self.held.append((partition, offset))
        producer, sequence = self.logs[partition][offset]
        self.history.consume("t", "g", producer, sequence, partition=partition,
                             offset=offset)

    def ack(self) -> None:
        if self.held:
            partition, offset = self.held.pop(self.rng.randrange(len(self.held)))
            self.history.ack("t", "g", offset, partition=partition)

    def link_lost(self) -> None:
        self.again += self.held  # unacknowledged: delivered again
        self.held.clear()

    def run(self, steps: int) -> History:
        actions = [lambda: self.publish("a"), lambda: self.publish("b"), self.deliver,
                   self.deliver, self.ack, self.ack, self.link_lost]
        for _ in range(steps):
            self.rng.choice(actions)()
        while any(self.read[p] < len(log) for p, log in self.logs.items()) or (
                self.held or self.again):
            self.deliver()
            self.ack()
        return self.history


@given(st.integers(0, 2**32 - 1))
def test_histories_of_a_queue_that_keeps_its_promises_pass(seed: int) -> None:
    history = _Model(random.Random(seed)).run(200)
    report = history.check({"t": ["g"]}, idempotent=True)
    assert report.ok, report.findings[:3]
    # and the checker sees the loss of any acknowledged message
    acked = [op for op in history if isinstance(op, Published) and op.status == "ok"]
    if acked:
        gone = acked[len(acked) // 2]
        kept = [op for op in history if not (isinstance(op, Consumed) and (
            op.producer, op.sequence) == (gone.producer, gone.sequence))]
        (lost,) = check_history(kept, {"t": ["g"]}, idempotent=True).findings
        assert (lost.kind, lost.producer, lost.sequence) == ("lost", gone.producer,
                                                             gone.sequence)


def test_the_report_is_json() -> None:
    h = clean()
    h.publish("orders", "a", 4, partition="s1", offset=6)
    row = json.loads(json.dumps(h.check().to_dict()))
    assert row["ok"] is False and row["counts"]["lost"] == 1
    assert row["findings"][0]["kind"] == "lost"


def test_mq_check_history_exits_0_clean_1_with_findings_and_one_line_for_a_bad_file(
        tmp_path: pathlib.Path) -> None:
    from typer.testing import CliRunner

    from rdvpump.cli import app

    runner = CliRunner()
    path = tmp_path / "history.jsonl"
    with open(path, "w") as out:
        clean().write(out)
    ok = runner.invoke(app, ["mq", "check-history", str(path), "--idempotent"])
    assert ok.exit_code == 0 and "6 messages (6 acknowledged), 7 deliveries: clean" in ok.output
    with open(path, "a") as out:
        out.write('{"op": "publish", "topic": "orders", "producer": "a", "sequence": 9}\n')
    lost = runner.invoke(app, ["mq", "check-history", str(path)])
    assert lost.exit_code == 1
    assert "lost: orders: a#9 was acknowledged and g never received it" in lost.output
    named = runner.invoke(app, ["mq", "check-history", str(path), "--json",
                                "--group", "orders=g", "--group", "orders=audit"])
    assert named.exit_code == 1 and json.loads(named.output)["counts"]["lost"] == 1 + 7
    bad = runner.invoke(app, ["mq", "check-history", str(path), "--group", "orders"])
    assert bad.exit_code == 1
    assert bad.output.strip() == "error: --group takes TOPIC=GROUP, not 'orders'"
    path.write_bytes(b"\xff\xfe not json\n")
    broken = runner.invoke(app, ["mq", "check-history", str(path)])
    assert broken.exit_code == 1 and broken.output.startswith("error: line 1: not JSON")
    assert len(broken.output.strip().splitlines()) == 1
    missing = runner.invoke(app, ["mq", "check-history", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 1 and "none.jsonl" in missing.output
