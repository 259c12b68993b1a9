"""What a search process adds beside a front end's model, and how fast it answers.

Loads the synthetic model of ``--words`` words in this process with the search's arrays in shareable memory (as the
front end does with ``LIVEVEC_SEARCH_PROCESSES``), builds its inverted file, starts ``--processes`` search processes,
answers the same queries here and through them (checking the answers are identical), and prints this process's RSS
and each search process's private, shared and proportional memory (``/proc/<pid>/smaps_rollup``) after it has
searched. Its private memory is what one more process on the host costs.

    python bench/search_processes.py --words 10000000 --processes 2
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--queries", type=int, default=2000)
    args = parser.parse_args()
    from online.search import shared_arrays
    shared_arrays.enable()
    from online.frontend.synthetic import SyntheticSource
    from online.search import ivf_build
    from online.search.delta import ModelDelta
    from online.search.model_index import ModelIndex, SearchConfig, warm_up
    from online.search.search_processes import SearchProcesses, memory_of

    print(f"load average {'/'.join(f'{x:.2f}' for x in os.getloadavg())}; {args.words:,} words x {args.dim}",
          flush=True)
    warm_up()
    started = time.perf_counter()
    index = ModelIndex.empty(SearchConfig()).apply(SyntheticSource(n=args.words, dim=args.dim)._changes_since(0))
    built = ivf_build.build(lambda: index, None, seed=0)
    index.store.pending_ivf = built
    index = index.apply(ModelDelta.unchanged(index.version + 1, args.dim))
    print(f"model and {index.ivf.lists} lists ready in {time.perf_counter() - started:.1f} s; this process "
          f"{memory_of(os.getpid())['rss'] / 1e9:.2f} GB RSS", flush=True)
    rng = np.random.default_rng(0)
    rows = rng.choice(index.n, args.queries, replace=False)
    queries = index.unit_rows(rows)
    exclude = [[int(r)] for r in rows]
    procs = SearchProcesses(args.processes)
    procs.start()
    try:
        procs.search_rows(index, queries[:1], exclude[:1], [10])          # each process warms up
        t = time.perf_counter()
        local = [index.search_rows(queries[i:i + 1], exclude[i:i + 1], [10]) for i in range(args.queries)]
        local_s = time.perf_counter() - t
        remote: list = [None] * args.queries

        def ask(lo: int) -> None:
            for i in range(lo, args.queries, args.processes):
                remote[i] = procs.search_rows(index, queries[i:i + 1], exclude[i:i + 1], [10])

        threads = [threading.Thread(target=ask, args=(lo,)) for lo in range(args.processes)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        remote_s = time.perf_counter() - t
        same = all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
                   for a, b in zip(local, remote))
        owner = memory_of(os.getpid())
        print(f"{args.queries} queries one at a time: here {args.queries / local_s:,.0f}/s, through {args.processes} "
              f"processes {args.queries / remote_s:,.0f}/s; identical answers: {same}; fallbacks "
              f"{procs.counters['fallbacks']}", flush=True)
        print(f"this process: RSS {owner['rss'] / 1e9:.2f} GB, private {owner['private'] / 1e9:.2f} GB, "
              f"shared {owner['shared'] / 1e9:.2f} GB", flush=True)
        for p in procs.memory():
            print(f"search process {p['pid']}: private {p['private'] / 1e6:.0f} MB "
                  f"({100 * p['private'] / owner['rss']:.2f} % of this process's RSS), shared "
                  f"{p['shared'] / 1e9:.2f} GB, PSS {p['pss'] / 1e9:.2f} GB, RSS {p['rss'] / 1e9:.2f} GB", flush=True)
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
