"""livevec's online learner, Kafka plumbing, front end and command line.

The parameter-server protocol lives in the sibling package ``ps_bridge``; everything
here is a client of it.

``__version__`` is the release, named here only (``pyproject.toml`` reads it, ``livevec --version`` prints it).
Each format that outlives a process or crosses one has a version of its own, beside the code that writes it and
carried in what it writes, so a reader tells a layout it knows from a newer one and refuses the latter with both
versions named: the checkpoint's manifest and shards (``checkpoint.store``), the host replica's segment
(``cluster.segment_layout``), the replica exchange (``cluster.ps_commands``), the export (``frontend.export``).
Which releases read which, and which may share a cluster: ``docs/operations.md#compatibility``.
Design: docs/design/0009-versions.md
"""
__version__ = "0.2.0"
