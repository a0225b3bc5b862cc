"""The rendezvous as a sans-I/O state machine: one state per port, a transition table.

No pump, no trio, no sockets: feed it events, it returns what to do.  Anything
not in the table is a local usage error with a clear message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pump import ConfigError, RdvpumpError


class PortState(enum.Enum):
    UNBOUND = "unbound"
    BOUND = "bound"          # bind(): waits for one connect
    ACCEPTED = "accepted"    # that bind accepted its connect; later connects are busy
    LISTENING = "listening"  # listen(): a bind that re-arms after every accept


class RdvEvent(enum.Enum):
    BIND = "bind"
    LISTEN = "listen"
    UNBIND = "unbind"
    CONNECT = "connect"


class Action(enum.Enum):
    OK = "ok"
    ACCEPT = "accept"
    REFUSE = "refuse"


class Refusal(enum.StrEnum):
    """Why a connect was refused; the values are the reasons users see."""

    UNKNOWN_BROKER = "unknown broker"
    NOT_BOUND = "not bound"
    BUSY = "busy"
    UNAUTHORIZED = "unauthorized"
    #: Over the wire: the broker's process could not be reached (the detail follows).
    UNREACHABLE = "unreachable"
    #: The connecting broker itself was closed before its connect ran.
    CLOSED = "closed"
    #: A reason this version does not know (from a newer peer); the text says it.
    OTHER = "refused"

    @property
    def transient(self) -> bool:
        """Whether a later connect may pass with nothing changed by hand: the peer is out
        of reach, busy, or not bound yet (a server still starting).  The others stand:
        an unknown broker, a wrong token or universe, a closed broker, a newer peer's
        reason."""
        return self in _TRANSIENT


_TRANSIENT = frozenset({Refusal.UNREACHABLE, Refusal.BUSY, Refusal.NOT_BOUND})


def is_final(reason: object) -> bool:
    """Whether ``reason`` (a :class:`RefusalReason`) is a refusal that dialling again
    cannot mend (see :attr:`Refusal.transient`); False for None or plain text.  Clients
    give up at once on these and keep dialling through the others."""
    refusal = getattr(reason, "refusal", None)
    return isinstance(refusal, Refusal) and not refusal.transient


class RefusalReason(str):
    """A refusal as listeners get it: the text (``"unreachable: timed out"``), whose
    :attr:`refusal` says which kind it is without parsing it."""

    refusal: Refusal

    def __new__(cls, refusal: Refusal, detail: str | None = None, *,
                text: str | None = None) -> RefusalReason:
        if text is None:
            text = refusal.value if detail is None else f"{refusal.value}: {detail}"
        self = super().__new__(cls, text)
        self.refusal = refusal
        return self

    @classmethod
    def parse(cls, text: str) -> RefusalReason:
        """A reason as the wire carries it, ``"kind"`` or ``"kind: detail"``; a kind this
        side does not know (a newer peer's) is kept whole, as ``Refusal.OTHER``."""
        kind, _, _ = text.partition(": ")
        try:
            return cls(Refusal(kind), text=text)
        except ValueError:
            return cls(Refusal.OTHER, text=text)


#: Refusal reasons of the rendezvous itself: the words users see, pinned by the tests.
UNKNOWN_BROKER = Refusal.UNKNOWN_BROKER
NOT_BOUND = Refusal.NOT_BOUND
BUSY = Refusal.BUSY
UNAUTHORIZED = Refusal.UNAUTHORIZED
REFUSAL_REASONS = (UNKNOWN_BROKER, NOT_BOUND, BUSY, UNAUTHORIZED)


@dataclass(frozen=True, slots=True)
class Transition:
    next_state: PortState
    action: Action
    reason: Refusal | None = None


S, E = PortState, RdvEvent

#: (state, event) -> transition.  The state diagram in docs/diagrams/ is generated from this.
TRANSITIONS: dict[tuple[PortState, RdvEvent], Transition] = {
    (S.UNBOUND, E.BIND): Transition(S.BOUND, Action.OK),
    (S.UNBOUND, E.LISTEN): Transition(S.LISTENING, Action.OK),
    (S.UNBOUND, E.CONNECT): Transition(S.UNBOUND, Action.REFUSE, NOT_BOUND),
    (S.BOUND, E.CONNECT): Transition(S.ACCEPTED, Action.ACCEPT),
    (S.BOUND, E.UNBIND): Transition(S.UNBOUND, Action.OK),
    (S.ACCEPTED, E.CONNECT): Transition(S.ACCEPTED, Action.REFUSE, BUSY),
    (S.ACCEPTED, E.UNBIND): Transition(S.UNBOUND, Action.OK),
    (S.LISTENING, E.CONNECT): Transition(S.LISTENING, Action.ACCEPT),
    (S.LISTENING, E.UNBIND): Transition(S.UNBOUND, Action.OK),
}

_HINTS = {
    E.BIND: "it is already bound; unbind it first",
    E.LISTEN: "it is already bound; unbind it first",
    E.UNBIND: "it is not bound",
}

MAX_PORT = 65535


class RdvUsageError(RdvpumpError, RuntimeError):
    """The rendezvous was used against its state machine (bind twice, unbind unbound, ...)."""


def check_port(port: object) -> int:
    if not isinstance(port, int) or isinstance(port, bool):
        raise TypeError(f"port must be an int, not {type(port).__name__}")
    if not 0 <= port <= MAX_PORT:
        raise ConfigError(f"port must be within 0..{MAX_PORT}, got {port}")
    return port


class Rendezvous:
    """The ports of one broker and their states.

    ``handle(event, port)`` applies the table and returns the transition; a
    missing entry raises :class:`RdvUsageError`.  Connect refusals are not
    errors: they come back as ``Action.REFUSE`` with the reason.
    """

    def __init__(self) -> None:
        self._ports: dict[int, PortState] = {}

    def state(self, port: int) -> PortState:
        return self._ports.get(port, PortState.UNBOUND)

    def bound_ports(self) -> list[int]:
        return sorted(self._ports)

    def handle(self, event: RdvEvent, port: int) -> Transition:
        check_port(port)
        state = self.state(port)
        transition = TRANSITIONS.get((state, event))
        if transition is None:
            hint = _HINTS.get(event, f"not allowed in state {state.value}")
            raise RdvUsageError(f"cannot {event.value} port {port}: {hint} "
                                f"(state {state.value})")
        if transition.next_state is PortState.UNBOUND:
            self._ports.pop(port, None)
        else:
            self._ports[port] = transition.next_state
        return transition


def state_diagram() -> str:
    """The table as a Mermaid state diagram (docs/diagrams/rendezvous-states.mmd)."""
    lines = ["stateDiagram-v2", "    [*] --> unbound"]
    for (state, event), t in TRANSITIONS.items():
        label = event.value
        if t.action is Action.ACCEPT:
            label += " / accepted"
        elif t.action is Action.REFUSE:
            label += f' / refused("{t.reason}")'
        lines.append(f"    {state.value} --> {t.next_state.value}: {label}")
    lines.append("    %% generated from rdv._core.TRANSITIONS;"
                 " any other (state, event) is an error")
    return "\n".join(lines) + "\n"
