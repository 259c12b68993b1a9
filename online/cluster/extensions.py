"""What the cluster roles let an optional piece (checkpointing) add to them.

The roles do not know that checkpoints exist: a server answers the KV and control
requests of its shard, a worker trains batches, a scheduler runs ps-lite. Coordinated
checkpoints need a few more things from each of them (extra control requests and
counters on a server, a word after every batch on a worker, a companion beside the
scheduler). Each role takes one extension in its constructor and calls it only through
the methods below, so what a plug-in may touch is written down here instead of being
attributes that someone assigns from outside; the base classes do nothing, which is
what a role does without one.

Nothing in ``online.cluster`` imports an extension's implementation: the command that
starts a role (``online.cli``) decides from its settings which one to pass.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from online.cluster.server import ShardService
    from online.cluster.worker import StreamingWorker
    from online.learner.trainer import BatchStats
    from online.stream.batches import Batch
    from ps_bridge.simple_app import SimpleApp, SimpleData


class ServerExtension:
    """Extra behaviour of one ``livevec server`` node.

    ``attach`` is called once by ``ShardService``'s constructor, before the node starts,
    so the extension may keep the service (and replace ``service.shard`` / ``epoch``,
    as a checkpoint load does). The other methods run on the node's threads: requests
    on the receive thread, one at a time; ``tick`` about once a second on the main thread.
    """

    def attach(self, service: "ShardService") -> None:
        pass

    def handle_simple(self, req: "SimpleData", app: "SimpleApp") -> bool:
        """Answer a control request whose head the server does not know; False: not ours either."""
        return False

    def stats(self) -> dict:
        """Entries merged into the server's ``HEAD_STATS`` answer."""
        return {}

    def tick(self) -> None:
        pass


class WorkerExtension:
    """Extra behaviour of one ``livevec worker``.

    ``attach`` is called once by ``StreamingWorker``'s constructor, on the worker's event
    loop; the extension may then drive the worker's ``paused`` / ``abandon`` events (see
    ``StreamingWorker``). ``close`` is called when ``run`` ends, before the stream stops.
    """

    def attach(self, worker: "StreamingWorker") -> None:
        pass

    async def batch_done(self, batch: "Batch", stats: "BatchStats") -> bool:
        """A batch's pushes were acknowledged; its offsets are committed only if this says True."""
        return True

    def batch_retried(self, exc: BaseException) -> None:
        """A batch is trained again after ``exc`` (called from the training thread)."""

    def close(self) -> None:
        pass


class SchedulerExtension:
    """Something that runs beside the ps-lite scheduler, in its process.

    Made from the scheduler's ``Postoffice`` before the node starts (so any app it
    creates exists before the first registration), ``start``-ed once the node is up and
    ``stop``-ped when the scheduler ends.
    """

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
