"""k worker replicas against one shard, in one process, deterministically: how the delta exchange learns.

    .venv/bin/python bench/replica_simulation.py [--workers 8] [--max-tokens 3000000] [--sync-tokens 25000]
        [--merge contraction|align|sum] [--seeds]
    .venv/bin/python bench/replica_simulation.py --seeds --sweep 1,2,4,8,16,32,64 [--round-tokens 80000]
    .venv/bin/python bench/replica_simulation.py --seeds --workers 16 --sync-tokens 625 [--lag 0.5 | --jitter 0.3]

Why: the real pipeline (``cluster_learning.py``) mixes the exchange's arithmetic with Kafka, scheduling
and load on two cores, and one run takes minutes. This runs the same pieces (``Trainer`` with its in-place
kernel, ``ReplicaShard`` collect/apply, ``EmbeddingShard.add_deltas`` with the fresh-row rule and the
concurrent merge, the cluster's word counts) in rounds: every worker trains ``--sync-tokens`` tokens of
its own share of the corpus (5,000-token batches, dealt round-robin), then every worker syncs, in order.
So staleness and concurrency are exact and repeatable, and a change to how deltas combine is judged in
about a minute. It is a model of the exchange, not a measurement of the product: no threads, no
network, no timing. Prints gensim's evaluators on the shard's input rows (analogy, WS353, SimLex) and
the norms of the most frequent words' rows (a diverging exchange shows as norms of 30 - 70 against ~2).
``--lag`` and ``--jitter`` bring in two things the lockstep rounds leave out: training while a sync is in flight,
and replicas that sync on their own clocks (the first costs quality, the second does not:
``docs/design/0001-replica-exchange.md``).
``--sweep`` runs several cluster sizes on the same tokens with the same tokens per sync interval for the
whole cluster, and prints a table against the first (1 replica: one shared model).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from online.cluster.delta_rows import take_deltas       # noqa: E402
from online.cluster.replica import REFRESH_SHARE, ReplicaShard, TrainableJournal, summed_counts  # noqa: E402
from online.cluster.server import MERGE_WINDOW_SYNCS     # noqa: E402
from online.learner.concurrent_merge import CONTRACTION_SCALE  # noqa: E402
from online.learner.embedding_shard import EmbeddingShard  # noqa: E402
from online.learner.keys import word_key, word_rows      # noqa: E402
from online.learner.trainer import LearnerConfig, Trainer, kernel_for  # noqa: E402
from quality_vs_gensim import evaluate                   # noqa: E402
from stream_throughput import DEFAULT_CORPUS, read_prefix  # noqa: E402

BATCH_TOKENS = 5_000


class SimulatedReplica:
    """The ``ParamStore`` of one simulated worker: ``online.cluster.replica.ReplicaStore`` without ps-lite."""

    counts_every_word = True

    def __init__(self, server: EmbeddingShard, dim: int, node_id: int, seed: int, shard: ReplicaShard | None = None,
                 refresh_share: float = REFRESH_SHARE.default):
        self.server, self.dim, self.node_id = server, dim, node_id
        self.shared = shard is not None     # one replica for all workers, as threads would share it: no deltas
        self.contraction = True             # send each row's contraction (the merge's contraction rule)
        self.stale_refresh = True           # refresh held rows the servers changed (``ReplicaShard.mark_stale``)
        self.fetch_new_rows = True          # the cluster's new words held, fetched before they are trained
        self.seen_version = 0
        self.rows_sent = 0
        self.lag = False                    # answers applied one interval late (``--lag``)
        self.pending: list = []
        self.shard = shard if shard is not None else ReplicaShard(dim, refresh_share, optimizer="rowadagrad",
                                                                  seed=seed)
        self.on_totals = None
        self.on_trainable = None
        self.journal = TrainableJournal(1)
        self._counts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def local_shard(self):
        return self.shard

    def pull(self, keys):
        return self.shard.pull(keys)

    def push(self, keys, grads):
        self.shard.push(keys, grads)

    def free(self, keys):
        self.shard.free(keys)

    def add_counts(self, keys, deltas):
        self.count_words(np.full(len(keys), -1, np.int64), keys, deltas)

    def count_words(self, slots, keys, deltas):
        self._counts.append((np.asarray(slots, np.int64).copy(), np.asarray(keys, np.uint64).copy(),
                             np.asarray(deltas, np.int64).copy()))

    def set_words(self, keys, words):
        pass

    def sync(self, now: float) -> None:
        if self._counts:
            uniq, summed, last = summed_counts(self._counts)
            self._counts = []
            totals = self.server.count_words(uniq, np.rint(summed).astype(np.int64))
            if self.on_totals is not None:
                self.on_totals(last, uniq, totals)
        if self.on_trainable is not None:
            generation, since = self.journal._at[0]
            new = self.journal.answer(0, self.server.trainable_since(generation, since))
            if self.journal.changed:
                self.journal.changed = False
                self.on_trainable(self.journal.known(), new)
                if self.fetch_new_rows and len(new) and not self.shared:   # held before this replica meets them
                    self.shard.rows_for(word_rows(np.asarray(new, np.uint64)), create=True)   # (no bound here)
        if self.shared:
            return
        created = self.shard.take_created()
        if self.fetch_new_rows and len(created):   # the cluster's values of rows new here, before they are trained
            self.shard.adopt(created, self.server.read_rows(created))
            self.rows_sent += len(created)
        if self.stale_refresh:   # the rows the servers changed since the last sync, refreshed by this one
            self.seen_version, changed = self.server.changed_keys_since(self.seen_version, asker=self.node_id)
            self.shard.mark_stale(changed)
        keys, deltas, fresh = self.shard.collect()
        self.rows_sent += len(keys)
        answers = []
        for pick, is_fresh in ((~fresh, False), (fresh, True)):
            dim = self.dim
            merged = self.server.add_deltas(keys[pick], deltas[pick, :dim], deltas[pick, dim], fresh=is_fresh,
                                            sender=self.node_id, now=now,
                                            contraction=deltas[pick, dim + 1] if self.contraction else None)
            answers.append((keys[pick], merged))
        if self.lag:   # the answer arrives while the next interval trains (``simulate`` applies it)
            self.apply_pending()
            self.pending = answers
        else:
            for k, merged in answers:
                self.shard.apply(k, merged)
        self.shard.release_freed()

    def apply_pending(self) -> None:
        for k, merged in self.pending:
            self.shard.apply(k, merged)
        self.pending = []

    def sync_hot(self, keys: np.ndarray, now: float) -> None:
        """Only the rows of ``keys`` held here and known to the servers: the hot tier, synced between the full syncs
        (their stamps stay, so the next full sync sends them again, with only what was trained since)."""
        if self.shared:
            return
        shard, dim = self.shard, self.dim
        rows = shard.rows_for(keys, create=False)
        pick = rows >= 0
        pick[pick] = shard.confirmed[rows[pick]]
        keys, rows = keys[pick], rows[pick]
        if not len(rows):
            return
        out = np.empty((len(rows), dim + 2), dtype=np.float32)
        take_deltas(shard.vectors, shard.accum, shard.base, shard.base_acc, shard.contraction, rows.astype(np.int64),
                    out)
        self.rows_sent += len(keys)
        shard.apply(keys, self.server.add_deltas(keys, out[:, :dim], out[:, dim], fresh=False, sender=self.node_id,
                                                 now=now, contraction=out[:, dim + 1] if self.contraction else None))


def simulate_async(args, workers, batches, per_sync: int, server: EmbeddingShard) -> int:
    """``--jitter``: the replicas sync when their own clocks say so, not in lockstep. Each trains ``per_sync``
    batches per interval, and an interval lasts a lognormal time (median 1, sigma ``--jitter``), as processes
    time-slicing two cores do; the merge window is ``MERGE_WINDOW_SYNCS`` intervals, as on the servers. So
    rounds fragment (a replica that syncs twice while another has not synced once ends the round), which the
    lockstep mode never shows. A replica's training only reads its own rows, so training a whole interval at
    its sync's moment is exact."""
    import heapq
    rng = np.random.default_rng(7)
    server.merge_window = float(args.window_syncs)
    clock = [(float(rng.uniform(0, 1)), i) for i in range(len(workers))]
    heapq.heapify(clock)
    b = syncs = 0
    while b < len(batches):
        now, i = heapq.heappop(clock)
        trainer, store = workers[i]
        for _ in range(per_sync):
            if b < len(batches):
                trainer.train_records(batches[b])
                b += 1
        store.sync(now)
        syncs += 1
        heapq.heappush(clock, (now + float(rng.lognormal(0.0, args.jitter)), i))
        if syncs % len(workers) == 0:
            print(f"\r{len(workers)} replicas, {syncs:,} syncs: {b:,} batches", end="",
                  file=sys.stderr)
    for _, store in workers:   # the last intervals' work
        store.sync(now + 1.0)
    return syncs // len(workers)


