"""Record formats: text, or JSON events whose named field (a dotted path) holds the text or a list of
items; malformed JSON records are counted by reason and skipped, in the stream, in ``livevec train``,
and with the settings named when they are wrong."""
from __future__ import annotations

import json
import random

import pytest

from online.cli.train import TrainSettings, train_file
from online.learner.tokenizers import Tokenizer, TokenList
from online.learner.trainer import LearnerConfig
from online.stream.json_scan import OK_LIST, OK_STRING, scan_records
from online.stream.reader import FileStream
from online.stream.records import RecordFormat
from online.stream.settings import StreamSettings
from ps_bridge.settings import SettingError


def test_a_string_field_is_text_and_a_dotted_path_reaches_into_objects():
    fmt = RecordFormat("json", "event.text")
    assert fmt.extract('{"event": {"text": "Hello there", "ts": 3}, "user": 1}') == ("Hello there", None)
    assert fmt.extract(b'{"event": {"text": "\\u6771\\u4eac"}}') == ("東京", None)
    assert RecordFormat("json", "query").extract('{"query": "red shoes", "ts": 1}') == ("red shoes", None)


def test_a_list_of_strings_is_one_sentence_of_tokens_taken_as_they_are():
    record, reason = RecordFormat("json", "items").extract('{"user": 7, "items": ["sku-123", "Red Shoes", "C++"]}')
    assert reason is None and TokenList.is_one(record)
    for kind in ("text8", "unicode", "tokens"):
        assert Tokenizer(kind).sentences(record) == [["sku-123", "Red Shoes", "C++"]]


@pytest.mark.parametrize("value, reason", [
    (b"not json", "invalid_json"),
    (b'{"event": {"text": "cut', "invalid_json"),
    (b"\xff\xfe", "invalid_utf8"),
    (b'{"other": 1}', "missing_field"),
    (b'{"event": {"body": "x"}}', "missing_field"),
    (b'{"event": "flat string"}', "missing_field"),
    (b'{"event": {"text": null}}', "missing_field"),
    (b'[{"event": {"text": "x"}}]', "missing_field"),
    (b'{"event": {"text": 42}}', "wrong_type"),
    (b'{"event": {"text": {"a": 1}}}', "wrong_type"),
    (b'{"event": {"text": ["a", 2]}}', "wrong_type"),
    (b'{"event": {"text": "   "}}', "empty"),
    (b'{"event": {"text": []}}', "empty"),
])
def test_malformed_records_have_a_reason(value, reason):
    assert RecordFormat("json", "event.text").extract(value) == (None, reason)


def test_text_that_starts_with_the_token_lists_mark_stays_text():
    fmt = RecordFormat("json", "text")
    record, reason = fmt.extract('{"text": "\\u001esku-1 sku-2"}')
    assert reason is None and not TokenList.is_one(record)
    assert Tokenizer("tokens").sentences(record) == [["sku-1", "sku-2"]]
    assert fmt.extract_many([b'{"text": "\\u001esku-1 sku-2"}']) == [(record, None)]


def test_text_records_are_unchanged():
    assert RecordFormat().extract('{"query": "x"}') == ('{"query": "x"}', None)


def test_bad_settings_stop_at_start_naming_them():
    with pytest.raises(SettingError, match="LIVEVEC_RECORD_FIELD"):
        RecordFormat.from_args(None, {"LIVEVEC_RECORD_FORMAT": "json"})
    with pytest.raises(SettingError, match="LIVEVEC_RECORD_FIELD"):
        RecordFormat.from_args(None, {"LIVEVEC_RECORD_FORMAT": "json", "LIVEVEC_RECORD_FIELD": "event..text"})
    with pytest.raises(SettingError, match="LIVEVEC_RECORD_FIELD"):
        RecordFormat.from_args(None, {"LIVEVEC_RECORD_FIELD": "query"})
    with pytest.raises(SettingError, match="LIVEVEC_RECORD_FORMAT"):
        RecordFormat.from_args(None, {"LIVEVEC_RECORD_FORMAT": "avro"})
    env = {"LIVEVEC_KAFKA_BOOTSTRAP": "127.0.0.1:9092", "LIVEVEC_KAFKA_TOPICS": "t",
           "LIVEVEC_RECORD_FORMAT": "json", "LIVEVEC_RECORD_FIELD": "items"}
    assert StreamSettings.from_args(None, env).records == RecordFormat("json", "items")


