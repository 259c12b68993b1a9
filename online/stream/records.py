"""What a record holds: text (the default) or a JSON event whose named field holds the text or the items.

Production topics carry events such as ``{"user": ..., "query": "...", "ts": ...}``; tokenising the whole
record would learn the keys and the numbers. With ``LIVEVEC_RECORD_FORMAT=json`` and
``LIVEVEC_RECORD_FIELD`` a field or a dotted path (``query``, ``event.text``, ``items``):

- a string field is text for the tokenizer (``LIVEVEC_TOKENIZER``);
- a list of strings is one sentence of tokens taken as they are, whatever the tokenizer
  (a token-list record, ``online.learner.tokenizers.TokenList``): an item2vec session such as
  ``["sku-1", "sku-7"]``.

A record that is not JSON (``invalid_json``), lacks the field or holds null there (``missing_field``),
holds anything else there (``wrong_type``: a number, an object, a list with a non-string) or only an
empty string or list (``empty``) is malformed: the stream counts it by reason
(``livevec_stream_malformed_total``), logs it at a bounded rate and skips it, and its offset is
processed in order with the others (``online.stream.reader``), so nothing stalls and nothing is lost.

The Kafka workers (``online.stream.reader``), ``livevec train`` and ``livevec up --corpus`` read records
through ``RecordFormat`` (a batch at a time: ``extract_many``), so a file of one JSON record per line trains as the topic would.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from online.learner.tokenizers import TokenList
from online.stream.json_scan import EMPTY, OK_LIST, OK_STRING, scan_records
from ps_bridge.settings import Setting, SettingError, SettingGroup

RECORD_FORMATS = ("text", "json")
# Why a JSON record is skipped (``empty`` is the stream's own reason, shared with text records).
JSON_REASONS = ("invalid_json", "missing_field", "wrong_type")

RECORDS = SettingGroup("records", (
    Setting("record_format", "LIVEVEC_RECORD_FORMAT", default="text", choices=RECORD_FORMATS,
            help="text: a record is text; json: a JSON object whose LIVEVEC_RECORD_FIELD holds the text "
                 "(a string) or one sentence of tokens (a list of strings)"),
    Setting("record_field", "LIVEVEC_RECORD_FIELD", default="", metavar="PATH",
            help="with json: the field or dotted path of the text or the items (query, event.text, items)"),
))


@dataclass(frozen=True)
class RecordFormat:
    """How a record's (decoded) value becomes what the tokenizer reads."""

    kind: str = "text"
    field: str = ""
    path: tuple[str, ...] = dataclasses.field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in RECORD_FORMATS:
            raise SettingError("LIVEVEC_RECORD_FORMAT", f"must be one of {', '.join(RECORD_FORMATS)}, "
                                                        f"got {self.kind!r}")
        if self.kind == "text" and self.field:
            raise SettingError("LIVEVEC_RECORD_FIELD", "is read only with LIVEVEC_RECORD_FORMAT=json "
                                                       f"(got {self.field!r} with text records)")
        if self.kind == "json":
            path = tuple(self.field.split("."))
            if not self.field or not all(path):
                raise SettingError("LIVEVEC_RECORD_FIELD", "is required with LIVEVEC_RECORD_FORMAT=json: a field "
                                                           f"or a dotted path such as event.text, got {self.field!r}")
            object.__setattr__(self, "path", path)

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> "RecordFormat":
        values = RECORDS.read(args, os.environ if env is None else env)
        return cls(values["record_format"], values["record_field"] or "")

    @property
    def is_text(self) -> bool:
        return self.kind == "text"

    def describe(self) -> str:
        """How the checkpoint's metadata and the logs name it."""
        return self.kind if self.is_text else f"json:{self.field}"

    def extract(self, value: str | bytes) -> tuple[str | None, str | None]:
        """``(what the tokenizer reads, None)``, text or a token-list record, or ``(None, reason)``."""
        if self.kind == "text":
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            return (" " + text[1:] if TokenList.is_one(text) else text), None
        if not value.strip():   # blanks alone are no record, as with text records
            return None, "empty"
        try:
            found = orjson.loads(value)
        except orjson.JSONDecodeError:    # as the stream says of a value that is not UTF-8, whatever its format
            return None, "invalid_utf8" if isinstance(value, bytes) and not _is_utf8(value) else "invalid_json"
        for key in self.path:
            if type(found) is not dict:
                return None, "missing_field"
            found = found.get(key)
        if found is None:
            return None, "missing_field"
        if type(found) is str:
            if TokenList.is_one(found):     # text, even if it starts with the token lists' mark
                found = " " + found[1:]
            return (found, None) if found.strip() else (None, "empty")
        if type(found) is list:
            try:
                items = TokenList.of(found)     # str.join refuses a non-string: the check at C speed
            except TypeError:
                return None, "wrong_type"
            return (items, None) if any(found) else (None, "empty")
        return None, "wrong_type"

    def extract_many(self, values: list[bytes]) -> list[tuple[str | None, str | None]]:
        """``extract`` of each of ``values``: JSON records in one compiled pass, and those it cannot vouch for
        through ``extract`` (``online.stream.json_scan``)."""
        if self.is_text or not values:
            return [self.extract(v) for v in values]
        scanned = scan_records(values, self.path)
        if scanned is None:     # a value that is not UTF-8: the scan reads the others
            utf8 = [_is_utf8(v) for v in values]
            good = iter(self.extract_many([v for v, ok in zip(values, utf8) if ok]))
            return [next(good) if ok else self.extract(v) for v, ok in zip(values, utf8)]
        statuses, fields = scanned
        if statuses.count(OK_LIST) == len(statuses):     # a stream of item lists, the common batch
            return list(zip(fields, itertools.repeat(None)))
        out: list[tuple[str | None, str | None]] = []
        append = out.append
        for value, status, field in zip(values, statuses, fields):
            if status == OK_LIST:
                append((field, None))
            elif status == OK_STRING:
                append((field, None) if field.strip() else (None, "empty"))
            elif status == EMPTY:
                append((None, "empty"))
            else:
                append(self.extract(value))
        return out

    def extract_lines(self, block: bytes) -> tuple[list[str], dict[str, int]]:
        """The records of a block of lines (a file: one record per line) and the malformed ones by reason;
        blank lines are no records at all, as ``livevec produce`` skips them."""
        records: list[str] = []
        malformed: dict[str, int] = {}
        lines = [line for line in block.split(b"\n") if line.strip()]
        for record, reason in self.extract_many(lines):
            if reason is None:
                records.append(record)
            else:
                malformed[reason] = malformed.get(reason, 0) + 1
        return records, malformed


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
