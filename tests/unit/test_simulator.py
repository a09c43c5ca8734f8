"""The simulated provider: idempotency, injected faults, undo semantics, counters, CLI flags.

The clock and the sleep are injected (FakeClock, a recording sleep), so outage windows and
slow replies are exercised without waiting.
"""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from sas.settings import HTTP_AGENTS
from sas.testing import FakeClock
from sas_local.simulator import FaultConfig, create_app
from sas_local.simulator.__main__ import build_parser, faults_from_args, played

pytestmark = pytest.mark.unit


class Client:
    """A synchronous client for the app in-process (httpx ASGITransport, no network)."""

    def __init__(self, app: FastAPI, raise_app_exceptions: bool = True) -> None:
        self._transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        # A fresh event loop per request is fine: the app holds no loop-bound state.
        async def send() -> httpx.Response:
            async with httpx.AsyncClient(transport=self._transport, base_url="http://sim") as c:
                return await c.request(method, path, **kwargs)

        return asyncio.run(send())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


@dataclass
class Sim:
    client: Client
    clock: FakeClock
    slept: list[float] = field(default_factory=list)

    def post(self, path: str, key: str | None, **payload: object):
        headers = {"Idempotency-Key": key} if key is not None else {}
        return self.client.post(path, json=payload, headers=headers)

    def do(self, service: str, action: str, order: str = "o1", step: str | None = None):
        return self.post(f"/{service}/{action}", f"{order}:{step or action}", order_id=order)

    def undo(self, service: str, action: str, original: str, order: str = "o1"):
        return self.post(
            f"/{service}/{action}",
            f"{order}:{original}:undo",
            order_id=order,
            original_action=original,
            original_key=f"{order}:{original}",
        )

    def ledger(self) -> dict[str, Any]:
        ledger: dict[str, Any] = self.client.get("/ledger").json()
        return ledger

    def effects(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.ledger()["effects"] if kind is None or e["kind"] == kind]

    def stats(self, service: str) -> dict[str, Any]:
        stats: dict[str, Any] = self.client.get("/stats").json()[service]
        return stats


def make_sim(services: tuple[str, ...] | None = None, **faults: object) -> Sim:
    clock = FakeClock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    app = create_app(
        FaultConfig.model_validate(faults), clock=clock, sleep=sleep, services=services
    )
    return Sim(Client(app), clock, slept)


# --- idempotency ------------------------------------------------------------------------------


def test_a_key_is_applied_once_and_a_replay_returns_the_original_response():
    sim = make_sim()
    first = sim.do("payment", "charge")
    again = sim.do("payment", "charge")
    assert first.status_code == again.status_code == 200
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    [effect] = sim.effects()
    assert effect["kind"] == "do" and effect["order_id"] == "o1"
    assert (effect["service"], effect["action"], effect["idempotency_key"]) == (
        "payment",
        "charge",
        "o1:charge",
    )
    assert effect["applied_at"] is not None and effect["undone_at"] is None
    assert sim.ledger()["replays"] == 1
    assert (sim.stats("payment")["applied"], sim.stats("payment")["replays"]) == (1, 1)


def test_the_same_key_on_another_action_or_service_is_another_effect():
    sim = make_sim()
    sim.post("/payment/charge", "k1", order_id="o1")
    sim.post("/payment/authorize", "k1", order_id="o1")
    sim.post("/inventory/charge", "k1", order_id="o1")
    assert len(sim.effects()) == 3


@pytest.mark.parametrize("key", [None, ""])
def test_a_missing_idempotency_key_is_a_400_and_applies_nothing(key):
    sim = make_sim()
    response = sim.post("/payment/charge", key, order_id="o1")
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["detail"]
    assert sim.effects() == []
    assert sim.stats("payment")["bad_requests"] == 1


# --- transient faults -------------------------------------------------------------------------


@pytest.mark.parametrize(("share", "status"), [(0.0, 503), (1.0, 429)])
def test_transient_faults_answer_503_or_429_and_apply_nothing(share, status):
    sim = make_sim(transient_rate=1.0, throttle_share=share)
    responses = [sim.do("payment", "charge") for _ in range(3)]
    assert [r.status_code for r in responses] == [status] * 3
    if status == 429:
        assert responses[0].headers["Retry-After"] == "1"
    assert sim.effects() == []
    stats = sim.stats("payment")
    assert stats["transient_failures"] == 3 and stats["throttled"] == (3 if status == 429 else 0)
    assert stats["calls"] == 3 and stats["applied"] == 0


