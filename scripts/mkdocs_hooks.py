"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

The docstrings cross-reference in Sphinx's roles (``:class:`~channels.Gather```), which
the API reference shows as code: the role's name, and the ``~`` that asks for the last
name only, are dropped from the page (the reference stays code)."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):(<code>)~?")


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub(r"\1", html)
