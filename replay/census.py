"""The census of the traces, added up in the driver: files, pumps, runs, clocks, the
streams of messages (run, link, direction) and their numbers, the life of every link,
refusals.

The engines count (:func:`replay.fold.census`, one small row per pump, kind, stream and
link event of each table of rows); :class:`Census` adds the rows up and answers what the
second pass (:mod:`replay.measure`) and the output (:mod:`replay.output`) ask of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pump import schema as _schema
from replay import fold as _fold
from replay.sources import OLDER, SCHEMA_VERSION, TraceError

Kind, Outcome, Cause = _schema.Kind, _schema.Outcome, _schema.Cause


def is_service(*brokers: str | None) -> bool:
    """The name service's own brokers (the manager, a process's name client, trackers)
    have ids that start with "@"; a link with one at either end is theirs."""
    return any(b is not None and b.startswith("@") for b in brokers)


class Census:
    """What the census aggregation says, in the driver: files, pumps, clocks, streams,
    the life of every link, refusals."""

    def __init__(self, rows: list[Any]) -> None:
        good = [r for r in rows if not r["bad"]]
        self.corrupt = sum(r["n"] for r in rows if r["bad"])
        self.versions = sorted({r["v"] for r in good})
        self.kinds: dict[str, int] = {}
        for r in good:
            self.kinds[r["kind"]] = self.kinds.get(r["kind"], 0) + r["n"]
        self.pumps = sorted({r["pump"] for r in good if r["pump"] is not None})
        self.runs = sorted({r["run"] for r in good if r["run"] is not None})
        self._axes(good)
        self.refusals: dict[str, int] = {}
        self.service_refusals: dict[str, int] = {}
        for r in good:
            if r["kind"] == Kind.REFUSE and r["outcome"] != Outcome.INBOUND:
                reason = r["reason"] or "?"
                into = self.service_refusals if is_service(r["broker"], r["peer"]) \
                    else self.refusals
                into[reason] = into.get(reason, 0) + r["n"]
        self._streams(good)
        self.links: dict[tuple[str, str], dict[str, Any]] = {}
        for r in sorted(good, key=lambda r: (r["t0"] + self.offset(r), str(r["reason"]))):
            if r["link"] is None:
                continue
            link = self.links.setdefault((r["run"], r["link"]), _new_link())
            link["pumps"].add(r["pump"])
            if r["kind"] in _schema.MESSAGE_KINDS:
                self._message(r, link)
            else:
                self._life(r, link)
        self._connects(good)
        self.service_links = {key for key, life in self.links.items() if is_service(
            life["acceptor"] or key[1].rsplit("/", 1)[0], life["connector"])}
        sends = [r for r in good if r["kind"] == Kind.SEND]
        self.sent_sizes = None if not sends else {
            "min": min(r["min_size"] for r in sends),
            "mean": sum(r["bytes"] for r in sends) / sum(r["n"] for r in sends),
            "max": max(r["max_size"] for r in sends)}

    def _axes(self, good: list[Any]) -> None:
        """Each run's time axis: its pumps' clocks mapped, from its first event."""
        # The last clock event of each served pump maps its time to the machine's
        # monotonic clock; pumps without one keep their own time.
        latest: dict[tuple[str, str], tuple[float, float]] = {}
        for r in good:
            if r["kind"] == Kind.CLOCK and r["clock"] is not None:
                key = (r["run"], r["pump"])
                if key not in latest or (r["t1"], r["clock"]) > latest[key]:
                    latest[key] = (r["t1"], r["clock"])
        clocks = {key: clock for key, (_, clock) in latest.items()}
        # Each run on its own time axis, from its first event: runs of one directory may
        # have been recorded hours apart, or one on the virtual clock and one on the real.
        spans: dict[str | None, list[float]] = {}
        for r in good:
            if r["t0"] is not None:
                shift = clocks.get((r["run"], r["pump"]), 0.0)
                span = spans.setdefault(r["run"], [r["t0"] + shift, r["t1"] + shift])
                span[0], span[1] = min(span[0], r["t0"] + shift), max(span[1], r["t1"] + shift)
        self.offsets = {(r["run"], r["pump"]): clocks.get((r["run"], r["pump"]), 0.0)
                        - spans[r["run"]][0] for r in good if r["run"] in spans}
        #: Each run's clock (``real`` when a pump of it mapped its time to the machine's
        #: clock, else ``virtual``) and duration.
        self.run_clocks = {run: "real" if any(key[0] == run for key in clocks) else "virtual"
                           for run in spans}
        self.run_durations = {run: b - a for run, (a, b) in spans.items()}
        self.start = 0.0
        self.duration = max(self.run_durations.values(), default=0.0)

    def _streams(self, good: list[Any]) -> None:
        self.streams: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: Each stream (run, link, dir) of the messages by its number (``sid``), and its
        #: messages (rows) and least and greatest seq, for the fold's pieces.
        seen: dict[tuple[str, str, str], list[Any]] = {}
        for r in good:
            if r["kind"] in _schema.MESSAGE_KINDS:
                cell = seen.setdefault((r["run"], r["link"], r["dir"]), [0, None, None])
                cell[0] += r["n"]
                cell[1] = _fold.smaller(cell[1], r["min_seq"])
                cell[2] = _fold.larger(cell[2], r["max_seq"])
        ordered = sorted(seen, key=lambda s: tuple((x is not None, x or "") for x in s))
        self.sids: dict[int, tuple[str, str, str]] = dict(enumerate(ordered))
        self.sid_of = {stream: sid for sid, stream in self.sids.items()}
        self.loads, self.lows, self.highs = ([seen[stream][i] for stream in ordered]
                                             for i in range(3))

    def stream_of(self, row: Any) -> tuple[str, str, str]:
        """(run, link, dir) of a row of the fold, keyed by ``sid``."""
        return self.sids[row["sid"]]

    def offset(self, row: Any) -> float:
        return self.offsets.get((row["run"], row["pump"]), 0.0)

    def _message(self, r: Any, link: dict[str, Any]) -> None:
        stream = self.streams.setdefault((r["run"], r["link"], r["dir"]), {
            "sender": None, "receiver": None, "send_pumps": set(), "deliver_pumps": set(),
            "sent": 0, "delivered": 0})
        stream["sent" if r["kind"] == Kind.SEND else "delivered"] += r["n"]
        if r["kind"] == Kind.SEND:
            stream["sender"] = min(filter(None, (stream["sender"], r["broker"])), default=None)
            stream["send_pumps"].add(r["pump"])
            if r["dir"] in ("ca", "ac"):  # the links table counts the two directions
                link["sent_" + r["dir"]] += r["n"]
        else:
            stream["receiver"] = min(filter(None, (stream["receiver"], r["broker"])),
                                     default=None)
            stream["deliver_pumps"].add(r["pump"])
            link["delivered"] += r["n"]
            link["bytes_delivered"] += r["bytes"] or 0

    def _connects(self, good: list[Any]) -> None:
        """Each accepted link's connect: the connector's last connect to that broker and
        port at or before the accept."""
        tried: dict[tuple[str, str, str, int], list[float]] = {}
        for r in good:
            if r["kind"] == Kind.CONNECT and r["connect_time"] is not None:
                tried.setdefault((r["run"], r["broker"], r["peer"], r["port"]), []).append(
                    r["connect_time"] + self.offset(r))
        for (run, _), link in self.links.items():
            if link["accepted_at"] is None:
                continue
            times = tried.get((run, link["connector"], link["acceptor"], link["port"]), [])
            before = [t for t in times if t <= link["accepted_at"]]
            link["connected_at"] = max(before) if before else None

    def _life(self, r: Any, link: dict[str, Any]) -> None:
        """Rows come in time order (then by reason): the first one seen wins."""
        at = r["t0"] + self.offset(r)
        kind = r["kind"]
        if kind == Kind.ACCEPT and link["accepted_at"] is None:
            link.update(accepted_at=at, acceptor=r["broker"], connector=r["peer"],
                        port=r["port"])
        if kind == Kind.DISCONNECT and link["disconnected_at"] is None:
            link.update(disconnected_at=at, disconnect_reason=r["reason"])
        if kind == Kind.CLOSE and r["reason"] is not None:
            link["close_reasons"].add(r["reason"])
        if kind in _schema.END_KINDS:
            link["ended_at"] = at if link["ended_at"] is None else link["ended_at"]
            if link["end_reason"] is None:
                link["end_reason"] = r["reason"]
            if kind in (Kind.FAIL, Kind.PROTOCOL_ERROR) or (
                    kind == Kind.DISCONNECT and r["outcome"] != Outcome.CLEAN):
                link["failed"] = True

    def check(self, traces: str, other_versions: Callable[[], list[tuple[str, int]]]
              ) -> None:
        """Raise :class:`TraceError` for rows of another schema version (naming their
        files, from ``other_versions``: a second pass, only then) or for no events at
        all."""
        if any(v != SCHEMA_VERSION for v in self.versions):
            other = other_versions()
            listing = "; ".join(f"{f} has version {v}" for f, v in other[:5])
            raise TraceError(f"trace schema version {SCHEMA_VERSION} expected: {listing}"
                             + (OLDER if any(v < SCHEMA_VERSION for _, v in other) else ""))
        if not self.kinds:
            if self.corrupt:
                raise TraceError(f"no trace events in {traces}: none of its {self.corrupt} "
                                 "lines is a trace row (a JSON object with 'v', 'kind' and "
                                 "the fields of pump/schema.py); is it a trace?")
            raise TraceError(f"the traces in {traces} hold no events")

    def cause(self, run: str, link: str) -> tuple[str, str | None]:
        """Why a message sent on this link may not have arrived, and the link's end."""
        life = self.links.get((run, link))
        if life is not None and life["failed"]:
            return Cause.PEER_FAILED, life["end_reason"]
        if life is not None and life["end_reason"] is not None:
            return Cause.IN_FLIGHT, life["end_reason"]
        return Cause.RUN_ENDED, None

    def stream_ends(self) -> dict[int, tuple[str | None, str, str | None, bool]]:
        """Each stream's sender, the cause of an undelivered message on it, the end of its
        link and whether the link is the name service's, by ``sid``."""
        return {self.sid_of[(run, link, d)]: (s["sender"], *self.cause(run, link),
                                              (run, link) in self.service_links)
                for (run, link, d), s in self.streams.items() if (run, link, d) in self.sid_of}

    def crosses_pumps(self, key: tuple[str, str, str]) -> bool:
        s = self.streams.get(key)
        return s is not None and bool(s["send_pumps"]) and bool(s["deliver_pumps"]) \
            and s["send_pumps"] != s["deliver_pumps"]


def _new_link() -> dict[str, Any]:
    return {"connected_at": None, "accepted_at": None, "acceptor": None, "connector": None,
            "port": None,
            "sent_ca": 0, "sent_ac": 0, "delivered": 0, "bytes_delivered": 0,
            "disconnected_at": None, "disconnect_reason": None, "close_reasons": set(),
            "ended_at": None, "end_reason": None, "failed": False, "pumps": set()}
