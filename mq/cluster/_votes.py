"""What a cluster server keeps across restarts: its epoch, its ballot and the cluster
state, in one file written durably before a peer hears any of them (a server that
restarts must not vote twice in one epoch, nor take over with an empty state while the
others that held it are down)."""

from __future__ import annotations

import json
from pathlib import Path

from brokermgr import EpochError, check_epoch
from pump import ConfigError

from ..storage._files import write_file
from ._root import Ballot
from ._state import ClusterState, StateError

__all__ = ["keep_votes", "load_votes"]


def load_votes(path: Path) -> tuple[int, Ballot, ClusterState]:
    """The epoch, ballot and cluster state a server kept (0, no ballot and an empty state
    if it kept none)."""
    try:
        kept = json.loads(path.read_bytes())
        vote, epoch = kept["ballot"]
        state = kept.get("state")
        return check_epoch(kept["epoch"], "its epoch"), (
            vote if isinstance(vote, str) else None, check_epoch(epoch, "its ballot's epoch")), (
            ClusterState() if state is None else ClusterState.of(
                int(state["version"]), state["topics"],
                check_epoch(state["state_epoch"], "its state's epoch"), state.get("removed")))
    except FileNotFoundError:
        return 0, (None, 0), ClusterState()
    except EpochError as exc:
        raise ConfigError(f"{path}: {exc}: no server writes that; to repair, stop this "
                          f"server and remove the file: it comes back with no vote and "
                          f"takes its peers' epoch and state") from None
    except (OSError, ValueError, KeyError, TypeError, StateError) as exc:
        raise ConfigError(f"{path}: the cluster's epoch, vote and state cannot be read "
                          f"({exc}); remove the file only if this server never voted") from None


def keep_votes(path: Path, epoch: int, ballot: Ballot, state: ClusterState) -> None:
    """The epoch, ballot and cluster state to ``path``, durably."""
    write_file(path, json.dumps({"epoch": epoch, "ballot": list(ballot),
                                 "state": state.snapshot()}).encode())
