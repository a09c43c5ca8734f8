"""The dev host's shared queue watcher against Azurite: a message the app puts on a queue in the
worker's own process ends that queue's poller's back-off at once (the Functions host does the
same for its output bindings); a delayed message does not."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
import requests

from sas.adapters import clients
from sas.adapters.storage_queues import StorageQueueTransport
from sas.domain.messages import ScheduleRequest
from sas.settings import Connection
from sas_local.azurite import Azurite
from sas_local.devhost import config as devhost_config
from sas_local.devhost import queues as devhost_queues
from sas_local.devhost.config import QueueOptions
from sas_local.devhost.loader import QueueFunction
from sas_local.devhost.queues import QueuePoller
from sas_local.devhost.watcher import SharedQueueWatcher
from tests.conftest import unique_queue

pytestmark = pytest.mark.integration

BACKOFF = 120.0
"""Every wait of the poller between empty polls, in these tests: far longer than any test runs,
so a message picked up before it can only have been picked up through a wake-up."""


class Polls:
    """Counts the dev host's receives from one queue (a hook on the dev host's own session)."""

    def __init__(self, queue: str) -> None:
        self._suffix = f"/{queue}/messages"
        self.count = 0

    def __call__(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        url = str(response.request.url).split("?")[0]
        if response.request.method == "GET" and url.endswith(self._suffix):
            self.count += 1


def wait_for(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class Watched:
    def __init__(self, azurite: Azurite) -> None:
        self.queue = unique_queue("wake")
        self.invoked = threading.Event()
        self.polls = Polls(self.queue)
        conn = azurite.connection_string

        def record(msg: func.QueueMessage) -> None:
            self.invoked.set()

        function = QueueFunction("record", "msg", record, self.queue, "SasStorage", conn)
        self.poller = QueuePoller(function, QueueOptions(max_polling_interval=BACKOFF), Path())
        self.poller.prepare()
        self.watcher = SharedQueueWatcher()
        self.watcher.register(self.queue, self.poller)
        self.watcher.watch([clients.http_session()])
        self.sender = StorageQueueTransport(
            clients.queue_service_client(Connection(setting="SasStorage", connection_string=conn))
        )

    def send(self, delay_seconds: float = 0) -> None:
        self.sender.send(
            self.queue,
            ScheduleRequest(order_id="o1"),
            message_id="o1:schedule",
            correlation_id="o1",
            delay_seconds=delay_seconds,
        )


@pytest.fixture
def watched(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Iterator[Watched]:
    monkeypatch.setattr(devhost_config, "MIN_POLLING_INTERVAL", BACKOFF)  # no short waits
    setup = Watched(azurite)
    hooks = devhost_queues.shared_transport().session.hooks["response"]
    hooks.append(setup.polls)
    setup.poller.start()
    wait_for(lambda: setup.polls.count >= 1)  # the first poll found nothing: now it waits
    yield setup
    hooks.remove(setup.polls)
    setup.watcher.close()
    setup.poller.stop()
    setup.poller.wait_idle(time.monotonic() + 10)


def test_a_message_put_in_this_process_is_picked_up_without_waiting_out_the_backoff(watched):
    watched.send()

    # Without the wake-up the next poll would come BACKOFF after the first one.
    assert watched.invoked.wait(BACKOFF / 4)


def test_a_delayed_message_wakes_nothing(watched):
    watched.send(delay_seconds=60)
    time.sleep(2)  # a wake-up would poll within milliseconds (a slow machine only hides it)

    assert watched.polls.count == 1
    assert not watched.invoked.is_set()
