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
from dataclasses import dataclass

from online.cluster.node_settings import ELASTIC_WORKERS
from online.learner.word2vec_format import FORMATS
from ps_bridge.settings import NODE, NodeSettings, Setting, SettingError, SettingGroup

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
    blas_threads: int = 1
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
        if self.vocab_counts_file and not os.path.isfile(self.vocab_counts_file):
            raise SettingError("LIVEVEC_VOCAB_COUNTS_FILE", f"no such file: {self.vocab_counts_file}")
        return self


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
