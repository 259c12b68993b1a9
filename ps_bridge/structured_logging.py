"""One log line per event, as ``key=value`` pairs that grep, Loki and humans all read.

Services call ``log_event(logger, "batch_pushed", keys=1024, ms=3.2)`` rather than
formatting prose, so that operators can filter on fields.
"""
from __future__ import annotations

import logging
import sys
import time

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None)))


def _fmt_value(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"logger={record.name}",
                 f"pid={record.process}", f"event={_fmt_value(record.getMessage())}"]
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_") and key not in ("message", "asctime"):
                parts.append(f"{key}={_fmt_value(value)}")
        if record.exc_info:
            parts.append(f"exc={_fmt_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure_logging(level: str | None = None) -> None:
    """Log ``key=value`` lines to stderr at ``level`` (default INFO); called again, only the level changes."""
    level = (level or "INFO").upper()
    root = logging.getLogger()
    if any(getattr(h, "_key_value_handler", False) for h in root.handlers):
        root.setLevel(level)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    handler._key_value_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: object) -> None:
    logger.log(level, event, extra=fields)
