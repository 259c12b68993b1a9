"""How much a worker trains between two syncs of its replica, and how far it may run ahead of them.

The quality of the exchange depends on *replicas*, not on worker processes: the processes of a host that share
one replica (``LIVEVEC_HOST_REPLICA``) train it in place, hogwild, as one process's threads do, and only the
replicas' deltas combine. So the interval is a replica's share of a round, ``SYNC_TOKENS_K / k^2`` tokens for
k replicas (at most ``SYNC_TOKENS_MAX``; at most ``SYNC_TOKENS_MERGED_MAX`` where the servers merge replicas' deltas),
split over the processes that train the replica.

Design: docs/design/0003-sync-interval.md
"""
from __future__ import annotations

import math
import time

SYNC_TOKENS_K = 640_000
SYNC_TOKENS_K_UNMERGED = 160_000   # up to 2 declared workers (no merge on the servers), and beyond LONG_UP_TO
LONG_UP_TO = 16                    # replicas up to which the longer interval keeps the quality
SYNC_TOKENS_MAX = 160_000
SYNC_TOKENS_MERGED_MAX = 10_000    # the longest interval of replicas whose deltas the servers merge
SYNC_TOKENS_MIN = 100
UNMERGED_WORKERS = 2               # up to this many declared workers the servers add deltas as they are (no merge)


def servers_merge(declared_workers: int) -> bool:
    """Whether the servers of a cluster of ``declared_workers`` merge the replicas' deltas (elastic workers aside:
    ``online.cluster.server`` merges for them too)."""
    return declared_workers > UNMERGED_WORKERS


def default_sync_tokens(workers: int, sharing: int = 1) -> int:
    """``LIVEVEC_SYNC_TOKENS`` 0: the tokens one of ``sharing`` processes that train a replica together trains
    between syncs, in a cluster of ``workers``: ``SYNC_TOKENS_K / k^2`` per replica (at most ``SYNC_TOKENS_MAX``,
    and at most ``SYNC_TOKENS_MERGED_MAX`` where 2 or more replicas' deltas are merged), k = workers / sharing
    replicas (rounded up), split over the ``sharing`` processes, at least ``SYNC_TOKENS_MIN``.

    Why the square: with k replicas, a round's k deltas of a hot row all start from the same value, and the
    model keeps its quality only if each replica's share of the round shrinks faster than 1/k. So one replica
    syncs every 160,000 tokens, 8 every 10,000, 16 every 2,500. Fewer merged replicas still sync every 10,000: 4
    hosts of 2 workers learnt 19.91 - 21.44 % analogy at 40,000 tokens a replica, 21.95 % at 20,000 and 21.91 - 23.26 %
    at 10,000, against 23.26 % for 2 workers on one replica (wiki17m). Deltas that wait until they grow
    (``LIVEVEC_SEND_THRESHOLD``) keep the rows per token down, and this interval, four times the float32
    exchange's, divides each sync's and each Kafka batch's fixed cost by four. Two cases keep the float32
    exchange's ``SYNC_TOKENS_K_UNMERGED / k^2``:

    * up to 2 declared workers, where the servers keep no merge state and add the deltas as they are
      (``online.cluster.server``): two replicas' hot rows overshoot at the longer interval (19.18 % analogy at
      160,000 tokens against 23.10 % for one replica, wiki17m), so 2 replicas sync every 40,000;
    * beyond ``LONG_UP_TO`` (16) replicas, where the longer interval costs quality (32 replicas at 625 tokens:
      1.63 % against 3.16 % for one model, simulation, 3M tokens): 32 sync every 156, 64 every 100 (the floor).

    A worker trains at most ``unsynced_bound`` intervals ahead of its last answered sync, so at 100 tokens a
    1 ms round trip caps it near 150k tokens/s; where round trips are longer, pack workers per host
    (``LIVEVEC_HOST_REPLICA``: fewer replicas)."""
    sharing = max(int(sharing), 1)
    k = replicas(workers, sharing)
    merged = servers_merge(workers) and k > 1
    per_round = SYNC_TOKENS_K if merged and k <= LONG_UP_TO else SYNC_TOKENS_K_UNMERGED
    longest = SYNC_TOKENS_MERGED_MAX if merged else SYNC_TOKENS_MAX
    return max(SYNC_TOKENS_MIN, min(longest, per_round // (k * k)) // sharing)


def replicas(workers: int, sharing: int = 1) -> int:
    """The replicas of a cluster of ``workers`` whose hosts each hold one for ``sharing`` processes."""
    return max(math.ceil(max(int(workers), 1) / max(int(sharing), 1)), 1)


def unsynced_bound(k: int) -> float:
    """Trained tokens no sync has carried yet, at most, in ``LIVEVEC_SYNC_TOKENS``, for ``k`` replicas: 8 for one
    replica, 2 for 2 - 4, 1.5 for more. A sync starts at one interval unsynced, so this bounds what a replica
    trains while a sync is in flight, from rows that lack the round's merge. A whole interval trained so is
    harmless to 2 and 4 replicas and collapses 8 and more (every hot row's delta redoes the round's move); half
    of one costs nothing. Slow syncs (many replicas, slow links) are what reach it. One replica has no round to
    lag behind, so only the memory of the batches awaiting a sync bounds it: 8 intervals, about 1.8 s of a
    process's training, outlast a checkpoint's hold on the syncs (0.5 - 1 s)."""
    if k <= 1:
        return 8.0
    return 2.0 if k <= 4 else 1.5


class SyncInterval:
    """One worker's interval: ``LIVEVEC_SYNC_TOKENS`` when set, else the default for the processes its replica
    has now (a host's processes attach and leave; counted at most every ``RECOUNT`` seconds)."""

    RECOUNT = 0.5

    def __init__(self, workers: int, fixed: int, members=lambda: 1):
        self.workers, self.fixed, self._members = int(workers), int(fixed), members
        self._sharing, self._counted_at = 1, -math.inf

    def sharing(self) -> int:
        now = time.monotonic()
        if now - self._counted_at > self.RECOUNT:
            self._sharing, self._counted_at = max(int(self._members()), 1), now
        return self._sharing

    def tokens(self) -> int:
        """Tokens this process trains before it asks for a sync."""
        return self.fixed or default_sync_tokens(self.workers, self.sharing())

    def limit(self) -> float:
        """Unsynced tokens at which this process trains no further until a sync carries them."""
        return unsynced_bound(replicas(self.workers, self.sharing())) * self.tokens()
