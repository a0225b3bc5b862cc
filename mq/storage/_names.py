"""Topic and consume-group names: one rule for what a name may be, one way to store it.

A name is data.  :func:`check_name` is the rule every name a client sends
passes before anything changes; :func:`disk_name` is the only way a name
becomes a file or directory name: an injective, filesystem-safe encoding that
is never ``.`` or ``..``, never holds a separator and always fits a file
name (255 bytes) with room for a suffix.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

from pump import ConfigError

#: Longest topic or group name, in UTF-8 bytes (RabbitMQ's queue-name limit).
MAX_NAME_BYTES = 255
#: Longest encoded name used as it is; longer ones keep a prefix and a hash.  The room
#: left serves the suffixes (``.cursor``) and the temporary files of atomic replaces.
MAX_DISK_NAME = 200
#: Characters of a long name's encoding kept before its hash.
_PREFIX = 120
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_name(value: object, what: str = "topic") -> str:
    """``value`` if it is a valid name; :class:`ValueError` saying why not.

    The rule: a string of 1 to :data:`MAX_NAME_BYTES` bytes in UTF-8, with no control
    character (U+0000 to U+001F, U+007F).  Anything else is allowed (``.``, ``/``, ``%``
    and the rest of Unicode are data, never paths).
    """
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise ConfigError(f"{what} must not be empty")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ConfigError(f"{what} is not valid Unicode (a lone surrogate)") from None
    if size > MAX_NAME_BYTES:
        raise ConfigError(f"{what} is {size} bytes in UTF-8; at most {MAX_NAME_BYTES}")
    bad = _CONTROL.search(value)
    if bad is not None:
        raise ConfigError(f"{what} holds the control character U+{ord(bad.group()):04X} "
                         f"at {bad.start()}")
    return value


def disk_name(name: str) -> str:
    """The file-name form of a (checked) name.

    Percent-encoding of its UTF-8 bytes, every byte but ``A-Z a-z 0-9 _ . - ~``
    escaped (so ``/``, ``%``, ``+`` and NUL never appear as themselves), and ``.``
    escaped too when the whole name is dots.  One longer than :data:`MAX_DISK_NAME`
    keeps a readable prefix, then ``+`` (which no short form holds) and a SHA-256 of
    the name: two names never share a form.
    """
    encoded = quote(name, safe="")
    if encoded.strip(".") == "":
        encoded = encoded.replace(".", "%2E")
    if len(encoded) <= MAX_DISK_NAME:
        return encoded
    prefix = encoded[:_PREFIX]
    cut = prefix.rfind("%", len(prefix) - 2)  # never end inside an escape
    if cut >= 0:
        prefix = prefix[:cut]
    return f"{prefix}+{hashlib.sha256(name.encode()).hexdigest()[:40]}"


def dead_letter_topic(topic: str, group: str) -> str:
    """The dead-letter topic of a group: ``<topic>.<group>.DLQ``, shortened with a hash
    of both when that passes :data:`MAX_NAME_BYTES`."""
    name = f"{topic}.{group}.DLQ"
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    digest = hashlib.sha256(f"{topic}\x00{group}".encode()).hexdigest()[:16]
    head = f"{topic}.{group}".encode()[:MAX_NAME_BYTES - len(digest) - 6]
    return f"{head.decode(errors='ignore')}~{digest}.DLQ"
