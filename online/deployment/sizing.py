"""Memory per role, derived from the model size and measured baselines, so that rescaling re-derives it.

Marathon's ``mem`` and the Kubernetes memory limits are hard cgroup limits (an OOM kill, not a slowdown), so
every figure here says where it comes from, and each app's ``livevec.mem-basis`` label repeats the derivation.

The workers' replica lives in a segment of shared memory that all worker processes of a host (Marathon) or pod
(Kubernetes) map (``LIVEVEC_HOST_REPLICA``, ``online.cluster.host_replica``). Its pages are charged to the
process that reserves them at creation (``posix_fallocate``), and any worker may be that one, so every worker's
limit holds the whole segment; but the host holds it once, which is what a Kubernetes pod requests
(``Resources.shared_mib``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from online.cluster.segment_layout import segment_layout


@dataclass(frozen=True)
class Resources:
    cpus: float
    mem_mib: int
    disk_mib: int
    basis: str  # how mem_mib was derived; shown in the runbook and as a label
    # Of mem_mib, memory the role's processes of one host share (the host replica's segment): in each limit,
    # since whichever process creates it is charged, but requested once per pod.
    shared_mib: int = 0

    def pod_request_mib(self, processes: int) -> int:
        """What one of ``processes`` containers sharing a pod requests: its own memory and its share of the
        shared segment, so that the pod requests the segment once."""
        return self.mem_mib - self.shared_mib + math.ceil(self.shared_mib / max(processes, 1))


@dataclass(frozen=True)
class Capacity:
    """Planning numbers that memory limits are derived from (see ``size_resources``)."""

    model_words: int = 1_000_000  # vocabulary the cluster is sized for
    dim: int = 100
    # AdaGrad keeps one float32 accumulator per float32 parameter.
    optimizer_floats_per_value: int = 1
    # EmbeddingShard doubles its row arrays when full, so up to 2x the rows in use are
    # resident (np.full touches every page of the grown arrays).
    server_row_growth: float = 2.0
    # Per word on a server beyond the row arrays: key index, word string, count, version
    # and push temporaries. Measured: an EmbeddingShard (dim 100, AdaGrad) holding 300k
    # words (600k rows in a 1,048,576-row capacity, 1.75x) peaked at 3,987 B/word of RSS
    # above the import baseline; the row arrays account for 2 x 1.75 x 824 B = 2,884 B.
    server_bytes_per_word: int = 1100
    # Per word in a front-end replica, at its peak: two float32 copies of the row (the row store, and the
    # full load's buffer or a sync's out-of-place rows while the index is rebuilt) plus the int8 codes, the
    # inverted lists, the word arena and the key index. Measured with bench/query_load.py: 1M words x 100
    # dims peak at 1.09 GB of RSS (0.95 GB steady), 10M at 8.92 GB (7.51 steady), so about 1,020 and
    # 890 B/word at the peak; the rule gives 2 x 400 + 220 = 1,020 at dim 100.
    frontend_float_copies: int = 2
    frontend_bytes_per_word: int = 220
    # Baselines: peak RSS (VmHWM) of the real roles started from the committed group by the
    # local runner, training 20k lines (dim 100, 170 words, so almost no model): scheduler
    # 40 MiB, server 164 MiB, worker 268 MiB (numba + aiokafka + batches), front end
    # (ps source) 57 MiB. Rounded up. Imports alone: numpy + pyzmq 27 MiB, + numba 91 MiB.
    baseline_mib: Mapping[str, int] = field(default_factory=lambda: {
        "scheduler": 48, "server": 176, "worker": 160, "frontend": 64, "export": 128})
    # Worker working set beyond the baseline: Kafka fetch buffers (1 MiB per assigned
    # partition), in-flight mini-batches with their pulled rows, the online vocabulary and
    # noise table, a sync's deltas (the measured 268 MiB peak is baseline + ~110 MiB of this).
    worker_working_set_mib: int = 256
    # A worker's vocabulary (LIVEVEC_VOCAB_CAPACITY, set on the workers to this): ~200 B an entry in each
    # process. Frequent words stay (Misra-Gries); the servers keep every word's rows and counts.
    worker_vocab_words: int = 200_000
    worker_vocab_entry_bytes: int = 200
    # The host replica reserves two rows per vocabulary word (LIVEVEC_HOST_REPLICA_ROWS' default, 0: twice
    # LIVEVEC_VOCAB_CAPACITY), all at creation and never more: no growth factor. Row-wise AdaGrad
    # (LIVEVEC_OPTIMIZER's default on workers) keeps one accumulator per row.
    worker_accum_width: int = 1
    # Limits are hard cgroup limits on Marathon (OOM kill): checkpoint serialisation of a
    # shard can transiently double part of it, and Mesos health-check helpers run inside
    # the task's resources.
    headroom: float = 1.5
    # Servers: the growth worst case is already in the per-word figure.
    server_headroom: float = 1.25

    @property
    def host_replica_rows(self) -> int:
        return 2 * self.worker_vocab_words

    @property
    def host_replica_mib(self) -> float:
        return host_replica_bytes(self.dim, self.host_replica_rows, self.worker_accum_width) / 2**20


def host_replica_bytes(dim: int, rows: int, accum_width: int) -> int:
    """The size of a host replica's segment file, from the layout the workers map (``segment_layout``, which
    imports neither numpy nor numba)."""
    return segment_layout(dim, rows, accum_width)[2]


def round_up(mib: float, quantum: int = 64) -> int:
    return int(math.ceil(mib / quantum) * quantum)


def size_resources(role: str, capacity: Capacity, servers: int) -> Resources:
    """Memory per role from the model size, so rescaling servers re-derives the limit."""
    base = capacity.baseline_mib[role]
    if role == "server":
        row_bytes = 4 * capacity.dim * (1 + capacity.optimizer_floats_per_value) + 32  # + key, versions, count
        per_word = int(2 * capacity.server_row_growth * row_bytes + capacity.server_bytes_per_word)  # syn0 + syn1neg
        shard_mib = capacity.model_words / max(servers, 1) * per_word / 2**20
        mem = round_up((base + shard_mib) * capacity.server_headroom)
        basis = (f"({base} MiB baseline + {capacity.model_words:,} words / {servers} servers x "
                 f"{per_word} B/word at 2x row capacity) x {capacity.server_headroom} headroom")
        return Resources(1.0, mem, 1024, basis)
    if role == "worker":
        vocab_mib = capacity.worker_vocab_words * capacity.worker_vocab_entry_bytes / 2**20
        own = (base + capacity.worker_working_set_mib + vocab_mib) * capacity.headroom
        segment = capacity.host_replica_mib
        mem = round_up(own + segment)
        basis = (f"({base} MiB baseline + {capacity.worker_working_set_mib} MiB fetch buffers and batches + "
                 f"{capacity.worker_vocab_words:,} vocabulary entries x {capacity.worker_vocab_entry_bytes} B) "
                 f"x {capacity.headroom} headroom + the host replica's segment in shared memory "
                 f"({capacity.host_replica_rows:,} rows, {segment:.0f} MiB, charged to the worker that creates it)")
        return Resources(1.5, mem, 512, basis, shared_mib=math.ceil(segment))
    if role == "frontend":
        per_word = 4 * capacity.dim * capacity.frontend_float_copies + capacity.frontend_bytes_per_word
        model_mib = capacity.model_words * per_word / 2**20
        mem = round_up((base + model_mib) * capacity.headroom)
        basis = (f"({base} MiB baseline + {capacity.model_words:,} words x {per_word} B/word, "
                 f"the peak measured at 1M words) x {capacity.headroom} headroom")
        return Resources(1.0, mem, 512, basis)
    if role == "scheduler":
        mem = round_up(base * 2 * capacity.headroom)
        return Resources(0.25, mem, 256, f"{base} MiB baseline x 2 (node table, queues) x {capacity.headroom}")
    raise ValueError(f"no sizing rule for role {role!r}")
