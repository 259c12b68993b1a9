"""The results table atop bench/README.md is what bench/results_table.py renders from bench/results/*.json.

Pure logic: no bench runs. A stale table, a result file that lacks a row's value, target, command, date or
load, a missing headline row, or a README that grew back into a journal fails here.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import result_record  # noqa: E402
import results_table  # noqa: E402

MAX_README_LINES = 600


@pytest.fixture(scope="module")
def files() -> dict[str, dict]:
    return results_table.load_files()


def test_the_readme_table_is_the_rendered_result_files(files):
    readme = (REPO / "bench" / "README.md").read_text(encoding="utf-8")
    assert results_table.current(readme) == results_table.render(files), (
        "bench/README.md's results table differs from bench/results/*.json: "
        "run `python bench/results_table.py --write`")


def test_every_row_has_its_value_target_command_date_and_load(files):
    assert results_table.problems(files) == []
    for row in results_table.rows_of(files):
        for key in ("value", "target", "command", "date"):
            assert isinstance(row.get(key), str) and row[key].strip(), f"{row['file']} {row['key']}: no {key}"
        assert "load" in row, f"{row['file']} {row['key']}: no load"


def test_every_headline_row_is_in_the_table_once(files):
    keys = [row["key"] for row in results_table.rows_of(files)]
    assert sorted(keys) == sorted(key for key, _ in results_table.HEADLINE)
    table = results_table.render(files)
    for _, label in results_table.HEADLINE:
        assert table.count(f"| {label} |") == 1


def test_the_readme_is_short():
    lines = (REPO / "bench" / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < MAX_README_LINES, f"bench/README.md has {lines} lines (at most {MAX_README_LINES - 1})"


@pytest.mark.parametrize("field", ["value", "target", "command", "date", "load"])
def test_a_row_without_a_field_is_refused(files, field):
    broken = copy.deepcopy(files)
    name = next(iter(broken))
    body = broken[name]
    body.pop(field, None)
    for row in body["rows"]:
        row.pop(field, None)
    found = results_table.problems(broken)
    assert any(name in p and f"no {field}" in p for p in found), found
    with pytest.raises(ValueError):
        results_table.render(broken)


def test_a_load_of_null_needs_a_note_and_a_date_must_be_iso(files):
    broken = copy.deepcopy(files)
    body = broken["freshness.json"]
    body["load"] = None
    body.pop("load_note", None)
    assert any("load must be" in p for p in results_table.problems(broken))
    body["load_note"] = "not stated"
    assert results_table.problems(broken) == []
    body["date"] = "5 December"
    assert any("not ISO 8601" in p for p in results_table.problems(broken))


def test_a_row_given_twice_or_unknown_is_refused(files):
    broken = copy.deepcopy(files)
    broken["again.json"] = copy.deepcopy(broken["freshness.json"])
    assert any("also in" in p for p in results_table.problems(broken))
    broken["again.json"]["rows"][0]["key"] = "freshness_again"
    assert any("not a headline row" in p for p in results_table.problems(broken))


def test_a_recorded_result_renders_in_place_of_the_seeded_one(tmp_path, files, monkeypatch):
    """What a bench's --record writes is what the table reads: the command without --record, the date, the
    load average as os.getloadavg() gives it."""
    monkeypatch.setenv("LIVEVEC_SYNC_MS", "500")
    argv = [str(REPO / "bench" / "freshness.py"), "--trials", "20", "--record", str(tmp_path / "x.json")]
    record = result_record.start(tmp_path / "freshness.json", "freshness", argv)
    assert record.command == "LIVEVEC_SYNC_MS=500 .venv/bin/python bench/freshness.py --trials 20"
    assert len(record.load) == 3
    result_record.write(record, [result_record.row("freshness", "p99 0.51 s", "p99 <= 1 s",
                                                   result_record.met(True))])
    recorded = json.loads((tmp_path / "freshness.json").read_text(encoding="utf-8"))
    both = {**{k: v for k, v in files.items() if k != "freshness.json"}, "freshness.json": recorded}
    assert results_table.problems(both) == []
    table = results_table.render(both)
    assert "`LIVEVEC_SYNC_MS=500 .venv/bin/python bench/freshness.py --trials 20`" in table
    assert "| p99 0.51 s | p99 <= 1 s | met |" in table


def test_no_record_asked_writes_nothing(tmp_path):
    assert result_record.start(None, "freshness") is None
    result_record.write(None, [result_record.row("freshness", "v", "t")])
    assert list(tmp_path.iterdir()) == []


def test_splice_keeps_the_rest_of_the_readme():
    readme = f"intro\n{results_table.BEGIN}\nold\n{results_table.END}\nrest\n"
    out = results_table.splice(readme, "new table")
    assert out == f"intro\n{results_table.BEGIN}\nnew table\n{results_table.END}\nrest\n"
    assert results_table.current(out) == "new table"