def hot_keys(server: EmbeddingShard, words: list[str], n: int) -> np.ndarray:
    """The input and output rows' keys of the ``n`` words the cluster counted most."""
    if not n or not words:
        return np.zeros(0, np.uint64)
    keys = np.array([word_key(w) for w in words], np.uint64)
    top = keys[np.argsort(-server.word_counts.totals(keys), kind="stable")[:n]]
    return np.sort(word_rows(top))


def simulate(args, workers_n: int, sync_tokens: int, tokens: list[str]) -> dict:
    """One run: ``workers_n`` replicas, each training ``sync_tokens`` tokens between syncs."""
    batch_tokens = max(100, min(args.batch_tokens, sync_tokens))
    records = [" ".join(tokens[i:i + 100]) for i in range(0, len(tokens), 100)]
    per_batch = max(1, batch_tokens // 100)
    batches = [records[i:i + per_batch] for i in range(0, len(records), per_batch)]
    server = EmbeddingShard(100, optimizer="rowadagrad", seed=1, min_count=args.min_count, word_capacity=200_000)
    if args.merge in ("align", "contraction"):
        server.merge_window = 0.5          # rounds are 1 "second" apart: a round ends with it at the latest
        server._merge.floor = args.floor
        server._merge.contraction_scale = args.contraction_scale
        if args.acc == "sum":
            combine = server._merge.combine

            def combine_summing_accumulators(rows, deltas, accum_deltas, sender, now, contraction=None):
                out, _ = combine(rows, deltas, accum_deltas, sender, now, contraction)
                return out, np.asarray(accum_deltas, np.float32).reshape(-1)
            server._merge.combine = combine_summing_accumulators
    config = LearnerConfig(dim=100, vocab_capacity=200_000, min_count=args.min_count, eta=args.eta,
                           kernel=kernel_for(args.kernel, 1 if args.shared_replica else workers_n))
    workers = []
    shared = ReplicaShard(100, optimizer="rowadagrad", seed=1) if args.shared_replica else None
    for i in range(workers_n):
        store = SimulatedReplica(server, 100, 9 + 2 * i, seed=1, shard=shared, refresh_share=args.refresh_share)
        trainer = Trainer(config, store)
        if args.seeds:
            trainer.reseed(9 + 2 * i)
        store.on_totals = trainer.apply_cluster_counts
        if not args.no_journal:
            store.on_trainable = trainer.learn_cluster_trainable
        store.contraction = args.merge == "contraction"
        store.stale_refresh = not args.no_stale_refresh
        store.fetch_new_rows = not args.no_prefetch
        store.lag = args.lag > 0
        workers.append((trainer, store))
    t0 = time.perf_counter()
    per_sync = max(1, sync_tokens // batch_tokens)
    b = rounds = 0
    hot = np.zeros(0, np.uint64)
    if args.jitter > 0:
        rounds = simulate_async(args, workers, batches, per_sync, server)
    while b < len(batches) and not args.jitter:
        rounds += 1
        if args.hot_rows and rounds % 10 == 1:
            hot = hot_keys(server, sorted({w for trainer, _ in workers for w in trainer.export()[0]}), args.hot_rows)
        if not args.hot_rows:
            for trainer, store in workers:
                records = [r for batch in batches[b:b + per_sync] for r in batch]
                b += per_sync
                early = int(round(args.lag * len(records)))   # trained before the last sync's answer arrives
                if early:
                    trainer.train_records(records[:early])
                store.apply_pending()
                if records[early:]:
                    trainer.train_records(records[early:])
        for j in range(per_sync if args.hot_rows else 0):   # the replicas' j-th batches, then the hot tier's sync
            for trainer, _ in workers:
                if b < len(batches):
                    trainer.train_records(batches[b])
                    b += 1
            if len(hot) and j < per_sync - 1:
                for _, store in workers:
                    store.sync_hot(hot, rounds + (j + 1) / (per_sync + 1))
        for _, store in workers:
            store.sync(float(rounds))
        print(f"\r{workers_n} replicas, round {rounds}: {min(b, len(batches)) * batch_tokens:,} tokens", end="",
              file=sys.stderr)
    print(file=sys.stderr)

    words = sorted({w for trainer, _ in workers for w in trainer.export()[0]})
    keys = np.array([word_key(w) for w in words], np.uint64)
    order = np.argsort(-server.word_counts.totals(keys), kind="stable")
    words, keys = [words[i] for i in order], keys[order]
    model = shared if shared is not None else server
    rows = model.rows_for(keys, create=False)
    held = rows >= 0
    from gensim.models import KeyedVectors
    kv = KeyedVectors(100)
    kv.add_vectors([w for w, h in zip(words, held) if h], model.vectors[rows[held]])
    quality = evaluate(kv)
    out_rows = model.rows_for(word_rows(keys[:10])[10:], create=False)
    kept = sum(trainer.totals.kept for trainer, _ in workers)
    rows_sent = sum(store.rows_sent for _, store in workers)
    return {"replicas": workers_n, "sync_tokens": sync_tokens, "rounds": rounds, "seconds": time.perf_counter() - t0,
            "kept": kept, "tokens": len(tokens), "pairs": sum(trainer.totals.pairs for trainer, _ in workers),
            "rows_per_token": rows_sent / max(kept, 1), **quality,
            "norms_in": np.linalg.norm(model.vectors[rows[:10]], axis=1).round(1).tolist(),
            "norms_out": np.linalg.norm(model.vectors[out_rows], axis=1).round(1).tolist()}


def report(args, r: dict) -> None:
    print(f"replica_simulation: {r['replicas']} replicas, {r['tokens']:,} tokens, {r['sync_tokens']:,} tokens per "
          f"replica per sync, merge {args.merge}"
          + (f" (floor {args.floor}, accumulators {args.acc})" if args.merge == "align" else
             f" (scale {args.contraction_scale})" if args.merge == "contraction" else "")
          + f", {'own' if args.seeds else 'shared'} sampling streams, eta {args.eta or 'default'}, refresh share "
          f"{args.refresh_share}{'' if args.no_stale_refresh else ' + the rows the servers changed'}, "
          f"{'rows new to a replica from init' if args.no_prefetch else 'new words prefetched'}, "
          f"{r['rounds']} rounds, {r['seconds']:.0f} s")
    print(f"trained: {r['kept']:,} tokens kept ({r['kept'] / r['tokens']:.1%} of those read), {r['pairs']:,} pairs; "
          f"{r['rows_per_token']:.2f} rows synced per kept token (each way)")
    print(f"analogy {r['analogy']:.2%}  WS353 {r['ws353']:.3f}  SimLex {r['simlex']:.3f}  "
          f"vocabulary {r['vocabulary']:,}")
    print("norms of the 10 most frequent words, input rows:", r["norms_in"], "output rows:", r["norms_out"],
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--max-tokens", type=int, default=3_000_000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--sync-tokens", type=int, default=25_000, help="tokens each worker trains between its syncs")
    ap.add_argument("--sweep", default="",
                    help="replica counts to run one after the other (e.g. 1,2,4,8,16,32,64), each replica syncing "
                         "after --round-tokens / replicas tokens: the cluster trains the same tokens per sync "
                         "interval whatever its size (its throughput is fixed, as on this machine)")
    ap.add_argument("--round-tokens", type=int, default=80_000,
                    help="with --sweep: tokens the whole cluster trains between two syncs of each replica")
    ap.add_argument("--contraction-scale", type=float, default=CONTRACTION_SCALE,
                    help="contraction merge: the measured contraction's weight "
                         f"(online.learner.concurrent_merge.CONTRACTION_SCALE, {CONTRACTION_SCALE})")
    ap.add_argument("--merge", choices=("sum", "align", "contraction"), default="contraction",
                    help="how the shard combines concurrent deltas (online.learner.concurrent_merge; contraction: "
                         "by the rows' measured contraction, the servers' rule for pairs replicas; align: by the "
                         "deltas' alignment, their rule for hogbatch replicas, which send no contraction)")
    ap.add_argument("--floor", type=float, default=2.0, help="the merge's floor (align only)")
    ap.add_argument("--shared-replica", action="store_true",
                    help="diagnostic: every worker trains one shared replica (threads, no deltas); each keeps its "
                         "own vocabulary, noise table and sampling, and the servers still count the words")
    ap.add_argument("--no-stale-refresh", action="store_true",
                    help="diagnostic: held rows the servers changed wait for the refresh turn")
    ap.add_argument("--min-count", type=int, default=5)
    ap.add_argument("--no-journal", action="store_true",
                    help="diagnostic: workers learn trainability only from the totals of the words they report")
    ap.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS, help=f"tokens per batch ({BATCH_TOKENS})")
    ap.add_argument("--seeds", action="store_true", help="each worker its own sampling stream (as the workers do)")
    ap.add_argument("--acc", choices=("merged", "sum"), default="merged",
                    help="align and contraction: the AdaGrad accumulator increments get the merge's weight "
                         "(merged), or are summed in full (sum)")
    ap.add_argument("--refresh-share", type=float, default=REFRESH_SHARE.default,
                    help="rows not changed by a worker that its sync refreshes, as a share of the changed ones "
                         f"(LIVEVEC_REFRESH_SHARE, {REFRESH_SHARE.default}; 1000: every held row)")
    ap.add_argument("--hot-rows", type=int, default=0,
                    help="experiment: the rows of the N most counted words also sync after every batch (a hot tier, "
                         "as pWord2Vec's); with --batch-tokens below the tokens per sync")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="diagnostic: rows of words new to a replica start from the initial value with an empty "
                         "accumulator instead of the servers' values, fetched when the cluster makes the "
                         "word trainable (ReplicaStore._hold_new_words)")
    ap.add_argument("--lag", type=float, default=0.0,
                    help="the share of the next interval a replica trains before its sync's answer arrives (a round "
                         "trip that long: training goes on while a sync is in flight, as in the workers; lockstep "
                         "mode without --hot-rows)")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="replicas sync on their own clocks: each interval lasts lognormal(0, JITTER) (0: lockstep "
                         "rounds)")
    ap.add_argument("--window-syncs", type=float, default=float(MERGE_WINDOW_SYNCS),
                    help=f"with --jitter: the servers' merge window in median intervals ({MERGE_WINDOW_SYNCS}, as "
                         "online.cluster.server sets it)")
    ap.add_argument("--kernel", default=LearnerConfig.kernel,
                    help="the in-place kernel (LIVEVEC_KERNEL; auto: as a worker of a cluster of --workers picks it)")
    ap.add_argument("--eta", type=float, default=None,
                    help="the workers' AdaGrad step (default: the kernel's, 0.1 for pairs and 0.2 for hogbatch)")
    args = ap.parse_args()

    print(f"load average at start: {os.getloadavg()}", flush=True)
    tokens = " ".join(read_prefix(Path(args.corpus), args.max_tokens)).split()
    if not args.sweep:
        report(args, simulate(args, args.workers, args.sync_tokens, tokens))
        return 0
    results = []
    for k in [int(x) for x in args.sweep.split(",") if x.strip()]:
        r = simulate(args, k, max(100, args.round_tokens // k), tokens)
        report(args, r)
        results.append(r)
    one = results[0]
    print(f"\n| replicas | tokens per replica per sync | analogy | vs {one['replicas']} | WS353 | vs {one['replicas']} "
          f"| SimLex | rows synced per token |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['replicas']} | {r['sync_tokens']:,} | {r['analogy']:.2%} | {100 * (r['analogy'] - one['analogy']):+.2f} "
              f"| {r['ws353']:.3f} | {r['ws353'] - one['ws353']:+.3f} | {r['simlex']:.3f} | {r['rows_per_token']:.2f} |")
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
