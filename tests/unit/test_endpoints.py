"""Choosing an endpoint, deferral backoff, the Router's counts, and the endpoint settings."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from pydantic import ValidationError

from sas import settings
from sas.domain.endpoints import (
    DeferralPolicy,
    Endpoint,
    choose_endpoint,
    single_endpoint,
)
from sas.domain.errors import ConfigurationError
from sas.domain.messages import StepReply
from sas.services.routing import Router
from sas.testing import FakeClock, InMemoryLoads

pytestmark = [pytest.mark.unit, pytest.mark.fast]

A = Endpoint("payment", "west", "http://a.invalid", capacity=2)
B = Endpoint("payment", "north", "http://b.invalid", capacity=4)
UNLIMITED = Endpoint("payment", "south", "http://c.invalid")


def pick(endpoints, loads=None, down=(), avoid=None):
    loads = loads or {}
    return choose_endpoint(
        endpoints,
        healthy=lambda e: e.name not in down,
        in_flight=lambda e: loads.get(e.name, 0),
        avoid=avoid,
    )


def test_the_endpoint_a_try_failed_on_is_avoided_while_another_has_room():
    assert pick([A, B], avoid="west") is B
    assert pick([A, B], loads={"north": 4}, avoid="west") is A  # north is full: west again


def test_the_least_loaded_share_wins():
    assert pick([A, B], loads={"west": 1, "north": 1}) is B  # 1/2 against 1/4
    assert pick([A, B]) is A  # a tie: declaration order
    assert pick([A, UNLIMITED], loads={"west": 0, "south": 50}) is A


def test_no_endpoint_with_room_means_defer():
    assert pick([A, B], loads={"west": 2, "north": 4}) is None
    assert pick([A], loads={"west": 2}) is None


def test_an_unhealthy_endpoint_is_used_only_when_every_endpoint_is_unhealthy():
    assert pick([A, B], down={"west"}) is B
    assert pick([A, B], down={"west", "north"}) is A  # all unhealthy: their breakers decide
    assert pick([A], down={"west"}) is A  # one endpoint: its breaker decides, as before


def test_deferral_backoff_doubles_up_to_its_cap():
    policy = DeferralPolicy(base=timedelta(seconds=1), cap=timedelta(seconds=10))
    assert [policy.delay(n).total_seconds() for n in (1, 2, 3, 4, 5, 50)] == [
        1,
        2,
        4,
        8,
        10,
        10,
    ]


def test_a_deferral_waits_at_least_until_the_circuit_may_close_and_is_bounded():
    policy = DeferralPolicy(base=timedelta(seconds=1), cap=timedelta(seconds=10), most=3)
    assert policy.delay(1, at_least=7.5) == timedelta(seconds=7.5)
    assert policy.delay(5, at_least=3) == timedelta(seconds=10)  # the backoff, when longer
    assert [policy.allows(n) for n in (0, 2, 3, 4)] == [True, True, False, False]


def test_a_deferred_reply_asks_for_a_bounded_wait():
    def deferred(retry_after: float) -> StepReply:
        return StepReply(
            order_id="o1",
            step="charge",
            step_index=1,
            attempt=1,
            outcome="deferred",
            retry_after=retry_after,
        )

    assert deferred(60).retry_after == 60
    for wrong in (-1, 60.5):
        with pytest.raises(ValidationError):
            deferred(wrong)


def router(clock: FakeClock, loads: InMemoryLoads, endpoints=(A, B)) -> Router:
    return Router({"payment": endpoints}, clock, "me", healthy=lambda e: True, loads=loads)


def test_the_router_counts_its_own_calls_and_adds_the_others_fresh_counts():
    clock, loads = FakeClock(), InMemoryLoads()
    loads.publish("other", {B.target: 3}, clock.now())
    loads.publish("old", {A.target: 9}, clock.now() - timedelta(seconds=30))  # stale
    loads.publish("me", {A.target: 7}, clock.now())  # this process: counted locally
    loads.published.clear()
    r = router(clock, loads)
    first = r.acquire("payment")
    assert first is A  # 0 of 2 against 3 of 4
    assert r.in_flight(A) == 1 and r.in_flight(B) == 3
    assert r.acquire("payment") is A  # 1 of 2 against 3 of 4
    assert r.acquire("payment") is B  # west is full
    assert r.acquire("payment") is None  # so is north: defer
    r.release(first)
    r.release(first)
    assert r.in_flight(A) == 0


def test_the_router_reads_and_publishes_at_most_once_per_refresh():
    clock, loads = FakeClock(), InMemoryLoads()
    r = router(clock, loads)
    for _ in range(5):
        endpoint = r.acquire("payment")
        assert endpoint is not None
        r.release(endpoint)
    assert loads.reads == 1 and len(loads.published) == 1
    clock.advance(1.5)
    endpoint = r.acquire("payment")
    assert endpoint is not None
    assert loads.reads == 2 and len(loads.published) == 2
    assert loads.published[-1] == {A.target: 1}


def test_endpoints_without_capacity_cost_no_reads_or_writes():
    clock, loads = FakeClock(), InMemoryLoads()
    only = single_endpoint("payment", "http://one.invalid")
    r = router(clock, loads, endpoints=(only,))
    assert r.acquire("payment") is only
    r.release(only)
    assert (loads.reads, loads.published) == (0, [])


def base_env(**extra: str) -> dict[str, str]:
    env = {
        "SAS_TRANSPORT": "storage",
        "SasStorage": "UseDevelopmentStorage=true",
        **{
            settings.remote_url_setting(a): f"https://{a}.example.com"
            for a in settings.HTTP_AGENTS  # the app's: another workflow may add one
        },
    }
    env.update(extra)
    return env


def test_endpoints_setting_is_parsed_and_replaces_the_url():
    value = json.dumps(
        [
            {"name": "west", "url": "https://west.example.com/pay", "capacity": 8},
            {"name": "north", "url": "https://north.example.com/pay"},
        ]
    )
    s = settings.load(base_env(SAS_REMOTE_PAYMENT_ENDPOINTS=value))
    west, north = s.endpoints_of("payment")
    assert (west.name, west.url, west.capacity) == ("west", "https://west.example.com/pay", 8)
    assert (north.name, north.capacity) == ("north", None)
    assert s.remote_targets["payment@west"] == "https://west.example.com/pay"
    assert s.endpoints_of("inventory")[0].target == "inventory"


def test_the_one_url_can_have_a_capacity():
    s = settings.load(base_env(SAS_REMOTE_SHIPPING_CAPACITY="12"))
    (only,) = s.endpoints_of("shipping")
    assert (only.name, only.capacity) == ("primary", 12)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "JSON list"),
        ("[]", "1 to 8"),
        (json.dumps([{"name": "West", "url": "https://a.example.com"}]), "name must match"),
        (json.dumps([{"name": "west", "url": "ftp://a.example.com"}]), "http(s) URL"),
        (json.dumps([{"name": "west", "url": "https://a.example.com", "capacity": 0}]), "capacity"),
        (
            json.dumps([{"name": "west", "url": "https://a.example.com", "capacity": True}]),
            "capacity",
        ),
        (json.dumps([{"name": "west", "url": "https://a.example.com", "extra": 1}]), "object"),
        (
            json.dumps([{"name": "west", "url": "https://a.example.com"}] * 2),
            "used twice",
        ),
    ],
)
def test_bad_endpoints_are_refused_with_the_setting_named(value, message):
    with pytest.raises(ConfigurationError) as refused:
        settings.load(base_env(SAS_REMOTE_PAYMENT_ENDPOINTS=value))
    assert message in str(refused.value)
    assert "SAS_REMOTE_PAYMENT_ENDPOINTS" in str(refused.value)


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_capacity_is_refused(value):
    with pytest.raises(ConfigurationError, match="SAS_REMOTE_PAYMENT_CAPACITY"):
        settings.load(base_env(SAS_REMOTE_PAYMENT_CAPACITY=value))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (settings.LOW_PRIORITY_BACKLOG, "0"),
        (settings.LOW_PRIORITY_MAX_DEFERRAL, "99999"),
        (settings.LOW_PRIORITY_MAX_DEFERRAL, "soon"),
    ],
)
def test_bad_admission_settings_are_refused(key, value):
    with pytest.raises(ConfigurationError, match=key):
        settings.load(base_env(**{key: value}))


def test_admission_settings_are_read():
    s = settings.load(
        base_env(SAS_LOW_PRIORITY_BACKLOG_SECONDS="3", SAS_LOW_PRIORITY_MAX_DEFERRAL_SECONDS="90")
    )
    assert s.admission.backlog == timedelta(seconds=3)
    assert s.admission.max_deferral == timedelta(seconds=90)


def test_lane_queue_names_are_settings_of_their_own():
    s = settings.load(base_env(SAS_QUEUE_AGENT_PAYMENT_HIGH="pay-urgent"))
    assert s.lanes(settings.agent_queue_setting("payment")) == {
        "high": "pay-urgent",
        "normal": "sas-agent-payment",
        "low": "sas-agent-payment-low",
    }
    with pytest.raises(ConfigurationError, match="name the same queue"):
        settings.load(base_env(SAS_QUEUE_ORDERS_LOW="sas-orders"))


def test_a_long_call_stays_visible_to_other_processes_through_the_heartbeat():
    clock, loads = FakeClock(), InMemoryLoads()
    only = Endpoint("payment", "west", "http://w.invalid", capacity=2)
    p1 = Router({"payment": (only,)}, clock, "p1", healthy=lambda e: True, loads=loads)
    p2 = Router({"payment": (only,)}, clock, "p2", healthy=lambda e: True, loads=loads)
    assert p1.acquire("payment") and p1.acquire("payment")  # two long calls start in p1
    for _ in range(12):  # 12 s of calls, p1 doing nothing but its heartbeat
        clock.advance(1.0)
        p1.heartbeat()
        assert p2.in_flight(only) == 2
        assert p2.acquire("payment") is None  # full, as seen from the other process


def test_a_release_is_published_by_the_next_heartbeat():
    clock, loads = FakeClock(), InMemoryLoads()
    only = Endpoint("payment", "west", "http://w.invalid", capacity=1)
    p1 = Router({"payment": (only,)}, clock, "p1", healthy=lambda e: True, loads=loads)
    p2 = Router({"payment": (only,)}, clock, "p2", healthy=lambda e: True, loads=loads)
    endpoint = p1.acquire("payment")  # published at once
    assert endpoint is not None
    clock.advance(0.3)
    p1.release(endpoint)  # within the refresh: not published yet
    clock.advance(1.0)
    p1.heartbeat()
    clock.advance(1.0)
    assert p2.acquire("payment") is only


@pytest.mark.parametrize("url", [5, ["https://a.example.com"], {"u": 1}, None])
def test_an_endpoint_url_that_is_not_text_is_refused_with_the_key(url):
    value = json.dumps([{"name": "west", "url": url}])
    with pytest.raises(ConfigurationError, match="SAS_REMOTE_PAYMENT_ENDPOINTS"):
        settings.load(base_env(SAS_REMOTE_PAYMENT_ENDPOINTS=value))


def test_a_capacity_beside_an_endpoints_list_is_refused():
    value = json.dumps([{"name": "west", "url": "https://a.example.com"}])
    with pytest.raises(ConfigurationError, match="SAS_REMOTE_PAYMENT_CAPACITY"):
        settings.load(
            base_env(SAS_REMOTE_PAYMENT_ENDPOINTS=value, SAS_REMOTE_PAYMENT_CAPACITY="abc")
        )


def test_lanes_are_named_after_a_renamed_normal_lane():
    s = settings.load(base_env(SAS_QUEUE_ORDERS="app1-orders"))
    assert s.lanes(settings.QUEUE_ORDERS) == {
        "high": "app1-orders-high",
        "normal": "app1-orders",
        "low": "app1-orders-low",
    }
