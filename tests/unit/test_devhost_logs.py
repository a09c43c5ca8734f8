"""The dev host's logging: records go through a queue to one writer thread, so a logging
thread never waits on stderr; shutdown writes everything still queued."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator

import pytest

from sas_local.devhost import logs

pytestmark = pytest.mark.unit


class BlockingStream(io.StringIO):
    """A stderr whose writes wait until ``release`` is set (a full pipe)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        self.release.wait()
        return super().write(text)


@pytest.fixture
def stream() -> Iterator[BlockingStream]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    quiet = {name: logging.getLogger(name).level for name in logs._QUIET}
    blocking = BlockingStream()
    yield blocking
    blocking.release.set()
    logs.shutdown()
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, was in quiet.items():
        logging.getLogger(name).setLevel(was)


def test_logging_threads_do_not_wait_for_a_blocked_stderr(stream):
    logs.configure("INFO", "w0 1", stream)
    log = logging.getLogger("sas.test")
    log.info("first")
    assert stream.entered.wait(10)  # the writer thread is now stuck in write()

    done = threading.Event()

    def many() -> None:
        for n in range(50):
            log.info("record %d", n, extra={"order_id": f"o{n}"})
        done.set()

    threading.Thread(target=many, daemon=True).start()
    assert done.wait(10)  # with the stream handler on the root logger, this would hang
    stream.release.set()
    logs.shutdown()

    lines = stream.getvalue().splitlines()
    assert len(lines) == 51
    assert lines[0].endswith("INFO [w0 1] sas.test: first")
    assert lines[50].endswith("sas.test: record 49 order_id=o49")


def test_shutdown_writes_what_is_queued_and_later_records_go_straight_out(stream):
    stream.release.set()
    logs.configure("INFO", "w1 2", stream)
    log = logging.getLogger("sas.test")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra={"attempt": 2})
    logs.shutdown()
    log.warning("after")

    text = stream.getvalue()
    head = text.splitlines()[0]
    assert head.endswith("ERROR [w1 2] sas.test: failed attempt=2")
    assert text.count("ValueError: boom") == 1  # the traceback, once
    assert text.splitlines()[-1].endswith("WARNING [w1 2] sas.test: after")


def test_flush_returns_once_what_was_logged_is_written_and_writes_no_marker(stream):
    """A worker flushes before it reports ready: its start-up lines are on stderr by then."""
    logs.configure("INFO", "w0 3", stream)
    log = logging.getLogger("sas.test")
    log.info("first")
    assert stream.entered.wait(10)  # the writer is stuck in that line...
    log.info("started", extra={"queues": "record<-in"})  # ...so this one waits in the queue
    flushed = threading.Event()

    def flush() -> None:
        logs.flush()
        flushed.set()

    threading.Thread(target=flush, daemon=True).start()
    assert not flushed.wait(0.2)  # nothing written yet: flush waits
    stream.release.set()
    assert flushed.wait(10)
    lines = stream.getvalue().splitlines()  # both, and not the marker
    assert len(lines) == 2
    assert lines[1].endswith("INFO [w0 3] sas.test: started queues=record<-in")
