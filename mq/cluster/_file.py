"""A cluster file: the configuration every server of a cluster reads.

::

    [cluster]
    name = "shop"                 # like a vhost: a server of another cluster is refused
    heartbeat = 0.1               # optional: seconds between beats on each link
    silence = 0.5                 # optional: seconds unheard before a peer counts as gone

    [[server]]
    id = "a"                      # its broker id in the universe
    address = "127.0.0.1:9901"    # where its process listens
    type = "primary"              # primary, backup or fanout

The order of the servers is their seniority (the first is the most senior).  The
configuration's checksum (CRC-32 of its canonical JSON: the name, then each server's
id, address and type, in order; then the heartbeat and silence, unless both are the
defaults) stands for the whole list, as OpenAMQ's clusters did: two servers agree on
the cluster only if their checksums are equal.
"""

from __future__ import annotations

import json
import tomllib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pump import ConfigError
from rdv import Address

__all__ = ["SERVER_TYPES", "ClusterConfig", "ClusterServer", "load_cluster", "parse_cluster"]

SERVER_TYPES = ("primary", "backup", "fanout")
#: Seconds between heartbeats on each link a server dialled, by default.
HEARTBEAT = 0.1
#: Seconds a peer may go unheard before it counts as gone, its links open or not (a
#: process stopped, a host cut off without a reset), by default: it no longer counts for
#: the root's rule, a root that is silent is replaced, and a second link that says it
#: comes from that peer may replace its link.  Heard is a beat on its link in or an
#: answer on ours out: two TCP connections, each stalled by a lost segment until it is
#: sent again.  Measured over 24,000 beats 0.1 s apart on links of 50 +/- 20 ms with 2 %
#: loss, a gap of 0.5 s or more came once in 300 s of a link (the longest 0.64 s), so
#: both links of a peer at once about once in a day, and a root is replaced only when a
#: majority of the primaries count it out; five beats, so that a process the machine is
#: slow to schedule for a moment is not counted out either; a member that returns is
#: counted in again at its next beat.
SILENCE = 0.5


@dataclass(frozen=True)
class ClusterServer:
    id: str
    address: str
    type: str


@dataclass(frozen=True)
class ClusterConfig:
    """A cluster's name and its servers, most senior first."""

    name: str
    servers: tuple[ClusterServer, ...]
    #: Seconds between beats on each link, and unheard before a peer counts as gone.
    heartbeat: float = HEARTBEAT
    silence: float = SILENCE

    @property
    def checksum(self) -> int:
        fields: list[Any] = [self.name, [[s.id, s.address, s.type] for s in self.servers]]
        if (self.heartbeat, self.silence) != (HEARTBEAT, SILENCE):
            fields.append([self.heartbeat, self.silence])
        canonical = json.dumps(fields, separators=(",", ":"))
        return zlib.crc32(canonical.encode())

    def server(self, server_id: str) -> ClusterServer | None:
        return next((s for s in self.servers if s.id == server_id), None)

    def peers(self, me: str) -> list[ClusterServer]:
        return [s for s in self.servers if s.id != me]


def parse_cluster(data: Mapping[str, Any], where: str = "cluster") -> ClusterConfig:
    """A configuration from a cluster file's tables; :class:`ConfigError` naming the
    field of the first problem."""
    unknown = set(data) - {"cluster", "server"}
    if unknown:
        raise ConfigError(f"{where}: unknown table {sorted(unknown)[0]!r} (a cluster file "
                          f"has [cluster] and [[server]])")
    table = data.get("cluster")
    if table is None:
        raise ConfigError(f"{where}: no [cluster] table: it names the cluster")
    if not isinstance(table, dict) or set(table) - {"name", "heartbeat", "silence"}:
        raise ConfigError(f"{where}: [cluster] takes name, and optionally heartbeat and "
                          f"silence")
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: [cluster] name must be a non-empty string")
    timing = {}
    for key, default in (("heartbeat", HEARTBEAT), ("silence", SILENCE)):
        value = table.get(key, default)
        if type(value) not in (int, float) or not 0 < value < 86400:
            raise ConfigError(f"{where}: [cluster] {key} must be seconds, above 0 and "
                              f"below a day, got {value!r}")
        timing[key] = float(value)
    if not timing["silence"] >= 2 * timing["heartbeat"]:
        raise ConfigError(f"{where}: [cluster] silence ({timing['silence']:g} s) must be at "
                          f"least two heartbeats ({timing['heartbeat']:g} s each)")
    rows = data.get("server")
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{where}: no [[server]]: a cluster needs at least one")
    servers: list[ClusterServer] = []
    for i, row in enumerate(rows):
        at = f"{where}: server {i + 1}"
        if not isinstance(row, dict) or set(row) != {"id", "address", "type"}:
            raise ConfigError(f"{at}: takes id, address and type, got "
                              f"{sorted(row) if isinstance(row, dict) else row!r}")
        for key in ("id", "address", "type"):
            if not isinstance(row[key], str) or not row[key]:
                raise ConfigError(f"{at}: {key} must be a non-empty string")
        if row["id"].startswith("@"):
            raise ConfigError(f"{at}: id {row['id']!r}: ids starting with @ are the "
                              f"universe's own")
        if row["type"] not in SERVER_TYPES:
            raise ConfigError(f"{at}: type must be one of {', '.join(SERVER_TYPES)}, got "
                              f"{row['type']!r}")
        try:  # the one parser of addresses; a port the others dial, so not 0
            listen: Address | None = Address.parse(row["address"])
        except ConfigError:
            listen = None
        if listen is None or listen.port == 0:
            raise ConfigError(f"{at}: address must be HOST:PORT, with a port 1-65535, got "
                              f"{row['address']!r}")
        if any(s.id == row["id"] for s in servers):
            raise ConfigError(f"{at}: id {row['id']!r} is listed twice")
        servers.append(ClusterServer(row["id"], row["address"], row["type"]))
    if not any(s.type == "primary" for s in servers):
        raise ConfigError(f"{where}: no primary server: the root is elected among them")
    return ClusterConfig(name, tuple(servers), **timing)


def load_cluster(path: str | Path) -> ClusterConfig:
    """Read a cluster file; :class:`ConfigError` (the file and the field) if it is not
    one."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the cluster file: "
                          f"{exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not TOML: {exc}") from None
    return parse_cluster(data, str(path))
