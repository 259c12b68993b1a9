"""What a streaming worker reports on ``/metrics``: its progress, its errors and where its CPU goes.

Apart from the worker so that a dashboard's or an alert's author finds the whole list in one place, without
reading how the worker trains.
"""
from __future__ import annotations

import threading
import time

from online.cluster import token_cost
from ps_bridge.metrics import Registry


class WorkerMetrics:
    def __init__(self, registry: Registry):
        r = registry
        self.batches = r.counter("livevec_worker_batches_total", "mini-batches trained and acknowledged")
        self.records = r.counter("livevec_worker_records_total", "Kafka records trained")
        self.tokens = r.counter("livevec_worker_tokens_total", "tokens read")
        self.words = r.counter("livevec_worker_words_trained_total", "tokens trained after subsampling")
        self.pairs = r.counter("livevec_worker_pairs_total", "(centre, context) pairs trained")
        self.errors = r.counter("livevec_worker_batch_errors_total", "batch attempts that failed (retried)")
        self.skipped = r.counter("livevec_worker_records_skipped_total",
                                 "records of batches that could not be trained at all (logged with their offsets)")
        self.batch_seconds = r.histogram("livevec_worker_batch_seconds",
                                         "training time of a batch (replica: the kernel; pullpush: pull + kernel + push)")
        self.lag = r.gauge("livevec_worker_kafka_lag", "records behind the high watermark, summed over partitions")
        self.inflight = r.gauge("livevec_worker_inflight_batches", "batches being trained now")
        self.words_per_second = r.gauge("livevec_worker_words_per_second", "tokens read per second (recent)")
        self.unsynced = r.gauge("livevec_worker_unsynced_tokens",
                                "tokens trained into the replica whose deltas the servers have not acknowledged")
        self.bound_wait = r.counter("livevec_worker_bound_wait_seconds_total",
                                    "seconds the worker started no batch because its unsynced tokens reached the "
                                    "bound (LIVEVEC_SYNC_TOKENS): its syncs do not keep up with its training")
        # Where a worker's CPU per token goes: each stage's thread CPU, measured where it runs; what
        # the process spends beyond these and the event loop is ps-lite's I/O threads, reports and the GC.
        self.cpu = {stage: r.counter("livevec_worker_cpu_seconds_total", help_text, stage=stage)
                    for stage, help_text in (
                        ("prepare", "thread CPU seconds by stage: tokenising and preparing batches (under the GIL)"),
                        ("kernel", "thread CPU seconds by stage: the training kernel (without the GIL)"),
                        ("sync", "thread CPU seconds by stage: the replica's syncs (collect, send, apply)"))}
        loop_clock = time.pthread_getcpuclockid(threading.get_ident())   # made on the event loop's thread
        self.loop_cpu = r.gauge("livevec_worker_event_loop_cpu_seconds",
                                "CPU seconds of the event loop's thread: Kafka fetches and decoding, batching, "
                                "the ledger and commits", fn=lambda: time.clock_gettime(loop_clock))
        # The process's CPU and ps-lite bytes per token it trained, over the last minute
        self.cost = token_cost.export(r, lambda: self.tokens.value)
