"""Coordinated checkpoints: a consistent cut of the model and the Kafka offsets.

Owns the on-disk store, the coordinator that runs beside the scheduler, and the server and
worker participants that plug into the cluster roles' extension points.

May import: ``online.learner``, ``online.stream``, ``online.cluster`` and ``ps_bridge``.
"""
