"""Parked messages, one concept: the app's (a table row) and the host's (a poison or dead-letter
queue) are one value, listed together oldest first, and replayed or discarded by an id that
names the store holding them. ParkedMessages against recording fakes; the same against Azurite:
tests/integration/test_operator.py, tests/integration/test_poison.py."""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from sas.domain.errors import ConfigurationError, IllegalTransition, NotFound
from sas.domain.messages import MAX_MESSAGE_BYTES
from sas.domain.parked import (
    ParkedMessage,
    consumed_queues,
    oldest_first,
    parked_by,
    poison_id,
    poison_queue,
    rejected_row_key,
)
from sas.services.parked_messages import ParkedMessages
from sas.testing import FakeClock, InMemoryQueues, InMemoryStore, instance
from tests.unit.test_services import ROUTES
from tests.workflows import REGISTRY

pytestmark = [pytest.mark.unit, pytest.mark.fast]

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def host(queue: str, key: str, at: datetime | None) -> ParkedMessage:
    return ParkedMessage(
        id=poison_id(queue, key),
        parked_by="host",
        queue=queue,
        function="submit",
        reason="moved to poison",
        body=b"{}",
        body_truncated=False,
        parked_at=at,
        transport="storage",
    )


@dataclass
class FakePoison:
    """A PoisonStore that records what it is asked."""

    messages: list[ParkedMessage] = field(default_factory=list)
    replayed: list[str] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)
    requeued: list[tuple[str, bytes, str]] = field(default_factory=list)
    requeue_fails: bool = False

    def list(self, limit: int = 100) -> builtins.list[ParkedMessage]:
        return oldest_first(self.messages)[:limit]

    def _take(self, poison_id: str, taken: builtins.list[str]) -> bool:
        taken.append(poison_id)
        found = [m for m in self.messages if m.id == poison_id]
        self.messages = [m for m in self.messages if m.id != poison_id]
        return bool(found)

    def replay(self, poison_id: str) -> bool:
        return self._take(poison_id, self.replayed)

    def discard(self, poison_id: str) -> bool:
        return self._take(poison_id, self.discarded)

    def requeue(self, queue: str, body: bytes, *, message_id: str) -> None:
        if self.requeue_fails:
            raise NotFound(f"queue {queue} does not exist")
        self.requeued.append((queue, body, message_id))


@dataclass
class Parts:
    store: InMemoryStore
    poison: FakePoison
    clock: FakeClock
    parked: ParkedMessages

    def park(self, queue: str = "orders", body: bytes = b"{}", ago: float = 0) -> str:
        at = self.clock.now() - timedelta(seconds=ago)
        return self.store.park_message(queue, "invalid", body, at)


@pytest.fixture
def parts() -> Parts:
    store, clock, poison = InMemoryStore(), FakeClock(NOW), FakePoison()
    ctx = instance(store, InMemoryQueues(clock), ROUTES, clock, REGISTRY).ctx
    return Parts(store, poison, clock, ParkedMessages(ctx, poison=poison))


def test_both_kinds_are_one_list_oldest_first_at_most_limit_in_all(parts: Parts) -> None:
    first_app = parts.park("orders", ago=300)
    second_app = parts.park("agent-payment", ago=100)
    third_app = parts.park("somewhere-else", ago=0)
    unknown_time = host("orders", "k0", None)
    first_host = host("replies", "k1", NOW - timedelta(seconds=200))
    parts.poison.messages = [first_host, unknown_time]

    listed = parts.parked.list(100)

    assert [(m.id, m.parked_by) for m in listed] == [
        (unknown_time.id, "host"),  # since when, nobody knows: shown as the oldest
        (first_app, "app"),
        (first_host.id, "host"),
        (second_app, "app"),
        (third_app, "app"),
    ]
    assert [m.id for m in parts.parked.list(3)] == [unknown_time.id, first_app, first_host.id]
    assert [m.id for m in parts.parked.list(1)] == [unknown_time.id]
    # The app's get the function their queue triggers, when it is one the app consumes.
    consumed = consumed_queues(
        orders=ROUTES.orders,
        scheduler=ROUTES.scheduler,
        replies=ROUTES.replies,
        agents=ROUTES.agents,
        lanes=ROUTES.lanes,
    )
    assert [m.function for m in listed if m.parked_by == "app"] == [
        consumed["orders"],
        consumed["agent-payment"],
        None,
    ]
    assert consumed["agent-payment"].startswith("agent_payment")


