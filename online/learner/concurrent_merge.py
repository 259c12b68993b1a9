"""How a server combines the deltas that several workers' replicas made to one row at the same time.

Why. A worker trains its replica in place for a whole sync interval, then sends each row's
change ``delta = row - base`` (``online.cluster.replica``). Deltas made from the same base
by several workers are not always additive:

* a rare row moves a step or two per interval; steps from different workers' data are
  independent, and in one process they would simply have added up: **sum**;
* a frequent row takes hundreds of steps per interval in *every* worker. Each replica walks
  it most of the way to where its own data pull it (the sigmoid saturates and the steps stop
  by themselves), so the workers' deltas are nearly the same vector ``e - base``. Summed, k
  of them give ``base + k (e - base)``: an overshoot that oscillates at k = 2 and diverges
  above (8 replicas' summed deltas collapse the model). In one process each step would have seen
  the others' and the row would have stopped at ``e``: **average**.

Two rules tell the cases apart, and which one applies follows the kernel that made the deltas
(``online.cluster.replica.MERGE_BY_CONTRACTION``): the **contraction rule** (``_merge_by_contraction``) for the
``pairs`` kernel, whose deltas carry the contraction it measured, and the **alignment rule** (``_merge``) for
``hogbatch``, whose deltas carry none. Both give a row ``g`` times the sum of its round's deltas: the sum for
independent deltas, the mean for redundant ones, one delta exactly once. Each arriving delta is applied at once,
as the difference between the new and the previous ``g S`` of the round (earlier deltas are re-weighted as the
round learns more). The AdaGrad accumulator increments get the same weight, so the optimizer's state is that of
the combined trajectory.

A round is the deltas of distinct workers within ``window`` seconds (the workers' sync
interval): it ends when the window expires or when a worker that already contributed sends
again (its new delta was made from a base that includes the round so far, so it is not
concurrent with it). Workers are told apart by a bit of a 64-bit mask. Deltas of zero (rows
a sync only refreshes) do not take part.

Cost: per row ``dim`` float32 for ``S`` and 32 bytes more (436 bytes at dim 100), allocated
only on servers that merge, and O(dim) work per delta.

Design: docs/design/0001-replica-exchange.md
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(inline="always")
def _joins_round(i, r, deltas, acc, bit, now, window, S, A, Q, P, C, n, g, mask, t0, out, out_acc):
    """Both rules' bookkeeping for delta ``i`` of row ``r``: a zero delta (a refresh) gets a zero answer and
    takes no part (False); otherwise a new round starts when the window expired or the sender already
    contributed, and the delta is counted in it (its squared norm goes to ``Q``)."""
    dim = deltas.shape[1]
    q = np.float32(0.0)
    for d in range(dim):
        q += deltas[i, d] * deltas[i, d]
    if q == 0.0 and acc[i] == 0.0:
        for d in range(dim):
            out[i, d] = 0.0
        out_acc[i] = 0.0
        return False
    if now - t0[r] > window or (mask[r] & bit) != 0:
        for d in range(dim):
            S[r, d] = 0.0
        A[r] = 0.0
        Q[r] = 0.0
        P[r] = 0.0
        C[r] = 0.0
        n[r] = 0
        g[r] = 1.0
        mask[r] = 0
        t0[r] = now
    n[r] += 1
    Q[r] += q
    mask[r] |= bit
    return True


@njit(inline="always")
def _reweigh(i, r, g_new, deltas, acc, S, A, g, out, out_acc):
    """Add delta ``i`` to the round's sums and answer the change of ``g * sum`` it makes: the earlier deltas
    of the round are re-weighted from the old ``g`` to ``g_new`` at the same time."""
    g_old = g[r]
    for d in range(deltas.shape[1]):
        s_old = S[r, d]
        s_new = s_old + deltas[i, d]
        out[i, d] = g_new * s_new - g_old * s_old
        S[r, d] = s_new
    a_old = A[r]
    A[r] = a_old + acc[i]
    out_acc[i] = g_new * A[r] - g_old * a_old
    g[r] = g_new


@njit(nogil=True, cache=True)
def _merge(rows, deltas, acc, bit, now, window, floor, S, A, Q, P, C, n, g, mask, t0, out, out_acc):
    """The alignment rule: it reads the case from the deltas themselves, since redundant deltas point the same
    way and independent ones do not. Per row and round, with ``S`` the sum of the round's n deltas and ``Q`` the
    sum of their squared norms, the alignment ``rho = |S|^2 / (n Q)`` is 1 for n equal deltas and about 1/n for
    n orthogonal ones of equal norm (Cauchy-Schwarz keeps it in [0, 1]). The row gets ``g S`` with

        n_eff = 1 + (n - 1)(1 - rho),   g = n_eff / n

    so n equal deltas count once (their mean), n orthogonal ones almost n times (their sum), and one delta
    exactly once. ``n_eff`` is kept at least ``min(n, floor)``, ``floor`` 2 by default. Its limit: many
    replicas' deltas of a row in the linear regime also point the same way (the data's mean gradient
    dominates), so it averages some of what should be summed; the ``pairs`` kernel's deltas combine better by
    contraction, ``hogbatch``'s by alignment."""
    dim = deltas.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        if not _joins_round(i, r, deltas, acc, bit, now, window, S, A, Q, P, C, n, g, mask, t0, out, out_acc):
            continue
        ss = np.float32(0.0)                     # |S + delta|^2
        for d in range(dim):
            s = S[r, d] + deltas[i, d]
            ss += s * s
        rho = min(np.float32(1.0), ss / (n[r] * Q[r])) if Q[r] > 0 else np.float32(1.0)
        n_eff = max(1.0 + (n[r] - 1) * (1.0 - rho), min(np.float32(n[r]), floor))
        _reweigh(i, r, np.float32(n_eff / n[r]), deltas, acc, S, A, g, out, out_acc)


