"""Start helper processes (the dev host, uvicorn servers), wait until ready, stop them cleanly.

Each process runs in its own session (process group) with stdout and stderr in log files, so
waiting for a readiness line never blocks on a full pipe. ``stop()`` sends SIGTERM to the whole
group, waits a grace period, then SIGKILLs whatever is left.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Self, TypeVar

REPO_ROOT = Path(__file__).parents[1]  # module __file__ is absolute; no I/O at import
DEVHOST_READY = re.compile(
    r"^sas\.devhost ready workers=(?P<workers>\d+) functions=(?P<functions>\S*) "
    r"http=(?P<http>\S+)$",
    re.MULTILINE,
)

T = TypeVar("T")
Stream = Literal["stdout", "stderr"]


class ProcessExitedError(RuntimeError):
    """The process ended while we were waiting for it to become ready."""


def wait_until(
    condition: Callable[[], T | None], timeout: float, *, interval: float = 0.05, what: str = ""
) -> T:
    """Poll ``condition`` until it returns something truthy; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what or 'condition'} not met within {timeout}s")
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, pgrp, ...]."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def children(pid: int) -> list[int]:
    """Live direct children of ``pid`` (Linux /proc)."""
    found = []
    for candidate in _all_pids():
        fields = stat_fields(candidate)
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[1]) == pid:
            found.append(candidate)
    return sorted(found)


def descendants(pid: int) -> list[int]:
    """Live children, grandchildren... of ``pid``."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        kids = [kid for parent in frontier for kid in children(parent)]
        found += kids
        frontier = kids
    return sorted(found)


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    found = []
    for candidate in _all_pids():
        fields = stat_fields(candidate)
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            found.append(candidate)
    return sorted(found)


@dataclass
class ManagedProcess:
    """A started process with its output in ``log_dir``; a context manager that stops it."""

    args: list[str]
    process: subprocess.Popen[bytes]
    log_dir: Path
    new_session: bool = True
    _owns_log_dir: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / "stdout.log"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / "stderr.log"

    def poll(self) -> int | None:
        return self.process.poll()

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def output(self) -> str:
        """stdout then stderr, for failure messages."""
        return f"--- stdout ---\n{self.stdout()}\n--- stderr ---\n{self.stderr()}"

    def _exited(self, what: str) -> ProcessExitedError:
        tail = self.stderr()[-3000:]
        return ProcessExitedError(
            f"process {self.pid} exited with {self.process.returncode} while waiting for "
            f"{what}; stderr tail:\n{tail}"
        )

    def wait_for_line(
        self, pattern: str | re.Pattern[str], timeout: float = 30.0, stream: Stream = "stdout"
    ) -> re.Match[str]:
        """Wait until a line of ``stream`` matches ``pattern`` (``re.search``, multiline)."""
        regex = re.compile(pattern, re.MULTILINE) if isinstance(pattern, str) else pattern
        read = self.stdout if stream == "stdout" else self.stderr
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(read())
            if found is not None:
                return found
            if self.process.poll() is not None:
                found = regex.search(read())
                if found is not None:
                    return found
                raise self._exited(f"{regex.pattern!r} on {stream}")
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no line matching {regex.pattern!r} on {stream} of process {self.pid} "
                    f"within {timeout}s\n{self.output()[-3000:]}"
                )
            time.sleep(0.05)

    def wait_for_port(self, port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not port_open(port, host):
            if self.process.poll() is not None:
                raise self._exited(f"port {port}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{host}:{port} not open within {timeout}s")
            time.sleep(0.05)

    def wait_for_http(self, url: str, timeout: float = 30.0, status: int = 200) -> None:
        """Wait until GET ``url`` answers ``status``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - local
                    if response.status == status:
                        return
            except urllib.error.HTTPError as error:
                if error.code == status:
                    return
            except (urllib.error.URLError, OSError):
                pass
            if self.process.poll() is not None:
                raise self._exited(url)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{url} did not answer {status} within {timeout}s")
            time.sleep(0.05)

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def send_signal(self, signum: int) -> None:
        """Signal the process itself (not its group)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def _signal_group(self, signum: int) -> None:
        try:
            if self.new_session:
                os.killpg(self.pid, signum)
            elif self.process.poll() is None:
                self.process.send_signal(signum)
        except ProcessLookupError:
            pass

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM the process group, wait ``grace`` s for it to empty, then SIGKILL the rest."""
        deadline = time.monotonic() + grace
        if self.process.poll() is None or (self.new_session and group_members(self.pid)):
            self._signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(max(0.0, deadline - time.monotonic()))
        while self.new_session and group_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.process.poll() is None or (self.new_session and group_members(self.pid)):
            self._signal_group(signal.SIGKILL)
        return self.process.wait()

    def kill(self) -> int:
        self._signal_group(signal.SIGKILL)
        return self.process.wait()

    def close(self) -> None:
        """Stop (if running) and remove a log directory this object created."""
        self.stop()
        if self._owns_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def child_env(env: Mapping[str, str | None] | None, inherit: bool = True) -> dict[str, str]:
    """``os.environ`` (if ``inherit``) updated with ``env``; a None value removes the key.
    The repository root is put first on PYTHONPATH so ``-m sas...`` works from any cwd."""
    merged = dict(os.environ) if inherit else {}
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    path = merged.get("PYTHONPATH", "")
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
    merged.setdefault("PYTHONUNBUFFERED", "1")
    return merged


