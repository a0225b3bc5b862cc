"""Who a link's peer is, and what it may do: identities, their secrets and their rights.

Every link from another process opens with a handshake that carries the universe's
token; it may also carry an identity (``NAME`` and its secret).  The accepting side
checks the secret against the *identities file* it was given, and the link then speaks
as that identity; a link with the token alone speaks as the file's ``[token]`` identity.
Without a file every link is the one identity :data:`OPEN`, which may do everything:
a single-user universe is as simple as a token.

The file (TOML) holds no secret, only a SHA-256 of each (``rdvpump identity new``
makes a secret and its line); the secrets themselves are random, so one hash is as
strong as a slow one and costs a pump nothing at a handshake::

    [token]                        # the universe token alone (default: look things up)
    consume = ["news.*"]

    [identity.alice]
    secret = "sha256:..."
    publish = ["orders.*"]         # produce to these topics (fnmatch patterns)
    consume = ["orders.*"]         # consume from them
    declare = ["orders.*"]         # declare, empty and remove them
    admin = true                   # failovers and other changes of groups and clusters

    [identity.server-a]
    secret = "sha256:..."
    member = ["a"]                 # speak as the cluster or group member (broker) a

A ``member`` identity is a server: it may speak as those brokers on cluster and group
links, register them with a name service, and use every topic (servers relay each
other's messages); a broker id some identity lists as a member is reserved: the name
service takes its registration from that identity only.
"""

from __future__ import annotations

import collections
import enum
import fnmatch
import hashlib
import hmac
import os
import re
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pump import ConfigError

#: An identity's name: what logs, errors and the audit log show.
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_HASH = re.compile(r"sha256:[0-9a-f]{64}")
#: The name of the identity a link has with the universe token alone.
TOKEN_IDENTITY = "token"


class Right(enum.StrEnum):
    """What an identity may be allowed; the first three by topic pattern."""

    PUBLISH = "publish"
    CONSUME = "consume"
    DECLARE = "declare"
    ADMIN = "admin"
    MEMBER = "member"


_PATTERNED = (Right.PUBLISH, Right.CONSUME, Right.DECLARE, Right.MEMBER)
_KEYS = {"secret", "admin", *_PATTERNED}


class IdentityError(ConfigError):
    """An identities file or a credential that cannot be used (the file and the field in
    the message)."""


@dataclass(eq=False)
class Identity:
    """One identity and its rights.  :meth:`may` answers one question, remembered."""

    name: str
    #: fnmatch patterns per right; ``admin`` is a bool
    patterns: dict[Right, tuple[str, ...]] = field(default_factory=dict)
    admin: bool = False
    #: True only for :data:`OPEN`'s identity (and links within a process): every right.
    everything: bool = False
    #: The file it came from: where its denials are counted.
    registry: Identities | None = field(default=None, repr=False)
    _answers: dict[tuple[Right, str], bool] = field(default_factory=dict, repr=False)

    def may(self, right: Right, what: str = "") -> bool:
        """Whether this identity has ``right`` (on the topic or broker ``what``)."""
        if self.everything:
            return True
        key = (right, what)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._decide(right, what)
            if len(self._answers) >= 4096:
                self._answers.clear()
            self._answers[key] = answer
        return answer

    def _decide(self, right: Right, what: str) -> bool:
        if right is Right.ADMIN:
            return self.admin
        members = self.patterns.get(Right.MEMBER, ())
        if right is Right.MEMBER:
            return any(fnmatch.fnmatchcase(what, p) for p in members)
        if members:  # a server uses every topic: it relays its cluster's
            return True
        return any(fnmatch.fnmatchcase(what, p) for p in self.patterns.get(right, ()))

    def denied(self, right: Right) -> None:
        if self.registry is not None:
            self.registry.denials[(self.name, str(right))] += 1


#: Rights of every link where no identities file is given, and of links within a process.
EVERYTHING = Identity(TOKEN_IDENTITY, everything=True)


