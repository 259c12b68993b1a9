"""The front end's one typed configuration, from flags and ``LIVEVEC_*`` variables.

Flags win over the environment, the environment over defaults. Everything is checked
in ``FrontendSettings.validate`` before a socket is opened, so a wrong value stops
``livevec frontend`` at once with a message naming the setting (exit code 2).
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from online.frontend.word2vec_format import FORMATS
from ps_bridge.settings import SettingError, env_bool, env_float, env_int, env_str


@dataclass
class FrontendSettings:
    host: str = "127.0.0.1"              # LIVEVEC_HTTP_HOST  (0.0.0.0 in containers)
    port: int = 8080                     # LIVEVEC_HTTP_PORT  (0 = pick a free port, printed at start)
    source: str = ""                     # LIVEVEC_MODEL_SOURCE: word2vec | ps | module:function ("" = infer)
    model_file: str | None = None        # LIVEVEC_MODEL_FILE: word2vec text/binary file (source word2vec)
    model_format: str = "auto"           # LIVEVEC_MODEL_FORMAT: auto | text | binary
    vocab_counts_file: str | None = None  # LIVEVEC_VOCAB_COUNTS_FILE: "word count" lines
    sync_interval: float = 0.5           # LIVEVEC_SYNC_INTERVAL seconds between pulls of changed rows
    stats_interval: float = 1.0          # LIVEVEC_STATS_INTERVAL seconds between source.stats() calls
    max_k: int = 1000                    # LIVEVEC_MAX_K: largest k a client may ask for
    max_batch_words: int = 1000          # LIVEVEC_MAX_BATCH_WORDS: words in one POST /v1/similar
    query_batch: int = 64                # LIVEVEC_QUERY_BATCH: queries fused into one matrix product
    query_thread: bool = True            # LIVEVEC_QUERY_THREAD: compute in a thread (else on the event loop)
    blas_threads: int = 1                # LIVEVEC_BLAS_THREADS on the query path
    log_level: str | None = None         # LIVEVEC_LOG_LEVEL

    def validate(self) -> "FrontendSettings":
        if not self.host:
            raise SettingError("LIVEVEC_HTTP_HOST", "must not be empty")
        if not 0 <= self.port <= 65535:
            raise SettingError("LIVEVEC_HTTP_PORT", f"must be in 0..65535, got {self.port}")
        if self.model_format not in FORMATS:
            raise SettingError("LIVEVEC_MODEL_FORMAT", f"must be one of {', '.join(FORMATS)}, got {self.model_format!r}")
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
        if self.vocab_counts_file and not os.path.isfile(self.vocab_counts_file):
            raise SettingError("LIVEVEC_VOCAB_COUNTS_FILE", f"no such file: {self.vocab_counts_file}")
        if not 0.01 <= self.sync_interval <= 3600:
            raise SettingError("LIVEVEC_SYNC_INTERVAL", f"must be in [0.01, 3600] seconds, got {self.sync_interval}")
        if not 0.1 <= self.stats_interval <= 3600:
            raise SettingError("LIVEVEC_STATS_INTERVAL", f"must be in [0.1, 3600] seconds, got {self.stats_interval}")
        if not 1 <= self.max_k <= 100_000:
            raise SettingError("LIVEVEC_MAX_K", f"must be in 1..100000, got {self.max_k}")
        if not 1 <= self.max_batch_words <= 100_000:
            raise SettingError("LIVEVEC_MAX_BATCH_WORDS", f"must be in 1..100000, got {self.max_batch_words}")
        if not 1 <= self.query_batch <= 4096:
            raise SettingError("LIVEVEC_QUERY_BATCH", f"must be in 1..4096, got {self.query_batch}")
        if not 0 <= self.blas_threads <= 256:
            raise SettingError("LIVEVEC_BLAS_THREADS", f"must be in 0..256 (0 = leave as is), got {self.blas_threads}")
        return self


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``livevec frontend``; every default is None so the environment can fill it."""
    a = parser.add_argument
    a("--host", help="address to listen on (LIVEVEC_HTTP_HOST, default 127.0.0.1)")
    a("--port", type=int, help="port to listen on, 0 = any free port (LIVEVEC_HTTP_PORT, default 8080)")
    a("--model", dest="model_file", metavar="FILE",
      help="serve this word2vec text/binary file (.gz ok); reloaded when replaced (LIVEVEC_MODEL_FILE)")
    a("--model-format", choices=FORMATS, help="format of --model (LIVEVEC_MODEL_FORMAT, default auto)")
    a("--vocab-counts", dest="vocab_counts_file", metavar="FILE",
      help="'word count' per line, for /v1/vocab with --model (LIVEVEC_VOCAB_COUNTS_FILE)")
    a("--source", help="model source: word2vec, ps (the parameter servers named by DMLC_*), or module:function "
                       "(LIVEVEC_MODEL_SOURCE; default word2vec with --model, else ps if DMLC_PS_ROOT_URI is set)")
    a("--sync-interval", type=float, help="seconds between syncs of changed rows (LIVEVEC_SYNC_INTERVAL, 0.5)")
    a("--stats-interval", type=float, help="seconds between training-stats pulls (LIVEVEC_STATS_INTERVAL, 1)")
    a("--max-k", type=int, help="largest k accepted (LIVEVEC_MAX_K, 1000)")
    a("--max-batch-words", type=int, help="most words in one POST /v1/similar (LIVEVEC_MAX_BATCH_WORDS, 1000)")
    a("--query-batch", type=int, help="most queries fused in one matrix product (LIVEVEC_QUERY_BATCH, 64)")
    a("--query-thread", dest="query_thread", action=argparse.BooleanOptionalAction, default=None,
      help="compute queries in a thread (default) or on the event loop (LIVEVEC_QUERY_THREAD, 1)")
    a("--blas-threads", type=int, help="BLAS threads on the query path, 0 = leave (LIVEVEC_BLAS_THREADS, 1)")
    a("--log-level", help="DEBUG, INFO, WARNING (LIVEVEC_LOG_LEVEL)")


