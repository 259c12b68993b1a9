"""The learner's hyper-parameters from flags and ``LIVEVEC_*`` variables.

``livevec train`` and ``livevec worker`` train with the same ``LearnerConfig``; reading it
in one place keeps their flags, variables and defaults identical.
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping

from online.learner.trainer import LearnerConfig
from ps_bridge.settings import SettingError, current_env, env_float, env_int, env_str

DEFAULT_BATCH_WORDS = 10_000


def add_learner_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("learner (flags override the LIVEVEC_* variables)")
    g.add_argument("--dim", type=int, help="vector size (LIVEVEC_DIM, default 100)")
    g.add_argument("--window", type=int, help="max window (LIVEVEC_WINDOW, default 5)")
    g.add_argument("--negative", type=int, help="negatives per pair (LIVEVEC_NEGATIVE, default 5)")
    g.add_argument("--min-count", type=int, help="trainable from this count (LIVEVEC_MIN_COUNT, default 5)")
    g.add_argument("--sample", type=float, help="subsampling threshold (LIVEVEC_SAMPLE, default 1e-3)")
    g.add_argument("--tokenizer", choices=("text8", "unicode"), help="LIVEVEC_TOKENIZER (default text8)")
    g.add_argument("--vocab-capacity", type=int, help="max words counted at once (LIVEVEC_VOCAB_CAPACITY, 1000000)")
    g.add_argument("--seed", type=int, help="LIVEVEC_SEED (default 1)")
    g.add_argument("--local-rate", type=float,
                   help="SGD rate of a worker's walk over its batch before the push (LIVEVEC_LOCAL_RATE, "
                        "default 0.002; 0 = one step against the pulled rows)")


def learner_config_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None,
                             **fixed) -> LearnerConfig:
    env = current_env() if env is None else env

    def pick(attr, name, reader, default, **kw):
        value = getattr(args, attr, None)
        return value if value is not None else reader(env, name, default, **kw)

    config = LearnerConfig(
        dim=pick("dim", "LIVEVEC_DIM", env_int, 100, minimum=1, maximum=4096),
        window=pick("window", "LIVEVEC_WINDOW", env_int, 5, minimum=1),
        negative=pick("negative", "LIVEVEC_NEGATIVE", env_int, 5, minimum=0),
        min_count=pick("min_count", "LIVEVEC_MIN_COUNT", env_int, 5, minimum=1),
        sample=pick("sample", "LIVEVEC_SAMPLE", env_float, 1e-3, minimum=0.0),
        tokenizer=pick("tokenizer", "LIVEVEC_TOKENIZER", env_str, "text8"),
        vocab_capacity=pick("vocab_capacity", "LIVEVEC_VOCAB_CAPACITY", env_int, 1_000_000, minimum=1),
        seed=pick("seed", "LIVEVEC_SEED", env_int, 1, minimum=0),
        local_rate=pick("local_rate", "LIVEVEC_LOCAL_RATE", env_float, 0.002, minimum=0.0, maximum=1.0),
        **fixed)
    if config.tokenizer not in ("text8", "unicode"):
        raise SettingError("LIVEVEC_TOKENIZER", f"must be text8 or unicode, got {config.tokenizer!r}")
    try:
        config.validate()
    except ValueError as exc:
        raise SettingError("learner", str(exc)) from None
    return config
