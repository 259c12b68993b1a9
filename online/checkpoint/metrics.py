"""The checkpoint coordinator's metrics (``livevec_checkpoint_*``, ``livevec_rollback*``, ``livevec_recovering``)."""
from __future__ import annotations

from ps_bridge.metrics import Registry


class CoordinatorMetrics:
    """The checkpoint coordinator's metrics: checkpoints, their pauses and writes, rollbacks."""

    def __init__(self, r: Registry):
        self.checkpoints = {res: r.counter("livevec_checkpoints_total", "checkpoints attempted", result=res)
                            for res in ("done", "aborted", "failed")}
        self.pause = r.histogram("livevec_checkpoint_pause_seconds", "training stall per checkpoint",
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 1, 2, 5, 10, 30))
        self.last_pause = r.gauge("livevec_checkpoint_last_pause_seconds", "training stall of the latest checkpoint")
        self.write = r.histogram("livevec_checkpoint_write_seconds", "time to write the shards and the manifest",
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 120))
        self.bytes = r.gauge("livevec_checkpoint_bytes", "size of the latest checkpoint")
        self.last_id = r.gauge("livevec_checkpoint_last_id", "id of the latest complete checkpoint")
        self.rollbacks = r.counter("livevec_rollbacks_total", "cluster rollbacks to the latest checkpoint")
        self.rollback_seconds = r.histogram("livevec_rollback_seconds", "duration of a rollback (pause to resume)",
                                            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
        self.recovering = r.gauge("livevec_recovering", "1 while a rollback is pending or running")
        self.wait_timeouts = r.counter("livevec_rollback_wait_timeouts_total",
                                       "rollbacks that waited LIVEVEC_ROLLBACK_WAIT_TIMEOUT for members and went on "
                                       "with the members they had")
