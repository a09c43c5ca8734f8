"""Logging for the dev host: one line per record on stderr, ``extra`` fields as key=value."""

from __future__ import annotations

import logging
import sys

_STANDARD = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
_QUIET = ("azure", "uvicorn", "uvicorn.error", "uvicorn.access", "urllib3")


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{key}={value}" for key, value in vars(record).items() if key not in _STANDARD]
        if not fields:
            return line
        head, newline, tail = line.partition("\n")
        return f"{head} {' '.join(fields)}{newline}{tail}"


def configure(level: str, role: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        KeyValueFormatter(f"%(asctime)s %(levelname)s [{role}] %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