def test_once_transient_faults_are_cleared_the_key_applies():
    sim = make_sim(transient_rate=1.0)
    assert sim.do("payment", "charge").status_code in (429, 503)
    assert sim.client.put("/faults", json={"transient_rate": 0}).status_code == 200
    response = sim.do("payment", "charge")
    assert response.status_code == 200 and "Idempotent-Replayed" not in response.headers
    assert len(sim.effects()) == 1


def transient_pattern(seed: int) -> list[int]:
    sim = make_sim(seed=seed, transient_rate=0.5, throttle_share=0.5)
    return [sim.do("payment", "charge", order=f"o{i}").status_code for i in range(60)]


def test_transient_faults_are_reproducible_from_the_seed_and_follow_the_rate():
    pattern = transient_pattern(7)
    assert pattern == transient_pattern(7)
    other = transient_pattern(8)
    assert [s == 200 for s in pattern] != [s == 200 for s in other]
    assert {200, 429, 503} == set(pattern)
    assert 15 <= pattern.count(200) <= 45


def test_a_retry_of_a_transiently_failed_key_gets_fresh_dice():
    sim = make_sim(seed=3, transient_rate=0.5)
    statuses = [sim.do("payment", "charge").status_code for _ in range(40)]
    assert 200 in statuses and {429, 503} & set(statuses)
    assert len(sim.effects()) == 1  # applied once however many calls got through


# --- permanent faults -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "action", "status", "detail"),
    [
        ("payment", "charge", 402, "card declined"),
        ("inventory", "reserve", 422, "out of stock"),
        ("shipping", "ship", 422, "address undeliverable"),
    ],
)
def test_permanent_faults_refuse_do_actions_for_good(service, action, status, detail):
    sim = make_sim(permanent_rate=1.0)
    responses = [sim.do(service, action) for _ in range(3)]
    assert [r.status_code for r in responses] == [status] * 3
    assert responses[0].json()["detail"] == detail
    assert sim.effects() == []
    assert sim.stats(service)["permanent_failures"] == 3


def test_permanent_decisions_are_stable_per_key_and_depend_on_the_seed():
    def refused(seed: int) -> set[str]:
        sim = make_sim(seed=seed, permanent_rate=0.5)
        keys = {f"o{i}" for i in range(40)}
        first = {o for o in keys if sim.do("payment", "charge", order=o).status_code == 402}
        for _ in range(2):  # retries of the same step get the same business answer
            again = {o for o in keys if sim.do("payment", "charge", order=o).status_code == 402}
            assert again == first
        return first

    refused_7 = refused(7)
    assert 8 <= len(refused_7) <= 32
    assert refused(7) == refused_7
    assert refused(8) != refused_7


def test_permanent_faults_spare_undo_actions_by_default():
    sim = make_sim(permanent_rate=1.0)
    assert sim.do("payment", "charge").status_code == 402
    response = sim.undo("payment", "refund", "charge")
    assert response.status_code == 200 and response.json()["outcome"] == "noop"


def test_undo_permanent_rate_refuses_undos_and_leaves_the_effect_applied():
    sim = make_sim()
    sim.do("payment", "charge")
    sim.client.put("/faults", json={"undo_permanent_rate": 1.0})
    response = sim.undo("payment", "refund", "charge")
    assert response.status_code == 422
    [effect] = sim.effects()
    assert effect["undone_at"] is None
    assert sim.stats("payment")["permanent_failures"] == 1


def test_an_applied_key_replays_even_if_it_would_now_be_refused():
    sim = make_sim()
    sim.do("payment", "charge")
    sim.client.put("/faults", json={"permanent_rate": 1.0})
    response = sim.do("payment", "charge")
    assert response.status_code == 200 and response.headers["Idempotent-Replayed"] == "true"


def test_per_service_overrides_apply_to_that_service_only():
    sim = make_sim(per_service={"payment": {"permanent_rate": 1.0}})
    assert sim.do("payment", "charge").status_code == 402
    assert sim.do("inventory", "reserve").status_code == 200


