"""What an operator asks of a running universe, from a process of its own: the status
(``rdvpump status``), a topic or group declared (``rdvpump mq declare``) and a group's
master switched (``rdvpump mq failover``).  The CLI and the console call these and
nothing else, so the console changes a universe only as the CLI does.  Each dials, asks,
and closes its link cleanly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from brokermgr import NameClient
from brokermgr.tracking import DEFAULT_TRACK_PORT
from rdv import Address, Refusal, is_final, tls_contexts

from . import mqtool
from ._dial import refusal_text, tool_universe

TLSFiles = tuple[str, str, str | None]  # certificate, key, CA (None: system roots)


def tls_arguments(tls: TLSFiles | None) -> dict[str, Any]:
    """BrokerManager's TLS arguments for these files (none: plain TCP)."""
    if tls is None:
        return {}
    server, client = tls_contexts(*tls)
    return {"tls_server": server, "tls_client": client}


async def query_status(universe: str, manager_address: Address, *, token: str = "",
                       identity: str | None = None, timeout: float = 5.0,
                       tls: TLSFiles | None = None, wait: Sequence[str] = ()
                       ) -> list[dict[str, object]]:
    """The broker list of one manager; OSError when it cannot be reached or refuses us.

    With ``wait`` (broker ids), a manager that is still starting is dialled again and the
    list asked again until it holds every one of them, for up to ``timeout`` seconds;
    OSError names those still missing."""
    where = f"manager {manager_address[0]}:{manager_address[1]}"
    brokers: list[dict[str, object]] | None = None
    async with tool_universe(universe, name="status", token=token, identity=identity,
                             **tls_arguments(tls)) as manager:
        names = NameClient(manager, [manager_address], retry=_WAIT_POLL if wait else timeout)
        link = names.links[0]
        names.start()
        with trio.move_on_after(timeout):
            while link.queue is None:
                if link.last_refusal is not None and (not wait or is_final(
                        link.last_refusal)):
                    break
                await link.attempted()
            while link.queue is not None:
                brokers = await names.list()
                listed = {str(b["id"]) for b in brokers or ()}
                if brokers is None or all(w in listed for w in wait):
                    break
                await trio.sleep(_WAIT_POLL)
        await names.aclose()  # a clean close: the manager hears why, not a lost connection
    if link.queue is None and brokers is None:
        raise OSError(_refused(where, link.last_refusal))
    if brokers is None:
        raise OSError(f"{where} did not answer")
    missing = [w for w in wait if w not in {str(b["id"]) for b in brokers}]
    if missing:
        raise OSError(f"{where}: {', '.join(missing)} not registered within {timeout} s")
    return brokers


def _refused(where: str, refusal: object) -> str:
    """Why a manager could not be asked: a process that answers without a manager (a
    broker process's address given for the manager's) says so in those words."""
    if getattr(refusal, "refusal", None) == Refusal.UNKNOWN_BROKER:
        return (f"no {where}: the process there answers, but runs no manager (is it a "
                f"broker process's address?)")
    return refusal_text(where, refusal or "timed out", "manager")


#: How often ``status --wait`` dials a manager that is starting, and asks its list again.
_WAIT_POLL = 0.1


def master_switched(group: str, info: dict[str, Any]) -> str:
    """What ``rdvpump mq failover`` (and the console's) says once the member took over."""
    return f"group {group}: {info['master']} is master at epoch {info['epoch']}"


async def switch_master(universe: str, manager_address: Address, group: str, to: str, *,
                        token: str = "", identity: str | None = None, timeout: float = 5.0,
                        tls: TLSFiles | None = None) -> dict[str, Any]:
    """``rdvpump mq failover``: member ``to`` of ``group`` is its master at the next
    epoch, per the manager at ``manager_address``, and has taken over (its group's reply
    once the member says it is master, within ``timeout``); ServiceError when the manager
    refuses (with the reason), OSError when it cannot be reached or the member does not
    take over in time."""
    where = f"manager {manager_address[0]}:{manager_address[1]}"
    async with tool_universe(universe, name="failover", token=token, identity=identity,
                             **tls_arguments(tls)) as manager:
        names = NameClient(manager, [manager_address], retry=timeout)
        link = names.links[0]
        names.start()
        try:
            with trio.move_on_after(timeout) as waited:
                while link.queue is None and link.last_refusal is None:
                    await link.attempted()
                if link.queue is None:
                    raise OSError(_refused(where, link.last_refusal))
                info = await names.failover(group, to)
                master = info["master"]
                while not any(m["broker"] == master and m["role"] == "master"
                              and m["epoch"] == info["epoch"] for m in info["members"]):
                    await trio.sleep(_WAIT_POLL)  # the member's next registration
                    info = await names.group(group)
            if waited.cancelled_caught:
                raise OSError(f"{where}: group {group}: no master at the new epoch within "
                              f"{timeout} s")
        finally:
            await names.aclose()
    return info


async def declare(universe: str, server: str, topic: str, *, flags: Sequence[str] = (),
                  group: str | None = None, filter: str | None = None,
                  start: str | None = None, shared: bool = False, token: str = "",
                  identity: str | None = None, track_port: int = DEFAULT_TRACK_PORT,
                  timeout: float = 10.0) -> dict[str, Any]:
    """Declare ``topic`` (and ``group``) on the MQ server ``server``
    (``BROKER@HOST:PORT``): the server's reply, or its refusal as
    :class:`~brokermgr.ServiceError` (:func:`declared` says it in a line)."""
    async with mqtool.connect(universe, server, token=token, identity=identity,
                              track_port=track_port, timeout=timeout) as client:
        return await client.declare(topic, flags=list(flags), group=group, filter=filter,
                                    start=start, shared=shared)


def declared(topic: str, reply: dict[str, Any], filter: str | None) -> str:
    """What ``rdvpump mq declare`` (and the console's declare) says of the server's reply."""
    if reply.get("shared"):  # declared through the cluster's root, on every server
        return (f"declared {topic}, group {reply['group']}, shared (cluster state "
                f"v{reply['version']})")
    if reply.get("created"):
        return f"declared {topic}, group {reply['group']}"
    if reply.get("group_created"):
        return f"declared group {reply['group']} of {topic}"
    if filter is not None:
        return f"updated {topic}, group {reply['group']}: filter {filter}"
    return f"{topic}, group {reply['group']}: declared already, unchanged"
