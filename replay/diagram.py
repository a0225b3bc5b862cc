"""Mermaid sequence diagrams of a link's life (or of a broker's connect attempts), from a trace.

Plain Python, no Spark: it reads one trace file (JSON Lines, or Parquet with
pyarrow).  The example diagrams in docs/diagrams/ are drawn with it from
scenarios that :mod:`rdvpump.diagrams` runs (``python -m rdvpump.diagrams``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pump import RdvpumpError
from pump.schema import Kind, Outcome

#: Events drawn one by one per kind (send, deliver, write, read) and direction before the
#: rest is counted in one note, where the cut is.
EVENTS_SHOWN = 3


class DiagramError(RdvpumpError, ValueError):
    """The diagram cannot be drawn from this trace."""


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The rows of one trace file, in pump order (step, then position in the file)."""
    p = Path(path)
    if not p.is_file():
        raise DiagramError(f"no such trace file: {p}")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows: list[dict[str, Any]] = pq.read_table(p).to_pylist()
    else:
        rows = []
        with p.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DiagramError(f"{p}:{n}: not JSON: {exc}") from None
    for i, row in enumerate(rows):
        row["_ord"] = i
    rows.sort(key=lambda r: (r.get("step", 0), r["_ord"]))
    return rows


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _text(value: Any) -> str:
    return str(value).replace(";", ",").replace("#", "no. ").replace("\n", " ")


def link_diagram(events: list[dict[str, Any]], link: str,
                 most: int | None = EVENTS_SHOWN) -> str:
    """The life of one link: bind, connect, accept, bytes and messages, disconnect, close.

    Of each kind of repeated event (send, deliver, write, read) per direction, the first
    ``most`` are drawn, then one note "... and N more" where the rest begins (``most``
    None: every event).
    """
    mine = [e for e in events if e.get("link") == link]
    accept = next((e for e in mine if e["kind"] == Kind.ACCEPT), None)
    if accept is None:
        known = sorted({e["link"] for e in events if e.get("kind") == Kind.ACCEPT})
        raise DiagramError(f"no accept of link {link!r} in this trace"
                           + (f"; links: {', '.join(known)}" if known else ""))
    acceptor, connector, port = accept["broker"], accept["peer"], accept["port"]
    ends = {"ca": (connector, acceptor), "ac": (acceptor, connector)}
    lines = ["sequenceDiagram", f"    title link {link}: {connector} to {acceptor}:{port}",
             f"    participant {_ident(connector)} as {connector}",
             "    participant rdv as rendezvous",
             f"    participant {_ident(acceptor)} as {acceptor}"]
    for e in events:  # the acceptor's bind and the connect, before the link existed
        if e is accept:
            break
        if e["kind"] in (Kind.BIND, Kind.LISTEN) and e.get("broker") == acceptor and \
                e.get("port") == port:
            lines.append(f"    {_ident(acceptor)}->>rdv: {e['kind']}({port})")
        elif e["kind"] == Kind.CONNECT and e.get("broker") == connector and \
                e.get("peer") == acceptor and e.get("port") == port:
            lines.append(f"    {_ident(connector)}->>rdv: connect({acceptor}, {port})")
    lines.append(f"    rdv->>{_ident(acceptor)}: accepted (link {link})")
    lines.append(f"    rdv->>{_ident(connector)}: connected (link {link})")
    shown: dict[tuple[str, str], int] = {}
    hidden: dict[tuple[str, str], list[int]] = {}  # where the note goes, how many
    for e in mine:
        kind, d = e["kind"], e.get("dir")
        if kind in (Kind.SEND, Kind.DELIVER, Kind.WRITE, Kind.READ) and d in ends:
            if most is not None and shown.get((kind, d), 0) >= most:
                cut = hidden.setdefault((kind, d), [len(lines), 0])
                if cut[1] == 0:
                    lines.append("")  # the note, once the count is known
                cut[1] += 1
                continue
            shown[(kind, d)] = shown.get((kind, d), 0) + 1
        if (line := _event_line(e, ends, acceptor, connector)) is not None:
            lines.append(line)
    for (kind, d), (at, n) in hidden.items():
        src, dst = ends[d]
        who = src if kind in (Kind.SEND, Kind.WRITE) else dst
        lines[at] = (f"    Note over {_ident(who)}: ... and {n} more {kind} events "
                     f"{src} to {dst}")
    return "\n".join(lines) + "\n"


def _event_line(e: dict[str, Any], ends: dict[str, tuple[str, str]], acceptor: str,
                connector: str) -> str | None:
    """The diagram's line for one event of the link (None: not drawn)."""
    kind, d = e["kind"], e.get("dir")
    side = _ident(e.get("broker") or "")
    if kind in (Kind.SEND, Kind.DELIVER) and d in ends:
        src, dst = ends[d]
        if kind == Kind.SEND:
            return f"    Note over {_ident(src)}: send message {e['seq']} ({e['size']} B)"
        return f"    Note over {_ident(dst)}: deliver message {e['seq']} ({e['size']} B)"
    if kind == Kind.WRITE and d in ends:
        src, dst = ends[d]
        partial = e.get("outcome") == Outcome.PARTIAL
        arrow = "-)" if partial else "->>"
        what = f"write {e['size']} B" + (" (partial: the ring is full)" if partial else "")
        return f"    {_ident(src)}{arrow}{_ident(dst)}: {what}"
    if kind == Kind.READ and d in ends:
        return (f"    Note over {_ident(ends[d][1])}: read {e['size']} B"
                + (" (a partial frame)" if e.get("outcome") == Outcome.PARTIAL else ""))
    if kind == Kind.DISCONNECT:
        other = acceptor if e.get("broker") == connector else connector
        return f"    {side}--x{_ident(other)}: disconnect: {_text(e.get('reason') or '')}"
    if kind == Kind.CLOSE:
        return f"    Note over {side}: closed: {_text(e.get('reason') or '')}"
    if kind in (Kind.PROTOCOL_ERROR, Kind.FAIL):
        return f"    Note over {side}: {kind}: {_text(e.get('reason') or '')}"
    return None


def connect_diagram(events: list[dict[str, Any]], broker: str) -> str:
    """Every connect attempt of ``broker``: accepted ones and refused ones with the reason."""
    lines = ["sequenceDiagram", f"    title connects of {broker}",
             f"    participant {_ident(broker)} as {broker}", "    participant rdv as rendezvous"]
    seen = False
    for e in events:
        if e.get("kind") in (Kind.BIND, Kind.LISTEN, Kind.UNBIND) and e.get("broker") != broker:
            lines.append(f"    Note over rdv: {e['broker']}: {e['kind']}({e['port']})")
        if e.get("broker") != broker and not (e.get("kind") == Kind.ACCEPT
                                              and e.get("peer") == broker):
            continue
        if e["kind"] == Kind.CONNECT:
            seen = True
            lines.append(f"    {_ident(broker)}->>rdv: connect({e['peer']}, {e['port']})")
        elif e["kind"] == Kind.REFUSE and e.get("outcome") != "inbound":
            lines.append(f"    rdv--x{_ident(broker)}: refused: {_text(e.get('reason'))}")
        elif e["kind"] == Kind.ACCEPT:
            lines.append(f"    rdv->>{_ident(broker)}: connected (link {e['link']})")
    if not seen:
        raise DiagramError(f"no connect by {broker!r} in this trace")
    return "\n".join(lines) + "\n"
