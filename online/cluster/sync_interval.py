"""How much a worker trains between two syncs of its replica, and how far it may run ahead of them.

The quality of the exchange depends on *replicas*, not on worker processes: the processes of a host that share
one replica (``LIVEVEC_HOST_REPLICA``) train it in place, hogwild, as one process's threads do, and only the
replicas' deltas combine. So the interval is a replica's share of a round, ``SYNC_TOKENS_K / k^2`` tokens for
k replicas, split over the processes that train the replica. With k counted as workers, 2 workers sharing one
host's replica each synced every 40,000 tokens and stopped at 80,000 unsynced, while the host's paced syncs
(one per ``LIVEVEC_SYNC_MS``) came every 55,000 - 80,000 tokens per process: the workers stood still a fifth of
the time (1.58 of 2 cores busy; with the replica's interval, 1.87; issue #30, ``bench/README.md``, session 27).
"""
from __future__ import annotations

import math
import time

SYNC_TOKENS_K = 160_000
SYNC_TOKENS_MIN = 100


def default_sync_tokens(workers: int, sharing: int = 1) -> int:
    """``LIVEVEC_SYNC_TOKENS`` 0: the tokens one of ``sharing`` processes that train a replica together trains
    between syncs, in a cluster of ``workers``: ``SYNC_TOKENS_K / k^2`` per replica, k = workers / sharing
    replicas (rounded up), split over the ``sharing`` processes.

    Why the square: with k replicas, a round's k deltas of a hot row all start from the same value, and the
    simulation loses quality as k grows unless each replica's share of the round shrinks faster than 1/k
    (3M tokens; one model 2.92 % analogy / 0.377 WS353; 8 replicas at 10,000 tokens each 1.70 % / 0.431,
    at 2,500 tokens 2.49 % / 0.475; 4 at 20,000 2.83 % / 0.476; bench/README.md, session 13). Two workers
    with a replica each keep the 40,000 of before; 8 pay about 3x the rows per token, which is what the quality
    costs. The floor, 250 since session 15 (1,000 before): once replicas fetch the rows of new words
    (``ReplicaStore._hold_new_words``), 32 replicas at 250 tokens come within 0.72 points of one model and 64
    within 0.51, where the old floor left them 1.18 and 2.02 behind; and on the real cluster 16 workers at 625
    tokens learnt 20.91 % against 20.23 % at 1,000 (bench/README.md). 100 since session 23: on 10M tokens, once
    each worker's noise table takes the words the cluster trains, 64 replicas at 250 tokens learnt 10.28 %
    against one model's 12.61 %, at 100 tokens 12.34 % / 0.592 (WS353; one model 0.538), at 330 rows synced per
    kept token against 211. The floor binds from 26 replicas on. The price is round trips: a worker trains at
    most 1.5 intervals ahead of its last answered sync (``unsynced_bound``), so at 100 tokens a 1 ms round trip
    caps it near 150k tokens/s; where round trips are longer, pack workers per host (``LIVEVEC_HOST_REPLICA``:
    fewer replicas)."""
    sharing = max(int(sharing), 1)
    k = replicas(workers, sharing)
    return max(SYNC_TOKENS_MIN, SYNC_TOKENS_K // (k * k) // sharing)


def replicas(workers: int, sharing: int = 1) -> int:
    """The replicas of a cluster of ``workers`` whose hosts each hold one for ``sharing`` processes."""
    return max(math.ceil(max(int(workers), 1) / max(int(sharing), 1)), 1)


def unsynced_bound(k: int) -> float:
    """Trained tokens no sync has carried yet, at most, in ``LIVEVEC_SYNC_TOKENS``, for ``k`` replicas. A sync starts at one
    interval unsynced, so this bounds what a replica trains while a sync is in flight, from rows that lack
    the round's merge. In the simulation (``--lag``, bench/README.md, session 19) a whole interval trained
    so is harmless to 2 and 4 replicas (2.85 % and 2.58 %, one model 2.92 %) and collapses 8 and 16 (0.36 %
    and 0.01 %): every hot row's delta redoes the round's move; half an interval costs 16 nothing (2.33 %
    against 2.32 %). So up to 4 replicas keep 2 (a slow sync then holds training less), more get 1.5; slow
    syncs (many replicas, slow links) are what reach it. One replica has no round to lag behind, so only the
    memory of the batches awaiting a sync bounds it: 8 intervals, about 1.8 s of a process's training, which
    outlasts a checkpoint's hold on the syncs (0.5 - 1 s). At 2, two workers sharing one host's replica waited
    at the bound 7 % of the time, most of it while a checkpoint held their syncs (session 27); at 4, once the
    kernel got faster (session 28), 1.32 s summed over a 15.7 s window, and 0.23 s at 8."""
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