# --- slow responses ---------------------------------------------------------------------------


def test_a_slow_response_applies_the_effect_then_waits_before_answering():
    sim = make_sim(slow_rate=1.0, slow_seconds=7.5)
    response = sim.do("shipping", "ship")
    assert response.status_code == 200
    assert sim.slept == [7.5]
    assert len(sim.effects()) == 1
    assert sim.stats("shipping")["slow"] == 1


def test_a_slow_response_that_never_arrives_still_left_the_effect_applied():
    async def caller_gave_up(seconds: float) -> None:
        raise ConnectionResetError("the agent stopped waiting")

    app = create_app(FaultConfig(slow_rate=1.0), clock=FakeClock(), sleep=caller_gave_up)
    sim = Sim(Client(app, raise_app_exceptions=False), FakeClock())
    assert sim.do("shipping", "ship").status_code == 500
    assert [e["idempotency_key"] for e in sim.effects()] == ["o1:ship"]


def test_no_slow_rate_means_no_waiting():
    sim = make_sim(slow_rate=0.0, slow_seconds=7.5)
    sim.do("shipping", "ship")
    assert sim.slept == []


# --- outage window ----------------------------------------------------------------------------


def test_an_outage_window_rejects_every_call_to_that_service_only():
    sim = make_sim(outage_service="payment", outage_start=10, outage_seconds=5)
    assert sim.do("payment", "charge", order="before").status_code == 200
    sim.clock.advance(10)
    assert sim.do("payment", "charge", order="during").status_code == 503
    assert sim.do("payment", "charge", order="before").status_code == 503  # replays too
    assert sim.do("inventory", "reserve").status_code == 200
    sim.clock.advance(4.9)
    assert sim.do("payment", "charge", order="during").status_code == 503
    sim.clock.advance(0.1)
    assert sim.do("payment", "charge", order="during").status_code == 200
    assert sim.stats("payment")["outage_rejections"] == 3
    assert sorted(e["order_id"] for e in sim.effects() if e["service"] == "payment") == [
        "before",
        "during",
    ]


def test_the_outage_window_is_measured_from_when_the_faults_were_set():
    sim = make_sim()
    sim.clock.advance(100)
    config = {"outage_service": "payment", "outage_start": 0, "outage_seconds": 30}
    assert sim.client.put("/faults", json=config).status_code == 200
    assert sim.do("payment", "charge").status_code == 503
    sim.clock.advance(30)
    assert sim.do("payment", "charge").status_code == 200


# --- the faults endpoint ----------------------------------------------------------------------


def test_get_faults_returns_what_put_set_and_put_replaces_the_whole_config():
    sim = make_sim(seed=5, transient_rate=0.3)
    assert sim.client.get("/faults").json()["transient_rate"] == 0.3
    body = {"seed": 9, "slow_rate": 0.2, "per_service": {"payment": {"permanent_rate": 0.1}}}
    put = sim.client.put("/faults", json=body)
    got = sim.client.get("/faults")
    assert put.json() == got.json()
    assert got.json()["seed"] == 9 and got.json()["transient_rate"] == 0.0
    assert got.json()["per_service"]["payment"]["permanent_rate"] == 0.1
    assert "Faults-Set-At" in got.headers
    assert sim.client.put("/faults", json=got.json()).status_code == 200  # round-trips


def test_faults_fixed_at_start_refuse_a_put_and_stay_as_they_were():
    app = create_app(FaultConfig(transient_rate=0.5), faults_fixed="set by the app setting")
    client = Client(app)
    put = client.put("/faults", json={"transient_rate": 0.0})
    assert (put.status_code, put.json()) == (403, {"detail": "set by the app setting"})
    assert client.get("/faults").json()["transient_rate"] == 0.5


@pytest.mark.parametrize(
    "body",
    [{"transient_rate": 1.5}, {"permanent_rate": -0.1}, {"typo_rate": 0.1}, {"slow_seconds": -1}],
)
def test_invalid_fault_configs_are_rejected_and_change_nothing(body):
    sim = make_sim(transient_rate=0.25)
    assert sim.client.put("/faults", json=body).status_code == 422
    assert sim.client.get("/faults").json()["transient_rate"] == 0.25


# --- undo -------------------------------------------------------------------------------------


