"""``python -m rdvpump``: the same as the ``rdvpump`` command."""

from rdvpump.cli import main

main()
