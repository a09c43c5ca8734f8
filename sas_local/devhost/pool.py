"""The parent process: start N workers, replace crashed ones, stop them all on SIGTERM/SIGINT.

Each worker reports readiness on its own pipe. A worker that dies before the first readiness
line is printed is a start-up failure (bad settings, app import error): everything stops
with that worker's exit code. After that, a worker that dies is replaced (like the hosting
infrastructure replaces a crashed instance), with a back-off when it keeps crashing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

READY_PREFIX = "sas.devhost ready"
STABLE_AFTER = 30.0  # a worker that ran this long resets its crash back-off
MAX_BACKOFF = 30.0


@dataclass
class Slot:
    index: int
    process: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None
    buffer: bytes = b""
    ready: bool = False
    ever_ready: bool = False
    started_at: float = 0.0
    restart_at: float | None = None
    crashes: int = 0
    restarts: int = 0
    report: dict[str, Any] = field(default_factory=dict)


class WorkerPool:
    def __init__(
        self,
        command: Callable[[int, int], list[str]],
        workers: int,
        env: dict[str, str],
        grace: float,
    ) -> None:
        self._command = command
        self._slots = [Slot(index) for index in range(workers)]
        self._env = env
        self._grace = grace
        self._stopping = False
        self._force = False
        self._announced = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            self._force = True  # a second Ctrl-C: do not wait for in-flight invocations
            for slot in self._slots:
                if slot.process is not None and slot.process.poll() is None:
                    slot.process.kill()
        self._stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        failed: int | None = None
        try:
            for slot in self._slots:
                self._spawn(slot)
            while not self._stopping:
                self._read_reports()
                failed = self._check_workers()
                if failed is not None:
                    break
                self._announce()
        finally:
            self._stop_all()
        log.info("sas.devhost.stopped", extra={"exit_code": failed or 0})
        return failed or 0

    def _spawn(self, slot: Slot) -> None:
        read_fd, write_fd = os.pipe()
        try:
            process = subprocess.Popen(
                self._command(slot.index, write_fd), env=self._env, pass_fds=(write_fd,)
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        slot.process = process
        slot.ready_fd = read_fd
        slot.buffer = b""
        slot.ready = False
        slot.restart_at = None
        slot.started_at = time.monotonic()
        log.info("sas.devhost.worker_spawned", extra={"worker": slot.index, "pid": process.pid})

    def _read_reports(self) -> None:
        by_fd = {slot.ready_fd: slot for slot in self._slots if slot.ready_fd is not None}
        if not by_fd:
            time.sleep(0.2)
            return
        readable, _, _ = select.select(list(by_fd), [], [], 0.2)
        for fd in readable:
            self._read(by_fd[fd])

    def _read(self, slot: Slot) -> None:
        if slot.ready_fd is None:
            return
        try:
            chunk = os.read(slot.ready_fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._close(slot)
            return
        slot.buffer += chunk
        while b"\n" in slot.buffer:
            line, _, slot.buffer = slot.buffer.partition(b"\n")
            text = line.decode(errors="replace")
            if text.startswith("ready "):
                slot.report = json.loads(text[len("ready ") :])
                slot.ready = slot.ever_ready = True
                log.info(
                    "sas.devhost.worker_ready",
                    extra={
                        "worker": slot.index,
                        "pid": slot.report.get("pid"),
                        "restarts": slot.restarts,
                    },
                )

    def _close(self, slot: Slot) -> None:
        if slot.ready_fd is not None:
            os.close(slot.ready_fd)
            slot.ready_fd = None

    def _check_workers(self) -> int | None:
        now = time.monotonic()
        for slot in self._slots:
            process = slot.process
            if process is not None and process.poll() is not None:
                while slot.ready_fd is not None:  # a report written just before exiting
                    self._read(slot)
                if self._stopping:
                    return None
                code = process.returncode
                if not self._announced and not slot.ever_ready:
                    log.error(
                        "sas.devhost.worker_failed_to_start",
                        extra={"worker": slot.index, "exit_code": code},
                    )
                    return code or 1
                slot.process = None
                slot.ready = False
                slot.crashes = slot.crashes + 1 if now - slot.started_at < STABLE_AFTER else 1
                delay = min(MAX_BACKOFF, 0.5 * 2 ** (slot.crashes - 1))
                slot.restart_at = now + delay
                log.error(
                    "sas.devhost.worker_exited",
                    extra={
                        "worker": slot.index,
                        "pid": process.pid,
                        "exit_code": code,
                        "restart_in_s": delay,
                    },
                )
            elif process is None and slot.restart_at is not None and now >= slot.restart_at:
                slot.restarts += 1
                self._spawn(slot)
                log.warning(
                    "sas.devhost.worker_restarted",
                    extra={"worker": slot.index, "restarts": slot.restarts},
                )
        return None

    def _announce(self) -> None:
        if self._announced or not all(slot.ready for slot in self._slots):
            return
        self._announced = True
        lead = self._slots[0].report
        port = int(lead.get("http_port") or 0)
        functions = ",".join(lead.get("functions", []))
        http = f"127.0.0.1:{port}" if port else "off"
        print(
            f"{READY_PREFIX} workers={len(self._slots)} functions={functions} http={http}",
            flush=True,
        )

    def _stop_all(self) -> None:
        self._stopping = True
        live = [
            s.process for s in self._slots if s.process is not None and s.process.poll() is None
        ]
        for process in live:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self._grace + 5.0
        while any(p.poll() is None for p in live) and time.monotonic() < deadline:
            if self._force:
                break
            time.sleep(0.05)
        for process in live:
            if process.poll() is None:
                log.warning("sas.devhost.worker_killed", extra={"pid": process.pid})
                process.kill()
            process.wait()
        for slot in self._slots:
            self._close(slot)