LINES = [
    '{"user": 1, "items": ["sku-1", "sku-2"]}',
    'not json at all',
    '{"user": 2, "items": ["sku-3", 4]}',
    '',
    '{"user": 3}',
    '{"user": 4, "items": ["sku-1", "sku-9", "sku-2"]}',
]


async def test_a_file_stream_of_json_records_skips_the_malformed_in_order(tmp_path):
    path = tmp_path / "sessions.jsonl"
    path.write_text("\n".join(LINES) + "\n")
    stream = FileStream(path, batch_records=2, record_format=RecordFormat("json", "items"))
    await stream.start()
    records, ranges = [], []
    async for batch in stream:
        records.extend(batch.records)
        ranges.append(batch.ranges[(path.name, 0)])
        await stream.mark_processed(batch)
    await stream.stop()
    assert [(r.offset, TokenList.items(r.text)) for r in records] == [(0, ["sku-1", "sku-2"]), (4, ["sku-1", "sku-9", "sku-2"])]
    assert ranges == [(0, 2), (2, 4), (4, 5)]    # every offset covered, the all-malformed batch too
    assert stream.counters.malformed["invalid_json"] == 1
    assert stream.counters.malformed["wrong_type"] == 1 and stream.counters.malformed["missing_field"] == 1
    assert stream.positions() == {(path.name, 0): 5}


def test_livevec_train_reads_json_records_as_the_stream_does(tmp_path):
    """The same sessions as JSON records and as a plain file of tokens train the same vocabulary and
    counts; the malformed JSON lines are counted by reason."""
    sessions = [[f"sku-{(7 * i + j) % 40}" for j in range(6)] for i in range(300)]
    json_path = tmp_path / "s.jsonl"
    json_path.write_text("".join(json.dumps({"user": i, "items": s}) + "\n" + ("garbage\n" if i % 50 == 0 else "")
                                 for i, s in enumerate(sessions)))
    text_path = tmp_path / "s.txt"
    text_path.write_text("".join(" ".join(s) + "\n" for s in sessions))
    learner = LearnerConfig(dim=16, min_count=2, tokenizer="tokens")
    json_trainer, json_result = train_file(TrainSettings(str(json_path), str(tmp_path / "j"), progress=False,
                                                         learner=learner, records=RecordFormat("json", "items")))
    text_trainer, _ = train_file(TrainSettings(str(text_path), str(tmp_path / "t"), progress=False, learner=learner))
    assert json_result.malformed == {"invalid_json": 6}
    assert json_trainer.totals.tokens == text_trainer.totals.tokens == 1800
    assert (tmp_path / "j" / "vocab.txt").read_text() == (tmp_path / "t" / "vocab.txt").read_text()
    assert "sku-7 " in (tmp_path / "j" / "vocab.txt").read_text()


def test_the_sessions_demo_streams_json_sessions_read_as_item2vec():
    import argparse
    from itertools import islice

    from online.cli.up import _corpus_lines, configure, read_settings, reading_env
    parser = argparse.ArgumentParser()
    configure(parser)
    args = read_settings(parser.parse_args(["--demo", "sessions"]), {})
    env = reading_env(args)
    assert env == {"LIVEVEC_RECORD_FORMAT": "json", "LIVEVEC_RECORD_FIELD": "items", "LIVEVEC_TOKENIZER": "tokens"}
    fmt = RecordFormat(env["LIVEVEC_RECORD_FORMAT"], env["LIVEVEC_RECORD_FIELD"])
    sessions = [fmt.extract(line)[0] for line in islice(_corpus_lines(args), 2000)]
    assert all(TokenList.is_one(s) for s in sessions)
    together = sum(1 for s in sessions if {"sku-tent-2p", "sku-sleeping-bag"} <= set(TokenList.items(s)))
    assert together > 30       # the planted co-purchases (never together otherwise: the catalogue holds neither)
    # without the demo, the command passes on the reading it was given
    args = read_settings(parser.parse_args([]), {"LIVEVEC_TOKENIZER": "unicode", "LIVEVEC_LANGUAGE": "ja"})
    assert reading_env(args)["LIVEVEC_TOKENIZER"] == "unicode" and reading_env(args)["LIVEVEC_LANGUAGE"] == "ja"


