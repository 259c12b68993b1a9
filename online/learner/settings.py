"""The model's and the learner's settings, declared once for ``train``, ``server`` and ``worker``.

The three roles must agree on the model (a worker and a server with different ``dim``
cannot talk), so they read the same declarations; a role that needs another default
overrides one with ``Setting.with_default`` and says why.
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping

from online.learner.embedding_shard import OPTIMIZERS
from online.learner.tokenizers import TOKENIZERS
from online.learner.tokenizers.cjk import LANGUAGES
from online.learner.trainer import KERNEL_CHOICES, LearnerConfig
from ps_bridge.settings import Setting, SettingError, SettingGroup

MODEL = SettingGroup("model (the same on every role)", (
    Setting("dim", "LIVEVEC_DIM", int, 100, minimum=1, maximum=4096, help="vector size"),
    Setting("window", "LIVEVEC_WINDOW", int, 5, minimum=1, help="largest context window"),
    Setting("negative", "LIVEVEC_NEGATIVE", int, 5, minimum=0, help="negative samples per pair"),
    Setting("min_count", "LIVEVEC_MIN_COUNT", int, 5, minimum=1, help="a word is trained from this count on"),
    Setting("sample", "LIVEVEC_SAMPLE", float, 1e-3, minimum=0.0, help="subsampling threshold (0 = off)"),
    Setting("seed", "LIVEVEC_SEED", int, 1, minimum=0, help="seed of the row initialisation and sampling"),
    Setting("optimizer", "LIVEVEC_OPTIMIZER", default="rowadagrad", choices=OPTIMIZERS,
            help="how updates are applied: row-wise AdaGrad, per-coordinate AdaGrad or constant-rate SGD"),
    Setting("eta", "LIVEVEC_ETA", float, minimum=1e-12,
            help="learning rate of the optimizer (default 0.1 for the AdaGrads, 0.2 with the hogbatch kernel; "
                 "0.025 for SGD)"),
))

LEARNER = SettingGroup("learner", (
    Setting("tokenizer", "LIVEVEC_TOKENIZER", default="text8", choices=TOKENIZERS,
            help="text8: lower-case ASCII words as word2vec's demo; unicode: any script, Chinese and Japanese "
                 "cut into words; tokens: split on whitespace only, every token kept byte for byte (IDs)"),
    Setting("language", "LIVEVEC_LANGUAGE", default="auto", choices=LANGUAGES,
            help="unicode: how a Chinese or Japanese run is segmented: auto (Japanese where the record holds "
                 "kana, else Chinese), zh or ja"),
    Setting("vocab_capacity", "LIVEVEC_VOCAB_CAPACITY", int, 1_000_000, minimum=1,
            help="most words counted at once"),
    Setting("local_rate", "LIVEVEC_LOCAL_RATE", float, 0.002, minimum=0.0, maximum=1.0,
            help="SGD rate of the walk over a mini-batch before its push (0 = one step against the pulled rows)"),
    Setting("batch_words", "LIVEVEC_BATCH_WORDS", int, 10_000, minimum=1,
            help="most tokens in one mini-batch (one pull and one push on the pull/push path)"),
    Setting("kernel", "LIVEVEC_KERNEL", default="auto", choices=KERNEL_CHOICES,
            help="in-place training (livevec train, a worker's replica): pairs (word2vec.c's order, negatives per "
                 "pair), hogbatch (negatives shared by a centre word's window, each row stepped once a window; "
                 "faster, and learns more as one model, but its deltas combine worse across replicas) or auto: "
                 "hogbatch as one model (livevec train) and where the cluster declares at most 2 workers, else "
                 "pairs"),
))

# In process the optimizer runs once per (centre, context) pair, where row-wise AdaGrad is
# 3x faster than per-coordinate; on the servers it runs once per pushed row per mini-batch,
# where its cost does not show and per-coordinate AdaGrad learns better (on the pull/push path, 5M tokens:
# analogy 4.00 vs 3.73 %, SimLex 0.157 vs 0.150; ``bench/quality_vs_gensim.py --shards 2 --optimizer adagrad``).
SERVER_OPTIMIZER = MODEL["optimizer"].with_default(
    "adagrad", why="servers default to per-coordinate AdaGrad: applied once per pushed row, its cost does not "
                   "show, and it learns better on the pull/push path")

# What each role reads of the model. Workers train a local replica with the optimizer
# (``online.cluster.replica``); servers neither sample nor tokenise, but they count the
# cluster's words (min_count decides trainability there) in a table of ``vocab_capacity``.
WORKER_MODEL = MODEL
SERVER_MODEL = MODEL.only("dim", "seed", "eta", "min_count").plus(SERVER_OPTIMIZER, LEARNER["vocab_capacity"])


def learner_config(values: Mapping[str, object], **fixed) -> LearnerConfig:
    """A checked ``LearnerConfig`` from values read through ``MODEL`` and ``LEARNER``."""
    fields = set(LearnerConfig.__dataclass_fields__)
    config = LearnerConfig(**{k: v for k, v in values.items() if k in fields and v is not None}, **fixed)
    try:
        config.validate()
    except ValueError as exc:
        raise SettingError("learner", str(exc)) from None
    return config


def learner_config_from_args(args: argparse.Namespace | None, env: Mapping[str, str] | None = None,
                             groups: tuple[SettingGroup, ...] = (WORKER_MODEL, LEARNER), **fixed) -> LearnerConfig:
    values: dict[str, object] = {}
    for group in groups:
        values.update(group.read(args, env))
    return learner_config(values, **fixed)
