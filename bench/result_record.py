"""A bench result as one JSON file in ``bench/results/``, the source of the table atop ``bench/README.md``.

A bench that produces a headline figure takes ``--record PATH``. It calls :func:`start` before it measures
(the command, the UTC date and the load average are taken then) and :func:`write` with its rows at the end::

    {"bench": "freshness",
     "command": ".venv/bin/python bench/freshness.py --trials 20",
     "date": "2026-12-05T12:56:00+00:00",
     "load": [2.1, 1.9, 1.2],
     "rows": [{"key": "freshness", "value": "p99 0.52 s ...", "target": "p99 <= 1 s ...", "status": "met"}]}

``command`` is what reproduces the figure: the ``LIVEVEC_*`` settings in the environment, then the script
and its arguments, without ``--record``. ``load`` is ``os.getloadavg()`` at the start. A row's ``key`` is
one of ``results_table.HEADLINE``; ``status`` is optional. ``bench/results_table.py --write`` renders the
files into the README.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = ".venv/bin/python"


def command_line(argv: list[str], environ: dict[str, str]) -> str:
    """The command that reproduces a run: ``LIVEVEC_*`` settings, the interpreter, the script relative to the
    repository, its arguments less ``--record PATH``."""
    script = Path(argv[0]).resolve()
    try:
        script_arg = str(script.relative_to(REPO))
    except ValueError:
        script_arg = argv[0]
    args, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg == "--record":
            skip = True
        elif not arg.startswith("--record="):
            args.append(arg)
    env = [f"{k}={shlex.quote(v) if v else ''}" for k, v in sorted(environ.items()) if k.startswith("LIVEVEC_")]
    return " ".join([*env, PYTHON, shlex.quote(script_arg), *map(shlex.quote, args)])


@dataclass
class Record:
    path: Path
    bench: str
    command: str
    date: str
    load: list[float]
    rows: list[dict] = field(default_factory=list)


def start(path: str | os.PathLike | None, bench: str, argv: list[str] | None = None) -> Record | None:
    """Take the command, the date and the load now; ``None`` when no ``--record`` was asked for."""
    if path is None:
        return None
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return Record(Path(path), bench, command_line(sys.argv if argv is None else argv, dict(os.environ)),
                  now.isoformat(), [round(x, 2) for x in os.getloadavg()])


def row(key: str, value: str, target: str, status: str | None = None) -> dict:
    out = {"key": key, "value": value, "target": target}
    if status is not None:
        out["status"] = status
    return out


def met(ok: bool) -> str:
    return "met" if ok else "missed"


def write(record: Record | None, rows: list[dict]) -> None:
    """Write the result file (nothing without ``--record``); then ``bench/results_table.py --write`` renders it."""
    if record is None or not rows:
        return
    record.path.parent.mkdir(parents=True, exist_ok=True)
    body = {"bench": record.bench, "command": record.command, "date": record.date, "load": record.load,
            "rows": rows}
    record.path.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"result recorded in {record.path}; `python bench/results_table.py --write` puts it in bench/README.md",
          file=sys.stderr, flush=True)
