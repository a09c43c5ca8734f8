"""The dev host against real Azurite: queue, poison, timer, HTTP, several workers, bad settings.

Each test starts ``python -m sas_local.devhost`` as a subprocess (sas_local.processes) on a copy
of tests/e2e/devhost_app/function_app.py with its own host.json, and watches the app's effects
from outside: the test functions record every invocation on a results queue.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from azure.storage.queue import QueueClient, TextBase64EncodePolicy

from sas_local.azurite import Azurite, free_port
from sas_local.processes import (
    DevHost,
    ProcessExitedError,
    group_members,
    pid_alive,
    start_devhost,
    wait_until,
)

# Past the 180 s a host has to be ready (Case.start) when the suite loads both cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

APP = Path(__file__).parent / "devhost_app" / "function_app.py"
ACCOUNT_KEY_MARKER = "AccountKey="


@pytest.fixture(scope="module")
def azurite() -> Iterator[Azurite]:
    with Azurite.start() as running:
        yield running


class Results:
    """Invocations the test app recorded on its results queue (drained as they arrive)."""

    def __init__(self, connection_string: str, queue: str) -> None:
        self.client = QueueClient.from_connection_string(connection_string, queue)
        self.client.create_queue()
        self.items: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        for message in self.client.receive_messages(max_messages=32, messages_per_page=32):
            self.items.append(json.loads(message.content))
            self.client.delete_message(message)
        return self.items

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [item for item in self.poll() if item["kind"] == kind]

    def wait(self, kind: str, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """At least ``count`` results of ``kind``; the timeout has a busy machine's margin."""

        def enough() -> list[dict[str, Any]] | None:
            found = self.of(kind)
            return found if len(found) >= count else None

        return wait_until(enough, timeout, interval=0.1, what=f"{count} {kind!r} results")


class Case:
    """Per-test names, settings and an app directory with its own host.json."""

    def __init__(self, azurite: Azurite, tmp_path: Path) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.connection_string = azurite.connection_string
        self.queue = f"in-{suffix}"
        self.fail_queue = f"fail-{suffix}"
        self.results = Results(self.connection_string, f"results-{suffix}")
        self.app_dir = tmp_path / "app"
        self.app_dir.mkdir()
        shutil.copy(APP, self.app_dir / "function_app.py")
        self.host_json()
        self.env: dict[str, str | None] = {
            "TEST_STORAGE": self.connection_string,
            "TEST_QUEUE": self.queue,
            "TEST_FAIL_QUEUE": self.fail_queue,
            "TEST_RESULTS_QUEUE": self.results.client.queue_name,
            "TEST_TIMER_SCHEDULE": "*/1 * * * * *",
            "SAS_INSTANCE_ID": None,
        }
        self.log_dir = tmp_path / "logs"

    @property
    def app(self) -> Path:
        return self.app_dir / "function_app.py"

    def host_json(self, queues: dict[str, Any] | None = None, route_prefix: str = "") -> None:
        document = {
            "version": "2.0",
            "extensions": {"queues": queues or {}, "http": {"routePrefix": route_prefix}},
        }
        (self.app_dir / "host.json").write_text(json.dumps(document))

    def queue_client(self, name: str, base64_encoded: bool = True) -> QueueClient:
        policy = TextBase64EncodePolicy() if base64_encoded else None
        return QueueClient.from_connection_string(
            self.connection_string, name, message_encode_policy=policy
        )

    def start(self, **kwargs: Any) -> DevHost:
        kwargs.setdefault("log_dir", self.log_dir)
        kwargs.setdefault("timeout", 180)  # ready in seconds; the margin is for a busy machine
        return start_devhost(self.app, env=self.env, **kwargs)


@pytest.fixture
def case(azurite: Azurite, tmp_path: Path) -> Case:
    return Case(azurite, tmp_path)


def queue_empty(client: QueueClient) -> bool:
    """No message left at all, visible or leased."""
    return client.get_queue_properties().approximate_message_count == 0


def poison_contents(case: Case, queue: str) -> list[str]:
    poison = case.queue_client(f"{queue}-poison", base64_encoded=False)
    try:
        return [message.content for message in poison.peek_messages(max_messages=32)]
    except Exception:  # the poison queue does not exist yet
        return []


def get(url: str, data: bytes | None = None) -> tuple[int, str, httpx.Headers]:
    """GET, or POST ``data``; (status, text, headers)."""
    method = "POST" if data is not None else "GET"
    response = httpx.request(method, url, content=data, timeout=10)
    return response.status_code, response.text, response.headers


@pytest.mark.parametrize("encoding", ["base64", "none"])
def test_queue_message_reaches_function_and_is_deleted(case: Case, encoding: str) -> None:
    case.host_json({"messageEncoding": encoding})
    body = f"hello é {uuid.uuid4()}"
    with case.start(functions=["record"], timers=False):
        source = case.queue_client(case.queue, base64_encoded=encoding == "base64")
        source.send_message(body)

        [result] = case.results.wait("record", 1)
        assert result["body"] == body
        assert result["dequeue_count"] == 1
        assert result["instance"].startswith("devhost-")
        wait_until(lambda: queue_empty(source), 5, what="source queue empty after success")
    assert poison_contents(case, case.queue) == []


