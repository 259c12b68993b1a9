"""The table of headline figures atop ``bench/README.md``, rendered from the result files in ``bench/results/``.

    python bench/results_table.py            # print the table
    python bench/results_table.py --write    # rewrite it between the README's markers
    python bench/results_table.py --check    # exit 1 when the README's table differs from the files

Each result file is one bench run, written by the bench's ``--record PATH`` (``result_record.py``): its
command, UTC date, load average at the start, and one or more rows keyed by :data:`HEADLINE`. The table lists
the headline rows in that order; ``tests/test_bench_results.py`` fails when the README's copy is stale, when a
headline row is missing or given twice, or when a row lacks its value, target, command, date or load.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
README = BENCH / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

# (key, what the row measures), in the table's order.
HEADLINE = [
    ("train_vs_gensim", "`livevec train` against gensim, one pass"),
    ("train_five_passes", "`livevec train` against gensim, five passes"),
    ("pipeline_vs_gensim", "the pipeline (Kafka, 2 workers, 1 server) against gensim"),
    ("bytes_per_token", "ps-lite bytes per trained token, 2 workers"),
    ("replicas_8", "8 workers, a replica each"),
    ("replicas_16", "16 workers, a replica each"),
    ("hosts_4x2", "8 workers on 4 hosts, the 2 of a host sharing its replica"),
    ("scaling_model", "the model: 16 and 64 hosts x 16 cores on 10 Gbit/s against one host"),
    ("freshness", "freshness: a new word's planted neighbour served"),
    ("freshness_spread", "freshness, each burst spread over every partition (`--spread`)"),
    ("serving_1m", "serving 1M words, one core, training alongside"),
    ("serving_10m", "serving 10M words, one core, training alongside"),
    ("frontend_10m", "a 10M-word front end with its default settings, 20,000 rows/s changing"),
    ("cold_start", "restarts from the image, empty kernel cache: a worker's first trained batch, a front end's ready"),
    ("recovery", "recovery after `kill -9`, per role"),
]
REQUIRED_FILE = ("bench", "command", "date", "rows")
REQUIRED_ROW = ("key", "value", "target")


def load_files(results: Path = RESULTS) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(results.glob("*.json"))}


def rows_of(files: dict[str, dict]) -> list[dict]:
    """Every row with its file's command, date, load and note (a row may carry its own)."""
    out = []
    for name, body in files.items():
        for row in body.get("rows", []):
            merged = {k: body[k] for k in ("bench", "command", "date", "load", "load_note", "note") if k in body}
            out.append({**merged, **row, "file": name})
    return out


def _load_ok(row: dict) -> bool:
    load = row.get("load", "absent")
    if isinstance(load, (int, float)) and not isinstance(load, bool):
        return True
    if isinstance(load, list) and 1 <= len(load) <= 3 and all(isinstance(x, (int, float)) for x in load):
        return True
    return load is None and bool(row.get("load_note"))   # a figure whose load was never stated says so


def problems(files: dict[str, dict]) -> list[str]:
    """What keeps the files from making the table: missing fields, unknown, missing or repeated rows."""
    found = []
    for name, body in files.items():
        for key in REQUIRED_FILE:
            if key not in body:
                found.append(f"{name}: no {key!r}")
    seen: dict[str, str] = {}
    known = {key for key, _ in HEADLINE}
    for row in rows_of(files):
        where = f"{row['file']} row {row.get('key')!r}"
        for key in (*REQUIRED_ROW, "command", "date"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                found.append(f"{where}: no {key}")
        if "load" not in row:
            found.append(f"{where}: no load")
        elif not _load_ok(row):
            found.append(f"{where}: load must be a number, os.getloadavg()'s list, or null with a load_note")
        if isinstance(row.get("date"), str):
            try:
                datetime.datetime.fromisoformat(row["date"])
            except ValueError:
                found.append(f"{where}: date {row['date']!r} is not ISO 8601")
        if row.get("key") not in known:
            found.append(f"{where}: not a headline row ({', '.join(sorted(known))})")
        elif row["key"] in seen:
            found.append(f"{where}: also in {seen[row['key']]}")
        else:
            seen[row["key"]] = row["file"]
    for key, _ in HEADLINE:
        if key not in seen:
            found.append(f"no result file has the row {key!r}")
    return found


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _date(iso: str) -> str:
    when = datetime.datetime.fromisoformat(iso)
    if when.tzinfo is not None:
        when = when.astimezone(datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M")


def _load(row: dict) -> str:
    load = row["load"]
    if load is None:
        return "not stated"
    return f"{(load[0] if isinstance(load, list) else load):.2f}"


def render(files: dict[str, dict]) -> str:
    """The table and its notes, as they stand between the README's markers."""
    bad = problems(files)
    if bad:
        raise ValueError("bench/results: " + "; ".join(bad))
    by_key = {row["key"]: row for row in rows_of(files)}
    lines = ["| figure | value | target | status | command | date (UTC) | load |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    notes: dict[str, tuple[list[str], list[str]]] = {}   # per note: the rows it is about, its text
    for key, label in HEADLINE:
        row = by_key[key]
        lines.append(f"| {_cell(label)} | {_cell(row['value'])} | {_cell(row['target'])} "
                     f"| {_cell(row.get('status', ''))} | `{_cell(row['command'])}` | {_date(row['date'])} "
                     f"| {_load(row)} |")
        for note in filter(None, (row.get("note"), row.get("load_note"))):
            notes.setdefault(note, ([], [note]))[0].append(label)
    out = [f"<!-- generated by bench/results_table.py from bench/results/*.json: edit those, then run "
           f"`python bench/results_table.py --write` -->", "", *lines]
    if notes:
        out += ["", *(f"- {_cell('; '.join(labels))}: {_cell(text)}" for labels, (text,) in notes.values())]
    return "\n".join(out)


def splice(readme: str, table: str) -> str:
    """The README with ``table`` between its markers."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"bench/README.md has no {BEGIN} ... {END} block")
    return readme[:start + len(BEGIN)] + "\n" + table + "\n" + readme[end:]


def current(readme: str) -> str:
    """The table as the README has it now."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"bench/README.md has no {BEGIN} ... {END} block")
    return readme[start + len(BEGIN):end].strip("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the table in bench/README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when bench/README.md's table is stale")
    ap.add_argument("--results", default=str(RESULTS), help="directory of result files (bench/results)")
    ap.add_argument("--readme", default=str(README))
    args = ap.parse_args(argv)
    try:
        table = render(load_files(Path(args.results)))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    readme = Path(args.readme)
    if args.write:
        readme.write_text(splice(readme.read_text(encoding="utf-8"), table), encoding="utf-8")
        print(f"{readme}: table rewritten from {args.results}")
    elif args.check:
        if current(readme.read_text(encoding="utf-8")) != table:
            print(f"{readme}: the results table is stale; run python bench/results_table.py --write",
                  file=sys.stderr)
            return 1
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
