"""`make run`'s process (sas_local/demo.py) serving the app with a service of the user's own:
an exported SAS_REMOTE_<AGENT>_URL is the one its agent calls, the simulator plays only the
other services (and answers another with a 404 naming it), and SIGTERM stops every process
the run started."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from sas import settings
from sas.adapters.clients import queue_service_client
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.model import ProcessState
from sas.domain.wire import submission_message_id
from sas_local.demo import demo_order
from sas_local.ledger import fetch_ledger
from sas_local.processes import REPO_ROOT, descendants, pid_alive, start_process, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

OWN = "shipping"
"""The example's agent the test serves itself."""


@contextmanager
def own_service() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A provider of the user's own on a free port: every call recorded, each answered 200."""
    calls: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("Idempotency-Key")
            calls.append({"path": self.path, "key": key, "body": json.loads(body)})
            answer = json.dumps({"tracking": f"own-{key}"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", calls
    finally:
        server.shutdown()
        server.server_close()


def test_your_own_service_is_called_and_sigterm_stops_everything(tmp_path: Path) -> None:
    logs = tmp_path / "run"
    no_file = tmp_path / "local.settings.json"  # none of a developer's settings
    no_file.write_text(json.dumps({"Values": {}}))
    serve = ["--serve", "--workers", "1", "--layout", "shared", "--settings", str(no_file)]
    with own_service() as (url, calls):
        demo = start_process(
            [sys.executable, "-m", "sas_local.demo", *serve, "--logs", str(logs)],
            env={settings.remote_url_setting(OWN): f"{url}/{OWN}"},
            log_dir=tmp_path / "demo",
        )
        try:
            demo.wait_for_line(r"^ready: ", timeout=240)
            started = descendants(demo.pid)
            values = json.loads((logs / "local.settings.json").read_text())["Values"]
            run = settings.load(values)
            simulator = values[settings.remote_url_setting("payment")].rsplit("/", 1)[0]
            order = demo_order(1, "own")
            StorageQueueTransport(queue_service_client(run.storage)).send(
                run.lane(settings.QUEUE_ORDERS),
                order,
                message_id=submission_message_id(order.order_id),
                correlation_id=order.order_id,
            )
            store = TableStateStore.connect(run.storage, run.table_name)

            def finished() -> ProcessState | None:
                found = store.get_state(order.order_id)
                return found.value.process_state if found and found.value.is_terminal else None

            assert wait_until(finished, 120, what="the order") is ProcessState.PROCESSED
            assert {call["path"] for call in calls} == {f"/{OWN}/ship"}
            assert {call["body"]["order_id"] for call in calls} == {order.order_id}
            effects = fetch_ledger(simulator)["effects"]
            assert isinstance(effects, list)
            assert {e["service"] for e in effects} == {"inventory", "payment"}
            health = httpx.get(f"{simulator}/health", timeout=10).json()
            assert health["services"] == ["inventory", "payment"]
            misrouted = httpx.post(
                f"{simulator}/{OWN}/ship", json={}, headers={"Idempotency-Key": "k"}, timeout=10
            )
            assert misrouted.status_code == 404 and repr(OWN) in misrouted.json()["detail"]
            assert len(started) >= 4  # Azurite, the simulator, the dev host and its worker

            demo.send_signal(signal.SIGTERM)
            assert demo.wait(120) == 0
            assert [pid for pid in started if pid_alive(pid)] == []
            assert f"{OWN} calls {url}/{OWN}" in " ".join(demo.stdout().split())
        finally:
            demo.stop()


def test_sigterm_to_make_run_stops_everything_it_started(tmp_path: Path) -> None:
    """What a user signals is `make run`, which exits without passing SIGTERM on: the demo
    follows its parent, and stops the stack as for its own SIGTERM."""
    no_file = tmp_path / "local.settings.json"
    no_file.write_text(json.dumps({"Values": {}}))
    serve = f"--serve --workers 1 --layout shared --settings {no_file} --logs {tmp_path / 'run'}"
    make = start_process(
        ["make", "--no-print-directory", "run", f"DEMO_ARGS={serve}"],
        cwd=REPO_ROOT,
        log_dir=tmp_path / "make",
    )
    try:
        make.wait_for_line(r"^ready: ", timeout=240)
        started = descendants(make.pid)
        assert len(started) >= 5  # the demo, Azurite, the simulator, the dev host, its worker
        os.kill(make.pid, signal.SIGTERM)  # make alone, not its process group
        wait_until(
            lambda: not [pid for pid in started if pid_alive(pid)],
            timeout=120,
            what="every process the run started to stop",
        )
    finally:
        make.stop()