def _random_json(rng, depth: int = 0):
    pick = rng.random()
    if depth > 3 or pick < 0.45:
        return rng.choice([
            lambda: rng.randint(-10**6, 10**6), lambda: rng.random() * 1e3, lambda: rng.choice([True, False, None]),
            lambda: rng.choice(["sku-1", "", "東京", "a b", "🙂", "x\"y", "tab\there", "back\\slash", "é"]),
            lambda: 10**rng.randint(14, 20), lambda: -0.0, lambda: 1e300])()
    if pick < 0.7:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["items", "event", "text", "user", "ts", "Items", "item", "évent"]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _mutate(rng, data: bytes) -> bytes:
    kind = rng.randrange(6)
    i = rng.randrange(len(data) + 1)
    if kind == 0:
        return data[:i]
    if kind == 1:
        return data[:i] + bytes([rng.choice(b'{}[]",:\\ \t\n0-.eE+tfnu\x00\x1f')]) + data[i:]
    if kind == 2 and data:
        return data[:i] + data[i + 1:]
    if kind == 3:
        return data + rng.choice([b" ", b"\n", b"x", b"}", b" {}"])
    if kind == 4:
        return data.replace(b'"items"', b'"items": 1, "items"', 1)
    return data


@pytest.mark.parametrize("field", ["items", "event.text", "event.items", "text"])
def test_the_compiled_scan_gives_orjsons_verdict_on_every_record(field):
    """Generated records (nested objects, lists, every JSON type, escapes, big numbers, duplicate keys) and
    mutations of them (cut, a byte inserted or dropped, trailing data): the batch scan must give what
    orjson's path gives, value, type and reason, on every one."""
    rng = random.Random(sum(map(ord, field)))
    fmt = RecordFormat("json", field)
    values = []
    for _ in range(4000):
        doc = _random_json(rng)
        plain = rng.choice(["sku-1", "東京 tokyo", "", "🙂", ["a", "b c"], [], [""], ["x", 3], 7, None, {"t": 1}])
        if rng.random() < 0.3:     # what the scan reads itself: no escapes, short numbers
            doc = {"user": "u-1", "ts": rng.randint(0, 10**9), "event": {"text": plain, "items": plain, "n": -1.5},
                   "items": plain, "text": plain, "tags": [True, False, None, 0]}
        elif rng.random() < 0.5:
            doc = {"user": "u-1", "event": {"text": _random_json(rng, 3), "items": _random_json(rng, 2)},
                   "items": rng.choice([["sku-1", "sku-2"], [], ["", "a"], ["a", 1], "s p a c e", _random_json(rng, 3)]),
                   "text": _random_json(rng, 3)}
        data = json.dumps(doc, ensure_ascii=rng.random() < 0.1, indent=rng.choice([None, 1])).encode()
        values.append(_mutate(rng, data) if rng.random() < 0.3 else data)
    values = [v for v in values if v.strip()]
    fast = fmt.extract_many(values)
    slow = [fmt.extract(v) for v in values]
    assert [(type(a[0]), a) for a in fast] == [(type(b[0]), b) for b in slow]
    assert scan_records(values, fmt.path) is None       # some are not UTF-8: the scan reads none of them
    statuses = scan_records([v for v in values if _utf8(v)], fmt.path)[0]
    assert sum(1 for s in statuses if s in (OK_STRING, OK_LIST)) > 50    # the fast path had work to do
    assert {reason for _, reason in slow} >= {None, "invalid_json", "missing_field", "wrong_type"}


def test_livevec_train_writes_a_vocabulary_that_read_vocab_counts_matches_to_the_vectors(tmp_path):
    """A token with a space (kept whole from a JSON list) is spelled in vocab.txt as in the vectors files: a
    raw space would make three columns where word2vec.c's tools read two."""
    from online.learner.word2vec_format import read_vocab_counts

    sessions = [["new york", f"sku-{i % 7}", "los angeles", f"sku-{(i + 3) % 7}"] for i in range(200)]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps({"items": s}) + "\n" for s in sessions))
    train_file(TrainSettings(str(path), str(tmp_path / "out"), progress=False,
                             learner=LearnerConfig(dim=8, min_count=2, tokenizer="tokens"),
                             records=RecordFormat("json", "items")))
    vocab = (tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8")
    assert "new%20york 200\n" in vocab and "new york" not in vocab
    assert all(len(line.split(" ")) == 2 for line in vocab.splitlines())   # word2vec.c reads "word count"
    vectors_file = (tmp_path / "out" / "vectors.txt").read_text(encoding="utf-8")
    assert "\nnew%20york " in vectors_file
    assert read_vocab_counts(tmp_path / "out" / "vocab.txt")["new%20york"] == 200