def start_process(
    args: Sequence[str],
    *,
    env: Mapping[str, str | None] | None = None,
    inherit_env: bool = True,
    cwd: Path | None = None,
    log_dir: Path | None = None,
    new_session: bool = True,
) -> ManagedProcess:
    """Start ``args`` with output to ``log_dir`` (default: a new temp dir removed by close())."""
    owns = log_dir is None
    directory = Path(tempfile.mkdtemp(prefix="sas-proc-")) if log_dir is None else log_dir
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "stdout.log").open("wb") as out, (directory / "stderr.log").open("wb") as err:
        process = subprocess.Popen(
            list(args),
            env=child_env(env, inherit_env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=new_session,
        )
    return ManagedProcess(list(args), process, directory, new_session, _owns_log_dir=owns)


@dataclass
class DevHost(ManagedProcess):
    """A running ``python -m sas_local.devhost``; ``ready`` is its readiness line once seen."""

    ready: re.Match[str] | None = None

    def wait_ready(self, timeout: float = 30.0) -> re.Match[str]:
        self.ready = self.wait_for_line(DEVHOST_READY, timeout)
        return self.ready

    @property
    def functions(self) -> list[str]:
        if self.ready is None:
            raise RuntimeError("dev host not ready yet")
        return [name for name in self.ready.group("functions").split(",") if name]

    @property
    def http_url(self) -> str | None:
        """``http://127.0.0.1:PORT`` if the dev host serves HTTP."""
        if self.ready is None:
            raise RuntimeError("dev host not ready yet")
        http = self.ready.group("http")
        return None if http == "off" else f"http://{http}"

    def worker_pids(self) -> list[int]:
        return children(self.pid)


def devhost_args(
    app: Path | None = None,
    *,
    workers: int = 1,
    http_port: int = 0,
    functions: Sequence[str] | None = None,
    timers: bool = True,
    settings: Path | None = None,
    grace: float | None = None,
    log_level: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    args = [sys.executable, "-m", "sas_local.devhost", "--workers", str(workers)]
    args += ["--http-port", str(http_port)]
    if app is not None:
        args += ["--app", str(app)]
    if functions:
        args += ["--functions", ",".join(functions)]
    if not timers:
        args.append("--no-timers")
    if settings is not None:
        args += ["--settings", str(settings)]
    if grace is not None:
        args += ["--grace", str(grace)]
    if log_level is not None:
        args += ["--log-level", log_level]
    return args + list(extra_args)


def start_devhost(
    app: Path | None = None,
    *,
    env: Mapping[str, str | None] | None = None,
    workers: int = 1,
    http_port: int = 0,
    functions: Sequence[str] | None = None,
    timers: bool = True,
    settings: Path | None = None,
    grace: float | None = None,
    log_level: str | None = None,
    extra_args: Sequence[str] = (),
    cwd: Path | None = None,
    log_dir: Path | None = None,
    wait: bool = True,
    timeout: float = 30.0,
) -> DevHost:
    """Start the dev host; with ``wait`` return once it printed its readiness line.

    Raises ProcessExitedError (with the stderr tail) if it exits first, e.g. on a missing
    setting; the process is stopped and its logs kept for the message.
    """
    args = devhost_args(
        app,
        workers=workers,
        http_port=http_port,
        functions=functions,
        timers=timers,
        settings=settings,
        grace=grace,
        log_level=log_level,
        extra_args=extra_args,
    )
    started = start_process(args, env=env, cwd=cwd, log_dir=log_dir)
    host = DevHost(
        started.args,
        started.process,
        started.log_dir,
        started.new_session,
        _owns_log_dir=started._owns_log_dir,
    )
    if wait:
        try:
            host.wait_ready(timeout)
        except BaseException:
            host.stop()
            raise
    return host
