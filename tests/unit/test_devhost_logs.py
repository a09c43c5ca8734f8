"""The dev host's logging: records go through a queue to one writer thread, so a logging
thread never waits on stderr; shutdown writes everything still queued."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from sas_local.devhost import logs
from sas_local.processes import REPO_ROOT

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
    log = logging.getLogger("sas_local.test")
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
    assert lines[0].endswith("INFO [w0 1] sas_local.test: first")
    assert lines[50].endswith("sas_local.test: record 49 order_id=o49")


def test_shutdown_writes_what_is_queued_and_later_records_go_straight_out(stream):
    stream.release.set()
    logs.configure("INFO", "w1 2", stream)
    log = logging.getLogger("sas_local.test")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra={"attempt": 2})
    logs.shutdown()
    log.warning("after")

    text = stream.getvalue()
    head = text.splitlines()[0]
    assert head.endswith("ERROR [w1 2] sas_local.test: failed attempt=2")
    assert text.count("ValueError: boom") == 1  # the traceback, once
    assert text.splitlines()[-1].endswith("WARNING [w1 2] sas_local.test: after")


def test_flush_returns_once_what_was_logged_is_written_and_writes_no_marker(stream):
    """A worker flushes before it reports ready: its start-up lines are on stderr by then."""
    logs.configure("INFO", "w0 3", stream)
    log = logging.getLogger("sas_local.test")
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
    assert lines[1].endswith("INFO [w0 3] sas_local.test: started queues=record<-in")


def test_an_app_record_the_functions_host_would_drop_is_marked(stream):
    """As the Python worker, the dev host knows an invocation's records by the id in the
    emitting thread: a record from a thread the app started without it is marked, the way
    Application Insights would never see it; one whose thread inherits it is not."""
    from concurrent.futures import ThreadPoolExecutor
    from contextvars import copy_context

    from sas.entrypoints.invocation import attributed
    from sas_local.devhost.invoke import WORKER_LOCAL, call_sync

    stream.release.set()
    logs.configure("INFO", "w0 1", stream)
    log = logging.getLogger("sas.test")

    def invocation() -> None:
        log.warning("sas.in_the_invocation")
        stray = threading.Thread(target=lambda: log.warning("sas.from_a_bare_thread"))
        stray.start()
        stray.join()
        with attributed(WORKER_LOCAL, "inv-1"), ThreadPoolExecutor(2) as pool:
            pool.submit(copy_context().run, log.warning, "sas.from_an_inheriting_pool").result()

    call_sync(invocation, {}, "inv-1")

    def later_on_a_reused_thread() -> None:  # the id a finished invocation left behind
        WORKER_LOCAL.invocation_id = "inv-1"
        log.warning("sas.after_the_invocation")

    reused = threading.Thread(target=later_on_a_reused_thread)
    reused.start()
    reused.join()
    logs.flush()
    lines = {line.split(": ", 1)[1].split(" ")[0]: line for line in stream.getvalue().splitlines()}
    assert f"{logs.DROPPED}=1" in lines["sas.from_a_bare_thread"]
    assert logs.DROPPED not in lines["sas.in_the_invocation"]
    assert logs.DROPPED not in lines["sas.from_an_inheriting_pool"]
    assert f"{logs.DROPPED}=1" in lines["sas.after_the_invocation"]


def test_the_pools_parent_logs_without_loading_the_apps_modules() -> None:
    """A dev host's parent only starts and watches workers: importing the app's machinery
    there (telemetry, pydantic, azure.functions) cost each of the Flex layout's 24 hosts a
    second of CPU, twice over."""
    probe = (
        "import sys\n"
        "from sas_local.devhost import __main__, logs\n"
        "logs.configure('INFO', 'host 1', app=False)\n"
        "logs.shutdown()\n"
        "heavy = ('sas.services', 'sas.domain', 'azure', 'pydantic', 'opentelemetry')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert done.stdout.strip() == "[]"