def test_an_undo_marks_the_original_effect_undone():
    sim = make_sim()
    sim.do("payment", "charge")
    sim.clock.advance(3)
    response = sim.undo("payment", "refund", "charge")
    assert response.status_code == 200
    assert response.json()["kind"] == "undo" and response.json()["outcome"] == "undone"
    [do] = sim.effects("do")
    [undo] = sim.effects("undo")
    assert do["undone_by"] == "o1:charge:undo"
    assert do["undone_at"] == undo["applied_at"] != do["applied_at"]
    assert (undo["original_action"], undo["original_key"], undo["action"]) == (
        "charge",
        "o1:charge",
        "refund",
    )
    assert undo["order_id"] == "o1" and undo["outcome"] == "undone"
    assert sim.stats("payment")["undos_applied"] == 1


def test_an_undo_of_an_effect_never_applied_succeeds_as_a_recorded_noop():
    sim = make_sim()
    response = sim.undo("inventory", "release", "reserve")
    assert response.status_code == 200 and response.json()["outcome"] == "noop"
    assert sim.effects("do") == []
    [undo] = sim.effects("undo")
    assert undo["outcome"] == "noop" and undo["original_key"] == "o1:reserve"
    assert sim.stats("inventory")["undos_noop"] == 1


def test_an_undo_is_idempotent_per_undo_key():
    sim = make_sim()
    sim.do("payment", "charge")
    first = sim.undo("payment", "refund", "charge")
    sim.clock.advance(5)
    again = sim.undo("payment", "refund", "charge")
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    assert len(sim.effects("undo")) == 1
    [do] = sim.effects("do")
    assert do["undone_at"] == sim.effects("undo")[0]["applied_at"]  # not moved by the replay
    assert sim.stats("payment")["undos_applied"] == 1


def test_a_second_undo_under_another_key_is_a_noop_not_a_second_refund():
    sim = make_sim()
    sim.do("payment", "charge")
    sim.undo("payment", "refund", "charge")
    other = sim.post(
        "/payment/refund",
        "other",
        order_id="o1",
        original_action="charge",
        original_key="o1:charge",
    )
    assert other.json()["outcome"] == "noop"
    [do] = sim.effects("do")
    assert do["undone_by"] == "o1:charge:undo"
    stats = sim.stats("payment")
    assert (stats["undos_applied"], stats["undos_noop"]) == (1, 1)


@pytest.mark.parametrize("applied_first", [False, True])
def test_a_do_after_its_undo_is_refused_409_and_applies_nothing(applied_first):
    sim = make_sim()
    if applied_first:
        sim.do("payment", "charge")
    sim.undo("payment", "refund", "charge")
    late = sim.do("payment", "charge")
    assert late.status_code == 409
    assert "o1:charge:undo" in late.json()["detail"]
    assert len(sim.effects("do")) == (1 if applied_first else 0)
    assert all(e["undone_at"] is not None for e in sim.effects("do"))
    assert sim.stats("payment")["refused_after_undo"] == 1


@pytest.mark.parametrize(
    "payload",
    [
        {"original_action": "charge"},
        {"original_key": "o1:charge"},
        {"original_action": 3, "original_key": "k"},
    ],
)
def test_a_half_specified_undo_is_a_400(payload):
    sim = make_sim()
    response = sim.post("/payment/refund", "o1:charge:undo", order_id="o1", **payload)
    assert response.status_code == 400
    assert sim.effects() == []


# --- CLI --------------------------------------------------------------------------------------


def test_cli_flags_build_the_fault_config_over_the_json():
    args = build_parser().parse_args(
        [
            "--port",
            "9000",
            "--faults-json",
            '{"seed": 1, "transient_rate": 0.5, "per_service": {"payment": {"slow_rate": 1}}}',
            "--transient-rate",
            "0.1",
            "--outage-service",
            "shipping",
            "--outage-start",
            "5",
            "--outage-seconds",
            "20",
        ]
    )
    faults = faults_from_args(args)
    assert args.port == 9000
    assert (faults.seed, faults.transient_rate, faults.outage_service) == (1, 0.1, "shipping")
    assert (faults.outage_start, faults.outage_seconds) == (5, 20)
    assert faults.per_service["payment"].slow_rate == 1


