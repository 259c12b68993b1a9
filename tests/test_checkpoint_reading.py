"""How the workers read the stream (tokenizer, language, record format and field) is part of each
checkpoint's manifest; a worker started reading it another way stops at start, naming the setting."""
from __future__ import annotations

import pytest

from online.checkpoint.participants import check_reading, worker_reading
from online.checkpoint.store import CheckpointStore
from online.cluster.worker import WorkerSettings
from ps_bridge.settings import SettingError

ENV = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9091", "DMLC_NUM_SERVER": "1",
       "DMLC_NUM_WORKER": "1", "LIVEVEC_KAFKA_BOOTSTRAP": "127.0.0.1:9092", "LIVEVEC_KAFKA_TOPICS": "t",
       "LIVEVEC_TOKENIZER": "tokens", "LIVEVEC_RECORD_FORMAT": "json", "LIVEVEC_RECORD_FIELD": "items"}


def _store_with_checkpoint(tmp_path, reading) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "checkpoints")
    store.ensure()
    store.prepare(1)
    store.write_manifest(1, {"num_servers": 0, "files": {}, "offsets": {}, "reading": reading})
    return store


def test_a_worker_reading_the_stream_as_the_checkpoint_did_starts(tmp_path):
    reading = worker_reading(WorkerSettings.from_args(None, ENV))
    assert reading == {"tokenizer": "tokens", "language": "auto", "record_format": "json", "record_field": "items"}
    store = _store_with_checkpoint(tmp_path, reading)
    check_reading(str(store.root), reading)
    check_reading(str(tmp_path / "no-checkpoint-yet"), reading)


@pytest.mark.parametrize("setting, value", [("LIVEVEC_TOKENIZER", "unicode"), ("LIVEVEC_LANGUAGE", "ja"),
                                            ("LIVEVEC_RECORD_FORMAT", "text"), ("LIVEVEC_RECORD_FIELD", "basket")])
def test_another_reading_stops_the_worker_naming_the_setting(tmp_path, setting, value):
    store = _store_with_checkpoint(tmp_path, worker_reading(WorkerSettings.from_args(None, ENV)))
    env = {**ENV, setting: value}
    if setting == "LIVEVEC_RECORD_FORMAT":
        env.pop("LIVEVEC_RECORD_FIELD")
    with pytest.raises(SettingError, match=setting) as raised:
        check_reading(str(store.root), worker_reading(WorkerSettings.from_args(None, env)))
    assert "latest checkpoint" in str(raised.value)


def test_a_checkpoint_from_before_the_reading_was_kept_is_not_checked(tmp_path):
    store = _store_with_checkpoint(tmp_path, None)
    check_reading(str(store.root), worker_reading(WorkerSettings.from_args(None, ENV)))
