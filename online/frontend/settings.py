"""The front end's one typed configuration, declared once in ``FRONTEND``.

Flags win over the environment, the environment over defaults. ``FrontendSettings.validate``
checks every field against the same declarations before a socket is opened, so a wrong
value stops ``livevec frontend`` at once with a message naming the setting (exit code 2),
whether it came from a flag, a variable or code that built the settings itself.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
import ssl
import tempfile
from dataclasses import dataclass, field

from online.cluster.node_settings import ELASTIC_WORKERS
from online.learner.word2vec_format import FORMATS
from ps_bridge.settings import NODE, NodeSettings, Setting, SettingError, SettingGroup

DRIFT_IN_MEMORY = "memory"      # LIVEVEC_DRIFT_DIR's value for checkpoints kept in the process's memory

FRONTEND = SettingGroup("front end", (
    Setting("host", "LIVEVEC_HTTP_HOST", default="127.0.0.1", help="address to listen on (0.0.0.0 in containers)"),
    Setting("port", "LIVEVEC_HTTP_PORT", int, 8080, minimum=0, maximum=65535,
            help="port to listen on, 0 = any free port (printed at start)"),
    Setting("source", "LIVEVEC_MODEL_SOURCE", default="",
            help="model source: word2vec, ps (the parameter servers named by DMLC_*), or module:function "
                 "(default word2vec with --model, else ps if DMLC_PS_ROOT_URI is set)"),
    Setting("model_file", "LIVEVEC_MODEL_FILE", flags=("--model",), metavar="FILE",
            help="serve this word2vec text/binary file (.gz ok); reloaded when replaced"),
    Setting("model_format", "LIVEVEC_MODEL_FORMAT", default="auto", choices=FORMATS, help="format of --model"),
    Setting("vocab_counts_file", "LIVEVEC_VOCAB_COUNTS_FILE", flags=("--vocab-counts",), metavar="FILE",
            help="'word count' per line, for /v1/vocab with --model"),
    Setting("sync_interval", "LIVEVEC_SYNC_INTERVAL", float, 0.5, minimum=0.01, maximum=3600,
            help="seconds between syncs of changed rows"),
    Setting("stats_interval", "LIVEVEC_STATS_INTERVAL", float, 1.0, minimum=0.1, maximum=3600,
            help="seconds between training-stats pulls"),
    Setting("max_k", "LIVEVEC_MAX_K", int, 1000, minimum=1, maximum=100_000, help="largest k a client may ask for"),
    Setting("max_batch_words", "LIVEVEC_MAX_BATCH_WORDS", int, 1000, minimum=1, maximum=100_000,
            help="most words in one POST /v1/similar"),
    Setting("query_batch", "LIVEVEC_QUERY_BATCH", int, 64, minimum=1, maximum=4096,
            help="most queries fused into one matrix product"),
    Setting("query_thread", "LIVEVEC_QUERY_THREAD", bool, True,
            help="compute queries in a thread (else on the event loop)"),
    Setting("blas_threads", "LIVEVEC_BLAS_THREADS", int, 1, minimum=0, maximum=256,
            help="BLAS threads on the query path, 0 = leave as is"),
    Setting("background_nice", "LIVEVEC_BACKGROUND_NICE", int, 10, minimum=0, maximum=19,
            help="how many nice steps below the similarity queries the background work runs (syncs, the "
                 "inverted file's builds and recall checks, analytics): on a shared core the queries keep "
                 "their latency and the rest takes what they leave; 0 = the same priority"),
    Setting("search_processes", "LIVEVEC_SEARCH_PROCESSES", int, 0, minimum=0, maximum=64,
            help="processes that search beside the front end, mapping its model from shared memory (one copy "
                 "of the model; online/search/search_processes.py); 0 = the query thread searches"),
    # search on large vocabularies (online/frontend/ivf.py) and load shedding (query_engine.py)
    Setting("search", "LIVEVEC_SEARCH", default="auto", choices=("auto", "exact"),
            help="auto: on models of --ivf-min-rows words or more an inverted file answers queries once built "
                 "(approximate; every answer says exact or ivf, /v1/stats the measured recall@10); "
                 "exact: every query exact"),
    Setting("ivf_min_rows", "LIVEVEC_IVF_MIN_ROWS", int, 100_000, minimum=1, maximum=1 << 40,
            help="smallest model that gets an inverted file (smaller ones are searched exactly)"),
    Setting("ivf_lists", "LIVEVEC_IVF_LISTS", int, 0, minimum=0, maximum=1 << 20,
            help="inverted-file lists, 0 = sqrt(words)"),
    Setting("ivf_nprobe", "LIVEVEC_IVF_NPROBE", int, 32, minimum=1, maximum=1 << 20,
            help="lists one query scans: more is slower and finds more of the exact neighbours"),
    Setting("ivf_exact_below", "LIVEVEC_IVF_EXACT_BELOW", float, 0.55, minimum=0.0, maximum=1.0,
            help="an inverted-file answer whose k-th cosine is below this is redone exactly (0: never); with "
                 "--ivf-exact-below-auto, the value until the recall monitor has calibrated its own"),
    Setting("ivf_exact_below_auto", "LIVEVEC_IVF_EXACT_BELOW_AUTO", bool, True,
            help="the recall monitor sets the floor to the lowest that keeps its sampled recall@10 at 0.995"),
    Setting("ivf_nprobe_auto", "LIVEVEC_IVF_NPROBE_AUTO", bool, True,
            help="with --ivf-exact-below-auto: the recall monitor lets queries scan fewer lists than --ivf-nprobe "
                 "(down to a quarter) where its samples show that keeps recall@10 at 0.995 without redoing more "
                 "answers exactly"),
    Setting("gc_freeze", "LIVEVEC_GC_FREEZE", bool, True,
            help="after each full load, keep the model's objects out of Python's cyclic collector (a full "
                 "collection over a 1M-word model holds the GIL for about 60 ms)"),
    Setting("query_max_wait", "LIVEVEC_QUERY_MAX_WAIT", float, 0.1, minimum=0.001, maximum=60,
            help="seconds a query may wait for the compute thread; beyond that it is refused with 503 and "
                 "Retry-After (load shedding) instead of queued"),
    Setting("query_queue_limit", "LIVEVEC_QUERY_QUEUE_LIMIT", int, 1024, minimum=1, maximum=1_000_000,
            help="most queries waiting for the compute thread; beyond that, 503"),
    # what is new: the history the front end records itself (online/frontend/whats_new.py)
    Setting("new_words_keep", "LIVEVEC_NEW_WORDS_KEEP", int, 100_000, minimum=1, maximum=10_000_000,
            help="arrivals /v1/new remembers (8 bytes each; the oldest are forgotten first)"),
    Setting("rising_interval", "LIVEVEC_RISING_INTERVAL", float, 30.0, minimum=0.05, maximum=3600,
            help="seconds between the count samples /v1/rising compares"),
    Setting("rising_samples", "LIVEVEC_RISING_SAMPLES", int, 30, minimum=1, maximum=100_000,
            help="count samples kept: /v1/rising's window reaches back interval x samples seconds "
                 "(16 bytes per row that changed between two samples)"),
    Setting("drift_interval", "LIVEVEC_DRIFT_INTERVAL", float, 600.0, minimum=0.05, maximum=7 * 86400,
            help="seconds between the in-memory model checkpoints /v1/drift compares against"),
    Setting("drift_keep", "LIVEVEC_DRIFT_KEEP", int, 2, minimum=0, maximum=1000,
            help="checkpoints kept for /v1/drift, each a float16 copy of the vectors "
                 "(2 x dim + 20 bytes per word; 0 = none)"),
    Setting("drift_dir", "LIVEVEC_DRIFT_DIR", default="", metavar="DIR",
            help="a local disk directory for the /v1/drift checkpoints' float16 vectors (files unlinked as soon as "
                 "they are open, so nothing is left after a crash); empty: the system's temporary directory "
                 "(TMPDIR, else /tmp); 'memory': in the process's memory. A 10M x 100 model's checkpoint is 2 GB: "
                 "on disk it costs no RAM but the page cache's"),
    # under abuse (README "Security", docs/operations.md#front-end-security)
    Setting("max_body_bytes", "LIVEVEC_MAX_BODY_BYTES", int, 4 * 1024 * 1024, minimum=1024, maximum=1 << 30,
            help="largest request body; larger is answered 413 without reading it all"),
    Setting("max_concurrent_requests", "LIVEVEC_MAX_CONCURRENT_REQUESTS", int, 256, minimum=1, maximum=100_000,
            help="requests handled at once; more are answered 503 with Retry-After (/health, /ready exempt)"),
    Setting("max_connections", "LIVEVEC_MAX_CONNECTIONS", int, 4096, minimum=1, maximum=1_000_000,
            help="open client connections; a new one beyond this gets a 503 and is closed (keep it below ulimit -n)"),
    Setting("max_connections_per_client", "LIVEVEC_MAX_CONNECTIONS_PER_CLIENT", int, 512, minimum=1,
            maximum=1_000_000, help="open connections from one client address (behind a proxy: the proxy's)"),
    Setting("header_timeout", "LIVEVEC_HEADER_TIMEOUT", float, 10.0, minimum=0.1, maximum=3600,
            help="seconds a connection may take to send a complete request head, or stay idle between requests"),
    Setting("body_timeout", "LIVEVEC_BODY_TIMEOUT", float, 10.0, minimum=0.1, maximum=3600,
            help="seconds a client may take to send a request body (then 408)"),
    # --token-file, not --api-token-file: argparse would take --api-token (a secret on the command line) for it
    Setting("api_token_file", "LIVEVEC_API_TOKEN_FILE", metavar="FILE", flags=("--token-file",),
            help="require 'Authorization: Bearer <token>' on /v1/* and /metrics, the token read from this file "
                 "(/health, /ready, the page and /openapi.json stay open)"),
    Setting("api_token", "LIVEVEC_API_TOKEN", flags=(),
            help="the API token itself, when no file is mounted (never a flag; never logged)"),
    Setting("tls_cert_file", "LIVEVEC_TLS_CERT_FILE", metavar="FILE",
            help="serve HTTPS with this PEM certificate (chain), where no proxy terminates TLS"),
    Setting("tls_key_file", "LIVEVEC_TLS_KEY_FILE", metavar="FILE", help="the PEM private key of --tls-cert-file"),
))

# ``--source ps`` joins the cluster as a worker node. Its ps socket's port comes from PORT
# (the deploy files bind it to a port of its own); ``--port`` is the HTTP port, so that one
# setting has no flag here.
PS_SOURCE_NODE = SettingGroup("parameter servers (--source ps)", tuple(
    s.replace(flags=()) if s.field == "port" else s for s in NODE.without("role")) + (ELASTIC_WORKERS,))


@dataclass
class FrontendSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    source: str = ""
    model_file: str | None = None
    model_format: str = "auto"
    vocab_counts_file: str | None = None
    sync_interval: float = 0.5
    stats_interval: float = 1.0
    max_k: int = 1000
    max_batch_words: int = 1000
    query_batch: int = 64
    query_thread: bool = True
    gc_freeze: bool = True
    blas_threads: int = 1
    background_nice: int = 10
    search_processes: int = 0
    search: str = "auto"
    ivf_min_rows: int = 100_000
    ivf_lists: int = 0
    ivf_nprobe: int = 32
    ivf_exact_below: float = 0.55
    ivf_exact_below_auto: bool = True
    ivf_nprobe_auto: bool = True
    query_max_wait: float = 0.1
    query_queue_limit: int = 1024
    new_words_keep: int = 100_000
    rising_interval: float = 30.0
    rising_samples: int = 30
    drift_interval: float = 600.0
    drift_keep: int = 2
    drift_dir: str = ""
    max_body_bytes: int = 4 * 1024 * 1024
    max_concurrent_requests: int = 256
    max_connections: int = 4096
    max_connections_per_client: int = 512
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    api_token_file: str | None = None
    api_token: str | None = field(default=None, repr=False)   # a secret: never in a repr or a log line
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    node: NodeSettings | None = None     # the cluster to join with --source ps

    def validate(self) -> "FrontendSettings":
        for setting in FRONTEND:
            value = getattr(self, setting.field)
            if value is not None:
                setting.parse(value)
        if not self.host:
            raise SettingError("LIVEVEC_HTTP_HOST", "must not be empty")
        if not self.source:
            raise SettingError("LIVEVEC_MODEL_SOURCE",
                               "no model source: pass --model FILE (a word2vec file), or --source ps with the "
                               "DMLC_* settings of a parameter-server cluster, or --source module:function")
        if self.source == "word2vec":
            if not self.model_file:
                raise SettingError("LIVEVEC_MODEL_FILE", "is required with --source word2vec")
            if not os.path.isfile(self.model_file):
                raise SettingError("LIVEVEC_MODEL_FILE", f"no such file: {self.model_file}")
            if not os.access(self.model_file, os.R_OK):
                raise SettingError("LIVEVEC_MODEL_FILE", f"not readable: {self.model_file}")
        self.drift_directory()
        if self.vocab_counts_file and not os.path.isfile(self.vocab_counts_file):
            raise SettingError("LIVEVEC_VOCAB_COUNTS_FILE", f"no such file: {self.vocab_counts_file}")
        if self.search_processes and not self.query_thread:
            raise SettingError("LIVEVEC_SEARCH_PROCESSES", "needs LIVEVEC_QUERY_THREAD=1 (the compute threads hand "
                                                           "batches to the processes)")
        self.token()
        self.ssl_context()
        return self

    def drift_directory(self) -> str | None:
        """Where the drift checkpoints' vectors go: a writable directory, or None for memory
        (``LIVEVEC_DRIFT_DIR=memory``). A 10M-word checkpoint is 2 GB, so by default it goes to the
        temporary directory (the deploy files mount a local ``emptyDir`` there), not into the memory
        budget."""
        if self.drift_dir == DRIFT_IN_MEMORY:
            return None
        directory = self.drift_dir or tempfile.gettempdir()
        if not (os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)):
            raise SettingError("LIVEVEC_DRIFT_DIR", f"not a writable directory: {directory} (give a directory on "
                                                    f"local disk, or '{DRIFT_IN_MEMORY}' to keep the checkpoints "
                                                    f"in memory)")
        return directory

    def token(self) -> str | None:
        """The API token (file over variable), or None when the API is open."""
        if self.api_token_file:
            try:
                with open(self.api_token_file, encoding="utf-8") as f:
                    token = f.read().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise SettingError("LIVEVEC_API_TOKEN_FILE", f"cannot read {self.api_token_file}: {exc}") from None
            name = "LIVEVEC_API_TOKEN_FILE"
        else:
            token, name = self.api_token, "LIVEVEC_API_TOKEN"
        if token is not None and (len(token) < 16 or not token.isprintable() or " " in token):
            raise SettingError(name, "the token must be at least 16 printable characters without spaces")
        return token

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls_cert_file and not self.tls_key_file:
            return None
        if not self.tls_cert_file or not self.tls_key_file:
            raise SettingError("LIVEVEC_TLS_KEY_FILE" if self.tls_cert_file else "LIVEVEC_TLS_CERT_FILE",
                               "is required with the other LIVEVEC_TLS_* setting")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise SettingError("LIVEVEC_TLS_CERT_FILE", f"cannot load {self.tls_cert_file} with its key "
                                                        f"{self.tls_key_file}: {exc}") from None
        return context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``livevec frontend``: its own and those of the cluster ``--source ps`` joins."""
    FRONTEND.add_arguments(parser)
    PS_SOURCE_NODE.add_arguments(parser)


def ps_node_settings(args: argparse.Namespace | None, env: Mapping[str, str]) -> NodeSettings:
    values = PS_SOURCE_NODE.read(args, env)
    elastic = values.pop("elastic_workers")
    values["role"] = "worker"
    return NodeSettings.build(values, elastic_workers=elastic)


def settings_from(args: argparse.Namespace | None, env: Mapping[str, str]) -> FrontendSettings:
    """Merge flags over ``LIVEVEC_*`` over defaults, then validate."""
    values = FRONTEND.read(args, env)
    if not values["source"]:
        if values["model_file"]:
            values["source"] = "word2vec"
        elif NODE["root_uri"].replace(required=False).read(args, env):
            values["source"] = "ps"
    if values["source"] == "ps":
        values["node"] = ps_node_settings(args, env)
    return FrontendSettings(**values).validate()
