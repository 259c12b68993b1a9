"""One settings mechanism: a declaration makes the flag, the environment read and the error;
and each command's ``--help`` lists exactly the variables it reads."""
from __future__ import annotations

import argparse
import importlib
import re

import pytest

from online.cli.main import COMMANDS, LOGGING
from online.learner.settings import LEARNER, MODEL, SERVER_MODEL, WORKER_MODEL
from ps_bridge.settings import NODE, Setting, SettingError, SettingGroup, namespace

GROUP = SettingGroup("probe", (
    Setting("count", "PROBE_COUNT", int, 3, minimum=1, maximum=10),
    Setting("rate", "PROBE_RATE", float, 0.5, minimum=0.0),
    Setting("mode", "PROBE_MODE", default="fast", choices=("fast", "slow")),
    Setting("on", "PROBE_ON", bool, False),
    Setting("port", ("PROBE_PORT", "PROBE_PORT0"), int, 0, flags=()),
))


def _parse(argv, group=GROUP):
    parser = argparse.ArgumentParser()
    group.add_arguments(parser)
    return parser.parse_args(argv)


def test_flag_over_variable_over_default():
    assert GROUP.read(_parse([]), {}) == {"count": 3, "rate": 0.5, "mode": "fast", "on": False, "port": 0}
    env = {"PROBE_COUNT": "7", "PROBE_MODE": "slow", "PROBE_ON": "yes", "PROBE_PORT0": "5"}
    assert GROUP.read(_parse([]), env) == {"count": 7, "rate": 0.5, "mode": "slow", "on": True, "port": 5}
    got = GROUP.read(_parse(["--count", "2", "--no-on", "--mode", "fast"]), env)
    assert (got["count"], got["on"], got["mode"]) == (2, False, "fast")
    assert GROUP.read(None, {"PROBE_PORT": "1", "PROBE_PORT0": "2"})["port"] == 1   # the first variable wins
    assert GROUP.read(namespace(count=9), {})["count"] == 9                        # flags given in code
    assert GROUP.read(None, {"PROBE_COUNT": "  "})["count"] == 3                   # blank is unset


@pytest.mark.parametrize("env, argv, named", [
    ({"PROBE_COUNT": "many"}, [], "PROBE_COUNT"),
    ({"PROBE_COUNT": "11"}, [], "PROBE_COUNT"),
    ({}, ["--count", "0"], "PROBE_COUNT (--count)"),
    ({"PROBE_RATE": "nan"}, [], "PROBE_RATE"),
    ({"PROBE_ON": "maybe"}, [], "PROBE_ON"),
    ({"PROBE_PORT0": "x"}, [], "PROBE_PORT0"),
])
def test_a_bad_value_names_where_it_came_from(env, argv, named):
    with pytest.raises(SettingError) as err:
        GROUP.read(_parse(argv), env)
    assert str(err.value).startswith(named + ":")


def test_a_bad_choice_is_refused_by_the_flag_and_named_for_the_variable():
    with pytest.raises(SystemExit):
        _parse(["--mode", "medium"])
    with pytest.raises(SettingError) as err:
        GROUP.read(None, {"PROBE_MODE": "medium"})
    assert err.value.setting == "PROBE_MODE"


def test_required_and_differing_defaults():
    need = Setting("where", "PROBE_WHERE", required=True)
    with pytest.raises(SettingError) as err:
        need.read(None, {})
    assert "PROBE_WHERE" in str(err.value) and "required" in str(err.value)
    with pytest.raises(ValueError):
        GROUP["mode"].with_default("slow", why="")
    slow = GROUP["mode"].with_default("slow", why="the probe role is patient")
    assert slow.read(None, {}) == "slow" and "patient" in slow.help_text()


def test_model_settings_are_declared_once_for_every_role():
    # the same declaration objects, not copies with other limits
    for field in ("dim", "window", "negative", "min_count", "sample", "seed"):
        assert WORKER_MODEL[field] is MODEL[field]
    for field in ("dim", "seed", "eta"):
        assert SERVER_MODEL[field] is MODEL[field]
    assert MODEL["optimizer"].default == "rowadagrad" and SERVER_MODEL["optimizer"].default == "adagrad"
    assert SERVER_MODEL["optimizer"].why    # the difference says why
    assert LEARNER["local_rate"].maximum == 1.0


# --------------------------------------------------------------------------- --help == what is read

class RecordingEnv(dict):
    """An environment that remembers every variable a command looked up."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.asked: set[str] = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.asked.add(key)
        return super().__contains__(key)


_VARIABLE = re.compile(r"(?<![A-Za-z0-9_$*:])\$?([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|PORT0?)(?![A-Za-z0-9_*])")

CLUSTER = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9091", "DMLC_NUM_SERVER": "1",
           "DMLC_NUM_WORKER": "1"}
KAFKA = {"LIVEVEC_KAFKA_BOOTSTRAP": "127.0.0.1:9092", "LIVEVEC_KAFKA_TOPICS": "text"}


def _command(name: str, argv: list[str]):
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"livevec {name}")
    module.configure(parser)
    LOGGING.add_arguments(parser)
    return module, parser.format_help(), parser.parse_args(argv)


def _help_variables(text: str) -> set[str]:
    return {m.group(1) for m in _VARIABLE.finditer(text)}


def _reads(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b c\n")
    return {
        "train": (["--input", str(corpus), "--out", str(tmp_path / "out")], {}),
        "produce": (["-"], KAFKA),
        "kafka": (["status"], {}),
        "frontend": ([], {**CLUSTER, "DMLC_NUM_WORKER": "0", "LIVEVEC_ELASTIC_WORKERS": "1"}),
        "up": ([], {}),
        "scheduler": ([], {**CLUSTER, "LIVEVEC_CHECKPOINT_DIR": str(tmp_path / "ckpt")}),
        "server": ([], {**CLUSTER, "LIVEVEC_CHECKPOINT_DIR": str(tmp_path / "ckpt")}),
        "worker": ([], {**CLUSTER, **KAFKA, "LIVEVEC_CHECKPOINT_DIR": str(tmp_path / "ckpt")}),
    }


@pytest.mark.parametrize("name", ["train", "produce", "kafka", "frontend", "up", "scheduler", "server", "worker"])
def test_help_lists_exactly_what_the_command_reads(name, tmp_path):
    argv, env = _reads(tmp_path)[name]
    module, text, args = _command(name, argv)
    recording = RecordingEnv(env)
    module.read_settings(args, recording)
    LOGGING.read(args, recording)
    assert recording.asked == _help_variables(text)


def test_the_help_check_sees_a_variable_missing_from_help(tmp_path):
    # a setting read behind --help's back must show up as a difference
    module, text, args = _command("kafka", ["status"])
    recording = RecordingEnv()
    module.read_settings(args, recording)
    recording.get("LIVEVEC_UNDECLARED")
    assert recording.asked - _help_variables(text) == {"LIVEVEC_UNDECLARED"}


def test_node_flags_come_from_the_node_declarations():
    args = _parse(["--root-uri", "10.1.2.3", "--num-server", "4"], NODE.without("role"))
    values = NODE.without("role").read(args, CLUSTER)
    assert (values["root_uri"], values["num_server"], values["root_port"]) == ("10.1.2.3", 4, 9091)