@njit(nogil=True, cache=True)
def _merge_by_contraction(rows, deltas, acc, contraction, scale, bit, now, window, S, A, Q, P, C, n, g, mask, t0,
                          out, out_acc):
    """The contraction rule: the replica measures which case a row is in while it trains. On a quadratic, a step
    of rate ``eta`` along a direction of curvature ``h`` leaves ``1 - eta h`` of the way to the optimum; steps of
    total contraction ``c = sum eta h`` leave ``e^-c`` of it. So a replica whose steps on a row added up to
    ``c_i`` (``sgns_kernel.train_inplace_rows`` sums ``rate * s'(f) |x|^2`` per step) went ``a_i = 1 - e^-c_i`` of
    the way, and one process that had taken all of the round's steps would have gone ``1 - e^-C``,
    ``C = sum_i c_i``. With the k replicas' deltas ``d_i = a_i (e - base)`` of a round, the row gets

        g * sum_i d_i,      g = (1 - e^-C) / sum_i (1 - e^-c_i)

    which is the sum when every ``c_i`` is small (``g -> 1``: independent steps add up), the mean when every
    replica saturated (``g -> 1/k``), one delta exactly once, and in between what the composition of the
    replicas' contractions gives (the same formula, averaged over the orders the replicas could have trained
    in). The measured ``c`` is scaled by ``CONTRACTION_SCALE`` (below)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if not _joins_round(i, r, deltas, acc, bit, now, window, S, A, Q, P, C, n, g, mask, t0, out, out_acc):
            continue
        c = max(np.float64(contraction[i]) * scale, 0.0)
        P[r] += -np.expm1(-c)                  # how far this replica went towards its optimum
        C[r] += c
        covered = -np.expm1(-C[r])             # how far one process would have gone on all of it
        _reweigh(i, r, np.float32(covered / P[r]) if P[r] > 1e-12 else np.float32(1.0), deltas, acc, S, A, g,
                 out, out_acc)


# The measured contraction sums rate * s' * |x|^2 over a row's steps, as if every step pulled along one direction;
# the steps of a row point different ways (its contexts, its negatives), so the contraction along the delta is a
# fraction of that. Chosen by ``bench/replica_simulation.py --contraction-scale``
# (docs/design/0001-replica-exchange.md).
CONTRACTION_SCALE = 0.3


class ConcurrentMerge:
    """Per-row round state of a shard's delta merge (see the module docstring)."""

    def __init__(self, dim: int, window: float, floor: float = 2.0, contraction_scale: float = CONTRACTION_SCALE):
        if window <= 0:
            raise ValueError("the merge window must be > 0 seconds")
        self.dim = int(dim)
        self.window = float(window)
        self.floor = float(floor)
        self.contraction_scale = float(contraction_scale)
        self._alloc(0)
        self._last_seen: dict[int, float] = {}   # sender -> when its last delta arrived

    def alone(self, sender: int, now: float) -> bool:
        """No other sender's delta arrived within two windows, so every round of ``sender``'s rows holds this delta
        alone, and either rule adds one delta exactly once: it is added as it is, without the rounds' bookkeeping
        (a host's shared replica syncs as one sender: on 2 workers sharing one, the rounds were 30 % of a server's
        CPU). When a second sender appears, its first deltas start rounds of their own rather than joining the
        first sender's of the last window; from then on the rounds are kept again."""
        self._last_seen[sender] = now
        horizon = now - 2 * self.window
        for other, seen in list(self._last_seen.items()):
            if seen < horizon:
                del self._last_seen[other]
        return len(self._last_seen) == 1

    def _alloc(self, cap: int) -> None:
        old = getattr(self, "S", None)
        S = np.zeros((cap, self.dim), np.float32)
        A, Q, g = (np.zeros(cap, np.float32) for _ in range(3))
        P, C = np.zeros(cap, np.float64), np.zeros(cap, np.float64)
        n = np.zeros(cap, np.int32)
        mask = np.zeros(cap, np.int64)
        t0 = np.full(cap, -np.inf)
        if old is not None:
            k = old.shape[0]
            S[:k], A[:k], Q[:k], g[:k], n[:k], mask[:k], t0[:k], P[:k], C[:k] = \
                self.S, self.A, self.Q, self.g, self.n, self.mask, self.t0, self.P, self.C
        self.S, self.A, self.Q, self.g, self.n, self.mask, self.t0 = S, A, Q, g, n, mask, t0
        self.P, self.C = P, C

    def forget(self, rows: np.ndarray) -> None:
        """Rows freed or reused: their next delta starts a round."""
        if len(rows):
            self.t0[rows[rows < self.t0.shape[0]]] = -np.inf

    def combine(self, rows: np.ndarray, deltas: np.ndarray, accum_deltas: np.ndarray, sender: int,
                now: float, contraction: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """What to add to ``rows`` (float32 [n, dim]) and to their accumulators ([n]) for the deltas
        of ``sender`` (a ps-lite node id) arriving at ``now`` (seconds, monotonic)."""
        need = int(rows.max()) + 1 if len(rows) else 0
        if need > self.S.shape[0]:
            self._alloc(max(need, 2 * self.S.shape[0], 1024))
        out = np.empty((len(rows), self.dim), np.float32)
        out_acc = np.empty(len(rows), np.float32)
        bit = np.array([1 << ((int(sender) >> 1) % 64)], dtype=np.uint64).view(np.int64)[0]
        if contraction is not None:
            _merge_by_contraction(np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(deltas, np.float32),
                                  np.ascontiguousarray(accum_deltas, np.float32).reshape(-1),
                                  np.ascontiguousarray(contraction, np.float32).reshape(-1), self.contraction_scale,
                                  bit, float(now), self.window, self.S, self.A, self.Q, self.P, self.C, self.n,
                                  self.g, self.mask, self.t0, out, out_acc)
            return out, out_acc
        _merge(np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(deltas, np.float32),
               np.ascontiguousarray(accum_deltas, np.float32).reshape(-1), bit, float(now), self.window, self.floor,
               self.S, self.A, self.Q, self.P, self.C, self.n, self.g, self.mask, self.t0, out, out_acc)
        return out, out_acc
