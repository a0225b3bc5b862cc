"""A cluster file: the configuration every server of a cluster reads.

::

    [cluster]
    name = "shop"                 # like a vhost: a server of another cluster is refused

    [[server]]
    id = "a"                      # its broker id in the universe
    address = "127.0.0.1:9901"    # where its process listens
    type = "primary"              # primary, backup or fanout

The order of the servers is their seniority (the first is the most senior).  The
configuration's checksum (CRC-32 of its canonical JSON: the name, then each server's
id, address and type, in order) stands for the whole list, as OpenAMQ's clusters did:
two servers agree on the cluster only if their checksums are equal.
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

__all__ = ["SERVER_TYPES", "ClusterConfig", "ClusterServer", "load_cluster", "parse_cluster"]

SERVER_TYPES = ("primary", "backup", "fanout")


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

    @property
    def checksum(self) -> int:
        canonical = json.dumps([self.name, [[s.id, s.address, s.type] for s in self.servers]],
                               separators=(",", ":"))
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
    if not isinstance(table, dict) or set(table) - {"name"}:
        raise ConfigError(f"{where}: [cluster] takes one key, name")
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: [cluster] name must be a non-empty string")
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
        host, _, port = row["address"].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{at}: address must be HOST:PORT, got {row['address']!r}")
        if any(s.id == row["id"] for s in servers):
            raise ConfigError(f"{at}: id {row['id']!r} is listed twice")
        servers.append(ClusterServer(row["id"], row["address"], row["type"]))
    if not any(s.type == "primary" for s in servers):
        raise ConfigError(f"{where}: no primary server: the root is elected among them")
    return ClusterConfig(name, tuple(servers))


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
