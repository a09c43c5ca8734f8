"""The Supervisor's sweep hooks: housekeeping around a sweep never stops a sweep, a later
hook, or the hooks after a sweep that failed."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sas.domain.transitions import RetryPolicy
from sas.services.submission import Submission
from sas.services.supervisor import Supervisor
from tests.fakes import FakeClock, InMemoryStore, RecordingTransport
from tests.unit.test_services import ROUTES, submitted

pytestmark = pytest.mark.unit


def broken() -> None:
    raise RuntimeError("housekeeping failed")


def supervisor(
    store: InMemoryStore, transport: RecordingTransport, clock: FakeClock, **hooks: Any
) -> Supervisor:
    return Supervisor(store, transport, ROUTES, clock, "sup", RetryPolicy(max_failures=3), **hooks)


def test_a_hook_that_raises_stops_neither_the_sweep_nor_the_other_hooks(caplog):
    store, transport, clock = InMemoryStore(), RecordingTransport(), FakeClock()
    Submission(store, transport, ROUTES, clock).submit(submitted())
    clock.advance(120)  # the first step's deadline has passed
    calls: list[str] = []

    def before() -> None:
        calls.append(f"before, {len(transport.sent)} sent")

    def after() -> None:
        calls.append(f"after, {len(transport.sent)} sent")

    hooked = supervisor(
        store, transport, clock, before_sweep=(broken, before), after_sweep=(broken, after)
    )
    sent = len(transport.sent)
    with caplog.at_level(logging.WARNING, logger="sas.services.supervisor"):
        assert hooked.sweep() == {"retry": 1}
    assert calls == [f"before, {sent} sent", f"after, {len(transport.sent)} sent"]
    assert len(transport.sent) > sent  # the retry went between the two
    failed = [r for r in caplog.records if r.getMessage() == "sas.sweep_hook_failed"]
    assert [r.hook for r in failed] == ["broken", "broken"]


def test_the_hooks_after_a_sweep_run_even_when_the_sweep_fails():
    store, transport, clock = InMemoryStore(), RecordingTransport(), FakeClock()
    calls: list[str] = []

    def unreachable(now: object) -> list[object]:
        raise ConnectionError("storage is down")

    store.list_due = unreachable  # type: ignore[method-assign,assignment]
    hooked = supervisor(store, transport, clock, after_sweep=(lambda: calls.append("after"),))
    with pytest.raises(ConnectionError):
        hooked.sweep()
    assert calls == ["after"]