def test_the_age_is_by_the_operators_clock_never_negative_or_unknown(parts: Parts) -> None:
    parts.park(ago=3600)
    (old,) = parts.store.list_parked()
    assert parts.parked.age_seconds(old) == 3600
    ahead = replace(old, parked_at=NOW + timedelta(minutes=5))
    assert parts.parked.age_seconds(ahead) == 0
    assert parts.parked.age_seconds(host("orders", "k", None)) is None
    assert ahead.age(NOW) == timedelta(0) and old.age(NOW) == timedelta(hours=1)


def test_the_id_names_the_store_and_only_that_store_is_asked(parts: Parts) -> None:
    replayed_app, discarded_app = parts.park(body=b'{"a": 1}'), parts.park()
    replayed_host, discarded_host = host("orders", "k1", NOW), host("replies", "k2", NOW)
    parts.poison.messages = [replayed_host, discarded_host]

    parts.parked.replay(replayed_app, actor="alice")
    parts.parked.discard(discarded_app, actor="alice")
    parts.parked.replay(replayed_host.id, actor="alice")
    parts.parked.discard(discarded_host.id, actor="alice")

    # Parked by the app: its body sent to its queue under its id, then the row dropped.
    assert parts.poison.requeued == [("orders", b'{"a": 1}', replayed_app)]
    assert parts.store.list_parked() == []
    # Parked by the host: the poison store's own replay and discard.
    assert (parts.poison.replayed, parts.poison.discarded) == (
        [replayed_host.id],
        [discarded_host.id],
    )
    for gone in (replayed_app, discarded_app, replayed_host.id, discarded_host.id):
        for act in (parts.parked.replay, parts.parked.discard):
            with pytest.raises(NotFound, match="no such parked message"):
                act(gone, actor="alice")


@pytest.mark.parametrize(
    "unknown",
    [
        "",
        "nope",
        "p1.",
        "p1.!!",
        rejected_row_key(NOW, "0123456789ab") + "x",
        rejected_row_key(NOW, "0123456789ab").upper(),
        poison_id("orders", "k1") + "=",
        "p2." + poison_id("orders", "k1")[3:],
    ],
)
def test_an_id_of_neither_kind_is_not_found_and_reaches_no_store(
    parts: Parts, unknown: str
) -> None:
    asked: list[str] = []

    def get_parked(parked_id: str) -> ParkedMessage | None:
        asked.append(parked_id)
        return None

    def drop_parked(parked_id: str) -> bool:
        asked.append(parked_id)
        return False

    parts.store.get_parked = get_parked  # type: ignore[method-assign]
    parts.store.drop_parked = drop_parked  # type: ignore[method-assign]
    assert parked_by(unknown) is None
    for act in (parts.parked.replay, parts.parked.discard):
        with pytest.raises(NotFound, match="no such parked message"):
            act(unknown, actor="alice")
    assert asked == [] and parts.poison.replayed == [] and parts.poison.discarded == []


def test_parked_by_tells_the_two_spellings_apart() -> None:
    assert parked_by(rejected_row_key(NOW, "0123456789ab")) == "app"
    assert parked_by(poison_id("sas-orders", "00000000-0000-0000-0000-000000000000")) == "host"
    assert parked_by(poison_id("sas-orders", "42")) == "host"
    assert poison_queue(poison_id("sas-orders", "42")) == "sas-orders"
    assert poison_queue(rejected_row_key(NOW, "0123456789ab")) is None


def test_the_apps_rules_for_a_replay_hold_and_nothing_is_sent(parts: Parts) -> None:
    truncated = parts.park()
    parts.store.parked[truncated] = replace(parts.store.parked[truncated], body_truncated=True)
    oversize = parts.park(body=b" " * (MAX_MESSAGE_BYTES + 1))
    not_consumed = parts.park(queue="alerts")
    for parked_id, said in (
        (truncated, "only the start of the body"),
        (oversize, "over"),
        (not_consumed, "not a queue the app consumes"),
    ):
        with pytest.raises(IllegalTransition, match=said):
            parts.parked.replay(parked_id, actor="alice")
    assert parts.poison.requeued == []
    assert {m.id for m in parts.store.list_parked()} == {truncated, oversize, not_consumed}


def test_a_failed_send_leaves_the_apps_message_parked(parts: Parts) -> None:
    parked_id = parts.park()
    parts.poison.requeue_fails = True
    with pytest.raises(NotFound, match="does not exist"):
        parts.parked.replay(parked_id, actor="alice")
    assert [m.id for m in parts.store.list_parked()] == [parked_id]  # sent first, dropped after


def test_without_a_poison_store_it_says_so(parts: Parts) -> None:
    parts.park()
    transport = InMemoryQueues(parts.clock)
    bare = ParkedMessages(instance(parts.store, transport, ROUTES, parts.clock, REGISTRY).ctx)
    with pytest.raises(ConfigurationError, match="no poison store"):
        bare.list()