class Identities:
    """The identities a process accepts links from: by name, each with the SHA-256 of its
    secret, and the ``[token]`` identity.  :data:`OPEN` (no file) makes every link
    :data:`EVERYTHING`."""

    def __init__(self, identities: dict[str, tuple[bytes, Identity]] | None = None,
                 token: Identity | None = None, *, source: str = "") -> None:
        self._by_name = dict(identities or {})
        self.token = token if token is not None else EVERYTHING
        self.source = source
        #: (identity, right) -> how many requests were refused for it (a metric)
        self.denials: collections.Counter[tuple[str, str]] = collections.Counter()
        for _, identity in self._by_name.values():
            identity.registry = self
        if self.token is not EVERYTHING:
            self.token.registry = self
        self._members = tuple(p for _, i in self._by_name.values()
                              for p in i.patterns.get(Right.MEMBER, ()))

    @property
    def open(self) -> bool:
        """No file: every link may do everything."""
        return self.token is EVERYTHING and not self._by_name

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def verify(self, name: str | None, secret: str | None) -> Identity | None:
        """The identity a handshake proves: the token's without a name, the named one if
        the secret matches (compared in constant time), None if it does not."""
        if name is None:
            return self.token
        held = self._by_name.get(name)
        digest = hashlib.sha256((secret or "").encode()).digest()
        if held is None:
            hmac.compare_digest(digest, digest)  # the same work for a name not known
            return None
        return held[1] if hmac.compare_digest(digest, held[0]) else None

    def reserved(self, broker_id: str) -> bool:
        """Whether some identity is a member as ``broker_id``: only it may register it."""
        return any(fnmatch.fnmatchcase(broker_id, p) for p in self._members)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identities:
        """Read an identities file; :class:`IdentityError` names the file and the field."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise IdentityError(f"{path}: cannot read the identities file: "
                                f"{(exc.strerror or str(exc)).lower()}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise IdentityError(f"{path}: not TOML: {exc}") from None
        return cls.parse(data, source=str(path))

    @classmethod
    def parse(cls, data: dict[str, Any], *, source: str = "identities") -> Identities:
        unknown = set(data) - {"identity", TOKEN_IDENTITY}
        if unknown:
            raise IdentityError(f"{source}: unknown table {sorted(unknown)[0]!r} (it holds "
                                f"[token] and [identity.NAME] tables)")
        tables = data.get("identity", {})
        if not isinstance(tables, dict):
            raise IdentityError(f"{source}: identity must be tables [identity.NAME]")
        out: dict[str, tuple[bytes, Identity]] = {}
        for name, table in tables.items():
            where = f"{source}: identity.{name}"
            if not _NAME.fullmatch(name) or name == TOKEN_IDENTITY:
                raise IdentityError(f"{where}: a name is 1 to 64 letters, digits and "
                                    f"'_.@-', not {TOKEN_IDENTITY!r}")
            if not isinstance(table, dict):
                raise IdentityError(f"{where}: must be a table")
            secret = table.get("secret")
            if not isinstance(secret, str) or not _HASH.fullmatch(secret):
                raise IdentityError(f"{where}.secret: must be \"sha256:\" and 64 hex digits "
                                    f"(rdvpump identity new {name} makes one)")
            out[name] = (bytes.fromhex(secret[7:]), _identity(name, table, where))
        token = data.get(TOKEN_IDENTITY, {})
        if not isinstance(token, dict):
            raise IdentityError(f"{source}: token must be a table [token]")
        if "secret" in token:
            raise IdentityError(f"{source}: token.secret: the [token] identity's secret is "
                                "the universe token")
        return cls(out, _identity(TOKEN_IDENTITY, token, f"{source}: token"), source=source)


def _identity(name: str, table: dict[str, Any], where: str) -> Identity:
    unknown = set(table) - _KEYS
    if unknown:
        raise IdentityError(f"{where}: unknown key {sorted(unknown)[0]!r} (keys: "
                            f"{', '.join(sorted(_KEYS))})")
    patterns: dict[Right, tuple[str, ...]] = {}
    for right in _PATTERNED:
        value = table.get(str(right), [])
        if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
            raise IdentityError(f"{where}.{right}: must be a list of patterns, as "
                                f"[\"orders.*\"]")
        patterns[right] = tuple(value)
    admin = table.get("admin", False)
    if not isinstance(admin, bool):
        raise IdentityError(f"{where}.admin: must be true or false")
    return Identity(name, patterns, admin=admin)


#: No identities file: every link may do everything.
OPEN = Identities()


@dataclass(frozen=True, slots=True)
class Credential:
    """What a process says it is when it dials: an identity's name and its secret."""

    name: str
    secret: str

    def __repr__(self) -> str:
        return f"Credential({self.name!r}, secret=...)"

    @classmethod
    def parse(cls, text: str) -> Credential:
        """``NAME:SECRET``, as ``--identity`` and ``$RDVPUMP_IDENTITY`` take it."""
        name, sep, secret = text.partition(":")
        if not sep or not _NAME.fullmatch(name) or not secret:
            raise IdentityError("an identity is NAME:SECRET (the name 1 to 64 letters, "
                                "digits and '_.@-'; rdvpump identity new NAME makes one)")
        return cls(name, secret)

    def verifier(self) -> str:
        """The ``secret = ...`` value an identities file holds for it."""
        return "sha256:" + hashlib.sha256(self.secret.encode()).hexdigest()

    @classmethod
    def new(cls, name: str) -> Credential:
        """A new identity named ``name``, with a random secret (256 bits)."""
        if not _NAME.fullmatch(name) or name == TOKEN_IDENTITY:
            raise IdentityError(f"an identity's name is 1 to 64 letters, digits and '_.@-' "
                                f"(not {TOKEN_IDENTITY!r}), not {name!r}")
        return cls.parse(f"{name}:{secrets.token_urlsafe(32)}")