def settings_from(args: argparse.Namespace | None, env: Mapping[str, str]) -> FrontendSettings:
    """Merge flags over ``LIVEVEC_*`` over defaults, then validate."""
    d = FrontendSettings()

    def pick(flag: str, value):
        got = getattr(args, flag, None) if args is not None else None
        return value if got is None else got

    model_file = pick("model_file", env_str(env, "LIVEVEC_MODEL_FILE"))
    source = pick("source", env_str(env, "LIVEVEC_MODEL_SOURCE", ""))
    if not source:
        if model_file:
            source = "word2vec"
        elif env_str(env, "DMLC_PS_ROOT_URI"):
            source = "ps"
    s = FrontendSettings(
        host=pick("host", env_str(env, "LIVEVEC_HTTP_HOST", d.host)),
        port=pick("port", env_int(env, "LIVEVEC_HTTP_PORT", d.port)),
        source=source,
        model_file=model_file,
        model_format=pick("model_format", env_str(env, "LIVEVEC_MODEL_FORMAT", d.model_format)),
        vocab_counts_file=pick("vocab_counts_file", env_str(env, "LIVEVEC_VOCAB_COUNTS_FILE")),
        sync_interval=pick("sync_interval", env_float(env, "LIVEVEC_SYNC_INTERVAL", d.sync_interval)),
        stats_interval=pick("stats_interval", env_float(env, "LIVEVEC_STATS_INTERVAL", d.stats_interval)),
        max_k=pick("max_k", env_int(env, "LIVEVEC_MAX_K", d.max_k)),
        max_batch_words=pick("max_batch_words", env_int(env, "LIVEVEC_MAX_BATCH_WORDS", d.max_batch_words)),
        query_batch=pick("query_batch", env_int(env, "LIVEVEC_QUERY_BATCH", d.query_batch)),
        query_thread=pick("query_thread", env_bool(env, "LIVEVEC_QUERY_THREAD", d.query_thread)),
        blas_threads=pick("blas_threads", env_int(env, "LIVEVEC_BLAS_THREADS", d.blas_threads)),
        log_level=pick("log_level", env_str(env, "LIVEVEC_LOG_LEVEL")),
    )
    return s.validate()
