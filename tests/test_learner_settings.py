"""The learner's settings: flags over LIVEVEC_* variables over defaults, and errors that name the setting."""
from __future__ import annotations

import argparse

import pytest

from online.learner.settings import LEARNER, WORKER_MODEL, learner_config_from_args
from ps_bridge.settings import SettingError


def _config(argv: list[str], env: dict[str, str]):
    parser = argparse.ArgumentParser()
    WORKER_MODEL.add_arguments(parser)
    LEARNER.add_arguments(parser)
    return learner_config_from_args(parser.parse_args(argv), env)


def test_flags_override_variables_which_override_defaults():
    assert _config([], {}).local_rate == 0.002
    assert _config([], {"LIVEVEC_LOCAL_RATE": "0", "LIVEVEC_WINDOW": "7"}).local_rate == 0.0
    config = _config(["--local-rate", "0.01", "--window", "3"], {"LIVEVEC_LOCAL_RATE": "0", "LIVEVEC_WINDOW": "7"})
    assert (config.local_rate, config.window) == (0.01, 3)


@pytest.mark.parametrize("env, setting", [
    ({"LIVEVEC_LOCAL_RATE": "fast"}, "LIVEVEC_LOCAL_RATE"),
    ({"LIVEVEC_LOCAL_RATE": "-0.1"}, "LIVEVEC_LOCAL_RATE"),
    ({"LIVEVEC_LOCAL_RATE": "2"}, "LIVEVEC_LOCAL_RATE"),
    ({"LIVEVEC_WINDOW": "0"}, "LIVEVEC_WINDOW"),
    ({"LIVEVEC_TOKENIZER": "bpe"}, "LIVEVEC_TOKENIZER"),
])
def test_bad_values_stop_with_the_setting_named(env, setting):
    with pytest.raises(SettingError) as err:
        _config([], env)
    assert err.value.setting == setting