def test_failing_function_is_retried_then_poisoned(case: Case) -> None:
    body = f"poison me {uuid.uuid4()}"
    with case.start(functions=["always_fail"], timers=False):
        source = case.queue_client(case.fail_queue)
        source.send_message(body)

        poisoned = wait_until(
            lambda: poison_contents(case, case.fail_queue), 15, what="message in poison queue"
        )
        assert [base64.b64decode(text).decode() for text in poisoned] == [body]
        assert queue_empty(source)
        attempts = case.results.wait("fail", 5)
        assert sorted(attempt["dequeue_count"] for attempt in attempts) == [1, 2, 3, 4, 5]
        assert all(attempt["body"] == body for attempt in attempts)
    assert len(case.results.of("fail")) == 5  # no sixth attempt after poisoning


def test_unprocessable_messages_go_to_poison_without_invocation(case: Case) -> None:
    """A non-Base64 body, and a message already dequeued maxDequeueCount times (its worker
    died each time), are parked in the poison queue without calling the function."""
    worn = f"dequeued too often {uuid.uuid4()}"
    source = case.queue_client(case.queue)
    source.create_queue()
    source.send_message(worn)
    for _ in range(5):
        [leased] = source.receive_messages(max_messages=1, visibility_timeout=30)
        source.update_message(leased.id, leased.pop_receipt, visibility_timeout=0)
    raw = "this is not base64!"
    case.queue_client(case.queue, base64_encoded=False).send_message(raw)

    with case.start(functions=["record"], timers=False) as host:

        def both_poisoned() -> list[str] | None:
            found = poison_contents(case, case.queue)
            return found if len(found) >= 2 else None

        poisoned = wait_until(both_poisoned, 15, what="two messages in the poison queue")
        assert sorted(poisoned) == sorted([raw, base64.b64encode(worn.encode()).decode()])
        assert queue_empty(source)

        source.send_message("valid")  # the function itself works
        [result] = case.results.wait("record", 1)
        assert result["body"] == "valid"
        log = host.stderr()
        assert "reason=invalid_base64" in log
        assert "reason=dequeue_count" in log
        assert raw not in log  # bodies are never logged
        assert worn not in log


def test_timer_fires_on_ncrontab_schedule(case: Case) -> None:
    with case.start(functions=["tick"]):
        ticks = case.results.wait("tick", 3, timeout=30)
    times = sorted(tick["at"] for tick in ticks)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(0.5 < gap < 1.8 for gap in gaps), gaps
    assert all(tick["past_due"] is False for tick in ticks)


def test_no_timers_flag_leaves_timers_out(case: Case) -> None:
    with case.start(functions=["tick", "record"], timers=False) as host:
        assert host.functions == ["record"]
        assert "timers=0" in host.stderr()


@pytest.mark.parametrize("prefix", ["", "api"])
def test_http_health_asgi_and_plain_routes(case: Case, prefix: str) -> None:
    case.host_json(route_prefix=prefix)
    base = "/" + prefix if prefix else ""
    port = free_port()
    with case.start(functions=["http_app_func", "plain"], http_port=port) as host:
        assert host.http_url == f"http://127.0.0.1:{port}"
        status, text, _ = get(f"{host.http_url}/_devhost/health")
        assert status == 200
        assert json.loads(text)["functions"] == ["http_app_func", "plain"]

        status, text, headers = get(f"{host.http_url}{base}/plain/42?x=1", data=b"ping")
        assert status == 201
        assert headers["content-type"].startswith("application/json")
        assert json.loads(text) == {
            "method": "POST",
            "route_params": {"id": "42"},
            "params": {"x": "1"},
            "body": "ping",
            "function": "plain",
        }
        if prefix:  # FastAPI sees the full path, prefix included, as behind the real host
            status, _, _ = get(f"{host.http_url}/plain/42")
            assert status == 404
            return
        status, text, _ = get(f"{host.http_url}/hello/world")
        assert status == 200
        assert json.loads(text)["hello"] == "world"
        status, text, _ = get(f"{host.http_url}/echo?a=b", data=b"payload")
        assert (status, json.loads(text)) == (
            200,
            {"echo": "payload", "path": "/echo", "query": "a=b"},
        )
        status, _, _ = get(f"{host.http_url}/plain/not-an-int")  # int constraint: to FastAPI
        assert status == 404


