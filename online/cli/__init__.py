"""The ``livevec`` command line: one module per command, each ``configure(parser)`` and
``run(args) -> int``.

This is the top of the tree. A command reads its role's settings, assembles the role from
the packages below (and the optional pieces its settings ask for) and runs it; nothing
below imports from here.

May import: every other ``online`` subpackage and ``ps_bridge``.
"""