@pytest.mark.parametrize(
    "argv", [["--transient-rate", "2"], ["--faults-json", "[1]"], ["--faults-json", "{bad"]]
)
def test_cli_rejects_invalid_faults(argv):
    with pytest.raises(ValueError):
        faults_from_args(build_parser().parse_args(argv))


def test_the_cli_plays_the_services_named_else_the_apps_http_agents():
    parser = build_parser()
    assert played(parser.parse_args(["--services", "post, payment"])) == ("post", "payment")
    assert played(parser.parse_args([])) == HTTP_AGENTS
    with pytest.raises(SystemExit):
        parser.parse_args(["--services", "post,Flights"])


# --- the services it plays ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/flights/book", "/endpoints/west/flights/book"])
def test_a_service_it_does_not_play_is_a_404_naming_it_and_applies_nothing(path):
    sim = make_sim(services=("payment", "inventory"))
    answer = sim.post(path, "o1:book", order_id="o1")
    assert answer.status_code == 404
    assert answer.json()["detail"] == (
        "this simulator does not play service 'flights'; it plays inventory, payment: "
        "give 'flights' a URL of its own"
    )
    assert sim.ledger()["effects"] == [] and sim.ledger()["stats"] == {}
    assert sim.client.get("/endpoints").json() == {}


def test_the_services_it_plays_answer_and_health_names_them():
    sim = make_sim(services=("payment",))
    assert sim.do("payment", "charge").status_code == 200
    assert sim.client.get("/health").json() == {"status": "ok", "services": ["payment"]}
    anyone = make_sim()  # None: any service
    assert anyone.do("anything", "act").status_code == 200
    assert anyone.client.get("/health").json() == {"status": "ok"}


def test_the_package_runs_as_a_module():
    assert importlib.util.find_spec("sas_local.simulator.__main__") is not None


# --- named endpoints --------------------------------------------------------------------------


def test_named_endpoints_share_one_ledger():
    sim = make_sim()
    path = "/endpoints/{}/payment/charge"
    body = {"order_id": "o1"}
    first = sim.client.post(path.format("west"), json=body, headers={"Idempotency-Key": "o1:c"})
    again = sim.client.post(path.format("north"), json=body, headers={"Idempotency-Key": "o1:c"})
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(sim.effects("do")) == 1
    endpoints = sim.client.get("/endpoints").json()
    assert endpoints["west"]["calls"] == endpoints["north"]["calls"] == 1


def test_a_down_endpoint_refuses_with_503_and_applies_nothing():
    sim = make_sim(endpoints={"west": {"down": True}})
    response = sim.client.post(
        "/endpoints/west/payment/charge", json={"order_id": "o1"}, headers={"Idempotency-Key": "k"}
    )
    assert response.status_code == 503
    assert sim.effects() == []
    assert sim.client.get("/endpoints").json()["west"]["down_rejections"] == 1


def test_an_endpoint_at_capacity_answers_429_and_never_holds_more_calls():
    import asyncio

    import httpx

    async def scenario() -> tuple[list[int], dict[str, Any], int]:
        gate = asyncio.Event()

        async def held(seconds: float) -> None:
            await gate.wait()  # a call holds its place until the test lets it go

        app = create_app(
            FaultConfig.model_validate(
                {"endpoints": {"west": {"capacity": 2, "latency_seconds": 1.0}}}
            ),
            clock=FakeClock(),
            sleep=held,
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:

            async def call(n: int) -> int:
                response = await client.post(
                    "/endpoints/west/payment/charge",
                    json={"order_id": f"o{n}"},
                    headers={"Idempotency-Key": f"o{n}:charge"},
                )
                return response.status_code

            calls = [asyncio.create_task(call(n)) for n in range(2)]
            await asyncio.sleep(0.05)  # both are in, holding their places
            third = await call(2)  # one too many: refused at once
            gate.set()
            statuses = sorted([*(await asyncio.gather(*calls)), third])
            stats = (await client.get("/endpoints")).json()["west"]
            effects = len((await client.get("/ledger")).json()["effects"])
        return statuses, stats, effects

    statuses, stats, effects = asyncio.run(scenario())
    assert statuses == [200, 200, 429]
    assert (stats["max_in_flight"], stats["saturated"], stats["in_flight"]) == (2, 1, 0)
    assert effects == 2
