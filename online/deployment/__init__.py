"""Deployment: the cluster topology (one source of truth), its Marathon and Kubernetes
renderings, the platforms' rules they are checked against, and a local runner that starts a
Marathon group on one machine as Marathon would.

It starts the roles as processes (``livevec <role>``) and never imports them.

May import: ``online.learner``, ``online.stream``, ``online.cluster``, ``online.checkpoint``,
``online.frontend`` (none of which it needs today) and ``ps_bridge``.
"""