@pytest.mark.timeout(480)  # each wait below has a busy machine's margin
def test_two_workers_share_work_crashed_worker_is_replaced(case: Case) -> None:
    case.host_json({"batchSize": 1, "newBatchThreshold": 0, "maxPollingInterval": "00:00:00.2"})
    case.env["TEST_RECORD_SLEEP"] = "0.05"
    host = case.start(functions=["record"], timers=False, workers=2)
    try:
        workers = host.worker_pids()
        assert len(workers) == 2
        source = case.queue_client(case.queue)
        for number in range(30):
            source.send_message(f"first-{number}")
        first = case.results.wait("record", 30)
        assert {item["pid"] for item in first} == set(workers)
        assert {item["instance"] for item in first} == {
            f"devhost-{os.uname().nodename}-{pid}" for pid in workers
        }

        victim, survivor = workers
        os.kill(victim, signal.SIGKILL)
        # The replacement imports the app again: as slow as a start on a loaded machine.
        host.wait_for_line(
            r"sas\.devhost\.worker_ready worker=\d pid=\d+ restarts=1", 180, "stderr"
        )
        replacement = wait_until(
            lambda: [pid for pid in host.worker_pids() if pid not in workers], 5, what="new worker"
        )
        assert not pid_alive(victim)
        assert sorted(host.worker_pids()) == sorted([survivor, *replacement])

        for number in range(30):
            source.send_message(f"second-{number}")

        def second_batch() -> list[dict[str, Any]] | None:
            done = [i for i in case.results.of("record") if i["body"].startswith("second-")]
            return done if len(done) >= 30 else None

        second = wait_until(second_batch, 60, what="second batch processed")
        assert {item["body"] for item in second} == {f"second-{n}" for n in range(30)}
        assert replacement[0] in {item["pid"] for item in second}

        everyone = host.worker_pids()
        host.send_signal(signal.SIGTERM)  # the parent only: it must stop its workers
        assert host.wait(60) == 0
        assert not any(pid_alive(pid) for pid in everyone)
        assert group_members(host.pid) == []
        assert "sas.devhost.worker_stopped worker=0" in host.stderr()
        assert "sas.devhost.worker_stopped worker=1" in host.stderr()
    finally:
        host.stop()


@pytest.mark.parametrize(
    ("unset", "extra", "expected"),
    [
        ("TEST_QUEUE", {}, "'TEST_QUEUE' is not set"),
        ("TEST_STORAGE", {}, "connection setting 'TEST_STORAGE'"),
        (None, {"TEST_SERVICEBUS": "1", "TEST_BUS": "x"}, "set SAS_TRANSPORT=storage"),
    ],
    ids=["missing-percent-setting", "missing-connection", "service-bus-trigger"],
)
def test_bad_configuration_fails_fast_naming_the_key(
    case: Case, unset: str | None, extra: dict[str, str], expected: str
) -> None:
    if unset is not None:
        case.env[unset] = None
    case.env.update(extra)
    host = case.start(functions=["record"] if unset else None, wait=False)
    try:
        assert host.wait(180) == 2  # it exits at start; the margin is for a busy machine
        assert expected in host.stderr()
        assert "sas.devhost ready" not in host.stdout()
        assert ACCOUNT_KEY_MARKER not in host.stdout() + host.stderr()
        assert group_members(host.pid) == []
    finally:
        host.stop()


def test_local_settings_json_is_read_and_environment_wins(case: Case) -> None:
    values = {
        "TEST_QUEUE": "ignored-because-env-wins",
        "TEST_RESULTS_QUEUE": case.results.client.queue_name,
    }
    (case.app_dir / "local.settings.json").write_text(json.dumps({"Values": values}))
    case.env["TEST_RESULTS_QUEUE"] = None  # only the file has it; the function reads it
    with case.start(functions=["record"], timers=False) as host:
        assert f"record<-{case.queue}" in host.stderr()
        case.queue_client(case.queue).send_message("via settings file")
        [result] = case.results.wait("record", 1)
        assert result["body"] == "via settings file"


def test_processes_helper_reports_early_exit(case: Case) -> None:
    case.env["TEST_QUEUE"] = None
    with pytest.raises(ProcessExitedError, match="TEST_QUEUE"):
        case.start(functions=["record"])  # exits early; the default wait is for a busy machine


def test_an_agent_given_no_service_stops_the_dev_host_naming_the_setting(tmp_path: Path) -> None:
    """The app's own function_app.py: an HTTP agent's function checks its settings first."""
    from sas import settings
    from sas.declared import registry
    from sas_local.processes import REPO_ROOT

    agent = registry().http_agents[0]
    missing = settings.remote_url_setting(agent)
    values = {
        settings.TRANSPORT: "storage",
        settings.STORAGE_CONNECTION: "UseDevelopmentStorage=true",
        **{settings.remote_url_setting(a): "http://127.0.0.1:9" for a in registry().http_agents},
        **registry().settings,
    }
    del values[missing]
    local = tmp_path / "local.settings.json"
    local.write_text(json.dumps({"Values": values}))
    host = start_devhost(
        REPO_ROOT / "function_app.py",
        env={missing: None, settings.remote_endpoints_setting(agent): None},
        functions=[f"agent_{agent}"],
        http_port=0,
        timers=False,
        settings=local,
        log_dir=tmp_path / "host",
        wait=False,
    )
    try:
        assert host.wait(120) == 2  # nothing started: no Azurite is needed to find out
        assert f"function 'agent_{agent}' cannot run: missing setting {missing}: " in (
            host.stderr()
        )
        assert "sas.devhost ready" not in host.stdout()
    finally:
        host.stop()
