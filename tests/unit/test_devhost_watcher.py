"""Which responses the dev host's shared queue watcher takes for a message put on a queue."""

from __future__ import annotations

import pytest
import requests

from sas_local.devhost.watcher import SharedQueueWatcher, queue_put

pytestmark = pytest.mark.unit


def response(method: str, url: str, status: int) -> requests.Response:
    answer = requests.Response()
    answer.status_code = status
    answer.request = requests.Request(method, url).prepare()
    return answer


@pytest.mark.parametrize(
    ("method", "url", "status", "queue"),
    [
        ("POST", "https://acct.queue.core.windows.net/sas-orders/messages", 201, "sas-orders"),
        (
            "POST",
            "http://127.0.0.1:10001/devstoreaccount1/sas-replies/messages",
            201,
            "sas-replies",
        ),
        ("POST", "https://acct.queue.core.windows.net/q/messages?visibilitytimeout=0", 201, "q"),
        ("POST", "https://acct.queue.core.windows.net/q/messages?visibilitytimeout=5", 201, None),
        ("POST", "https://acct.queue.core.windows.net/q/messages", 404, None),
        ("GET", "https://acct.queue.core.windows.net/q/messages?numofmessages=16", 200, None),
        ("DELETE", "https://acct.queue.core.windows.net/q/messages/id?popreceipt=x", 204, None),
        ("POST", "https://acct.table.core.windows.net/sasorders", 201, None),
        ("POST", "https://acct.queue.core.windows.net/messages", 201, None),
    ],
)
def test_only_a_successful_put_without_delay_names_its_queue(method, url, status, queue):
    assert queue_put(response(method, url, status)) == queue


class Poller:
    def __init__(self) -> None:
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1


def test_a_put_wakes_the_pollers_of_that_queue_only():
    watcher = SharedQueueWatcher()
    orders, replies = Poller(), Poller()
    watcher.register("sas-orders", orders)
    watcher.register("sas-replies", replies)

    watcher.on_response(response("POST", "http://h/devstoreaccount1/sas-orders/messages", 201))

    assert (orders.woken, replies.woken) == (1, 0)


def test_a_broken_response_never_fails_the_request_it_observes():
    watcher = SharedQueueWatcher()
    watcher.on_response(requests.Response())  # no request attached at all


def test_watch_and_close_add_and_remove_the_hook():
    session = requests.Session()
    watcher = SharedQueueWatcher()
    watcher.watch([session])
    assert watcher.on_response in session.hooks["response"]
    watcher.close()
    assert session.hooks["response"] == []
