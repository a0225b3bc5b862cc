"""The sans-I/O rendezvous: every (state, event) pair, table-driven."""

from __future__ import annotations

import pathlib

import pytest

from rdv import (
    BUSY,
    NOT_BOUND,
    TRANSITIONS,
    Action,
    PortState,
    RdvEvent,
    RdvUsageError,
    Refusal,
    RefusalReason,
    Rendezvous,
    is_final,
    state_diagram,
)

S, E = PortState, RdvEvent

# (setup events, event, expected state after, expected action, reason)
CASES = [
    ([], E.BIND, S.BOUND, Action.OK, None),
    ([], E.LISTEN, S.LISTENING, Action.OK, None),
    ([], E.CONNECT, S.UNBOUND, Action.REFUSE, NOT_BOUND),  # a connect before the bind
    ([E.BIND], E.CONNECT, S.ACCEPTED, Action.ACCEPT, None),
    ([E.BIND], E.UNBIND, S.UNBOUND, Action.OK, None),
    ([E.BIND, E.CONNECT], E.CONNECT, S.ACCEPTED, Action.REFUSE, BUSY),
    ([E.BIND, E.CONNECT], E.UNBIND, S.UNBOUND, Action.OK, None),
    ([E.LISTEN], E.CONNECT, S.LISTENING, Action.ACCEPT, None),
    ([E.LISTEN, E.CONNECT], E.CONNECT, S.LISTENING, Action.ACCEPT, None),  # re-armed
    ([E.LISTEN], E.UNBIND, S.UNBOUND, Action.OK, None),
    ([E.BIND, E.UNBIND], E.CONNECT, S.UNBOUND, Action.REFUSE, NOT_BOUND),
    ([E.BIND, E.UNBIND], E.BIND, S.BOUND, Action.OK, None),
]


@pytest.mark.parametrize(("setup", "event", "state", "action", "reason"), CASES)
def test_transitions(setup: list[RdvEvent], event: RdvEvent, state: PortState,
                     action: Action, reason: str | None) -> None:
    rdv = Rendezvous()
    for e in setup:
        rdv.handle(e, 80)
    t = rdv.handle(event, 80)
    assert (t.action, t.reason) == (action, reason)
    assert rdv.state(80) is state
    assert rdv.state(81) is S.UNBOUND  # other ports are untouched


ERRORS = [
    ([E.BIND], E.BIND, "already bound"),
    ([E.BIND], E.LISTEN, "already bound"),
    ([E.LISTEN], E.BIND, "already bound"),
    ([E.BIND, E.CONNECT], E.BIND, "already bound"),
    ([], E.UNBIND, "not bound"),
]


@pytest.mark.parametrize(("setup", "event", "message"), ERRORS)
def test_everything_missing_from_the_table_is_an_error(
        setup: list[RdvEvent], event: RdvEvent, message: str) -> None:
    rdv = Rendezvous()
    for e in setup:
        rdv.handle(e, 80)
    before = rdv.state(80)
    with pytest.raises(RdvUsageError, match=message):
        rdv.handle(event, 80)
    assert rdv.state(80) is before


def test_the_table_is_complete_up_to_the_documented_errors() -> None:
    missing = {(s, e) for s in S for e in E} - set(TRANSITIONS)
    assert missing == {(S.BOUND, E.BIND), (S.BOUND, E.LISTEN), (S.ACCEPTED, E.BIND),
                       (S.ACCEPTED, E.LISTEN), (S.LISTENING, E.BIND),
                       (S.LISTENING, E.LISTEN), (S.UNBOUND, E.UNBIND)}


@pytest.mark.parametrize("port", [-1, 65536])
def test_ports_are_checked(port: int) -> None:
    with pytest.raises(ValueError, match="port must be within"):
        Rendezvous().handle(E.BIND, port)
    with pytest.raises(TypeError):
        Rendezvous().handle(E.BIND, "80")  # type: ignore[arg-type]


def test_the_state_diagram_in_docs_is_generated_from_the_table() -> None:
    path = pathlib.Path(__file__).resolve().parents[2] / "docs/diagrams/rendezvous-states.mmd"
    assert path.read_text() == state_diagram(), (
        "docs/diagrams/rendezvous-states.mmd is stale: run `rdvpump diagram states`")


@pytest.mark.parametrize(("refusal", "final"), [
    (Refusal.UNREACHABLE, False),  # a process starting, or a network that comes back
    (Refusal.BUSY, False),  # the bind takes the next connect
    (Refusal.NOT_BOUND, False),  # a server still starting
    (Refusal.UNKNOWN_BROKER, True),
    (Refusal.UNAUTHORIZED, True),
    (Refusal.CLOSED, True),
    (Refusal.OTHER, True),  # a newer peer's reason: its text is shown, not waited out
])
def test_which_refusals_dialling_again_may_mend(refusal: Refusal, final: bool) -> None:
    assert refusal.transient is not final
    assert is_final(RefusalReason(refusal, "detail")) is final
    assert is_final(RefusalReason.parse(f"{refusal.value}: detail")) is final


def test_no_refusal_or_plain_text_is_not_final() -> None:
    assert not is_final(None) and not is_final("unauthorized")
