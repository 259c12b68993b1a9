"""Deployment: the cluster topology (one source of truth), its Marathon and Kubernetes
renderings, the platforms' rules they are checked against, and a local runner that starts a
Marathon group on one machine as Marathon would.

It starts the roles as processes (``livevec <role>``) and never imports them.

May import: ``online.learner``, ``online.stream``, ``online.cluster``, ``online.checkpoint``,
``online.frontend`` and ``ps_bridge``. It uses ``online.cluster``'s host-replica segment layout and
the reclaiming of dead segments only.
"""
