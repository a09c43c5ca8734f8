"""The dev host's shared queue watcher: a message put in this process wakes this process's poller.

The Functions host keeps a "shared queue watcher": when a function's queue output binding adds
a message, the listener of that queue in the same host polls at once instead of waiting out
its back-off (up to ``maxPollingInterval``). sas sends with SDK clients, not output bindings,
and the dev host supports trigger bindings only, so the dev host watches what the real host
cannot: every Put Message that succeeds on the app's HTTP session in this worker process
(``sas.adapters.clients.http_session``, observed through a requests response hook, which the
app does not know about). A message sent with a delay (a visibility timeout) wakes nothing.

A wake-up is one process's: a message sent by another worker, or from outside the dev host
(a submitter, the demo), is found by polling, as in Azure.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import requests

log = logging.getLogger(__name__)


class Wakeable(Protocol):
    def wake(self) -> None: ...


def queue_put(response: requests.Response) -> str | None:
    """The queue a successful Put Message (no delay) added to; None for any other response.

    ``POST {account}/{queue}/messages`` answered 201: the account is the host (Azure) or the
    first path segment (Azurite, path-style)."""
    request = response.request
    if request.method != "POST" or response.status_code != 201 or request.url is None:
        return None
    url = urlsplit(str(request.url))
    segments = url.path.rstrip("/").split("/")
    if len(segments) < 3 or segments[-1] != "messages" or not segments[-2]:
        return None
    delay = parse_qs(url.query).get("visibilitytimeout", ["0"])[0]
    if delay not in ("", "0"):
        return None
    return segments[-2]


class SharedQueueWatcher:
    """Wakes the registered pollers of a queue when this process puts a message on it.

    Queues are matched by name only: a put to a queue of the same name in another storage
    account costs one early poll, nothing more."""

    def __init__(self) -> None:
        self._pollers: dict[str, list[Wakeable]] = {}
        self._lock = threading.Lock()
        self._sessions: list[requests.Session] = []

    def register(self, queue_name: str, poller: Wakeable) -> None:
        with self._lock:
            self._pollers.setdefault(queue_name, []).append(poller)

    def notify(self, queue_name: str) -> None:
        for poller in self._pollers.get(queue_name, ()):
            poller.wake()

    def on_response(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        """A requests ``response`` hook; it must never fail the app's request."""
        try:
            queue = queue_put(response)
            if queue is not None:
                self.notify(queue)
        except Exception:  # observing must never break the send it observes
            log.debug("sas.devhost.watch_failed", exc_info=True)

    def watch(self, sessions: Iterable[requests.Session]) -> None:
        for session in sessions:
            session.hooks["response"].append(self.on_response)
            self._sessions.append(session)

    def close(self) -> None:
        """Stop watching (the sessions outlive the watcher)."""
        for session in self._sessions:
            hooks = session.hooks["response"]
            if self.on_response in hooks:
                hooks.remove(self.on_response)
        self._sessions.clear()
