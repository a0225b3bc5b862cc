"""The rdvpump application: the ``rdvpump`` CLI, universe files and their runners, the
processes of a universe, the demo, the generated diagrams and the benchmarks.

It sits on top of the framework (``brokermgr``, ``rdv``, ``channels``, ``pump``)
and imports it; nothing in the framework imports it.
"""
