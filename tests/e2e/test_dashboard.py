"""The operators' dashboard in headless Chromium (Debian's package, driven by Playwright)
against the dev hosts: its numbers match the store; filters, paging counts, an order found by
id or link; an Error order's timeline, Resubmit (one, or every match after a dry run) and
Close then purge; parked messages replayed and discarded; the health view with an open breaker
and an unread alert; the API reference with no network."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.storage.queue import TextBase64EncodePolicy
from playwright.sync_api import Browser, Page, expect, sync_playwright

from sas.adapters.breaker_table import TableBreakerStore
from sas.adapters.clients import queue_service_client, table_client
from sas.adapters.load_table import TableBudgetStore
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.breaker import BreakerStatus
from sas.domain.endpoints import HeldRetries
from sas.domain.model import ProcessState
from sas.domain.wire import live_table_name, submission_message_id
from sas.services import telemetry
from sas.settings import QUEUE_ORDERS
from sas_local.browser import launch
from sas_local.demo import demo_order
from sas_local.devhost.worker import PRELOAD_ENV
from sas_local.ledger import check_effects, configure_faults, fetch_ledger
from sas_local.processes import wait_until
from sas_local.span_capture import CAPTURE_DIR_ENV
from sas_local.stack import LocalStack
from workflows.order import ORDER_WORKFLOW

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PROCESSED = 5
# Shipping refuses every order and payment every refund: the compensation of the order sent
# under these faults cannot finish, so it stops in Error for an operator.
REFUSE_SHIP_AND_REFUND = {
    "per_service": {"shipping": {"permanent_rate": 1.0}, "payment": {"undo_permanent_rate": 1.0}}
}
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[LocalStack]:
    # Traced as `make run` is (each worker records its spans), so orders carry a trace id. One
    # dev host: what the page shows does not depend on the layout (tests/e2e/flex/test_pipeline.py).
    spans = tmp_path_factory.mktemp("spans")
    traced = {PRELOAD_ENV: "sas_local.span_capture", CAPTURE_DIR_ENV: str(spans)}
    logs = tmp_path_factory.mktemp("stack")
    with LocalStack.start(
        layout="shared", workers=2, log_dir=logs, env_overrides=traced
    ) as running:
        yield running


@pytest.fixture(scope="module")
def store(stack) -> TableStateStore:
    return TableStateStore.connect(stack.settings.storage, stack.settings.table_name)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        running = launch(playwright)
        yield running
        running.close()


def state_of(store: TableStateStore, order_id: str) -> ProcessState | None:
    found = store.get_state(order_id)
    return None if found is None else found.value.process_state


def send(stack: LocalStack, index: int) -> str:
    transport = StorageQueueTransport(queue_service_client(stack.settings.storage))
    order = demo_order(index, "dash")
    transport.send(
        stack.settings.lane(QUEUE_ORDERS, order.priority),
        order,
        message_id=submission_message_id(order.order_id),
        correlation_id=order.order_id,
    )
    return order.order_id


def error_order(stack: LocalStack, store: TableStateStore, index: int) -> str:
    """An order that stops in Error (shipping refused, then its refund), its alert sent."""
    configure_faults(stack.simulator_url, REFUSE_SHIP_AND_REFUND)
    failed = send(stack, index)
    wait_until(
        lambda: (
            (found := store.get_state(failed)) is not None
            and found.value.process_state is ProcessState.ERROR
            and not found.value.alert_pending
        ),
        timeout=90,
        interval=0.3,
        what="the order in Error with its alert sent",
    )
    return failed


def park_one(stack: LocalStack, store: TableStateStore) -> None:
    """A bad message on the orders queue, parked by the app."""
    parked = len(store.list_parked(100))
    orders_queue = queue_service_client(stack.settings.storage).get_queue_client(
        stack.settings.lane(QUEUE_ORDERS, "normal"),
        message_encode_policy=TextBase64EncodePolicy(),
    )
    orders_queue.send_message("this is not an order")
    wait_until(
        lambda: len(store.list_parked(100)) > parked, timeout=30, interval=0.3,
        what="a parked message",
    )  # fmt: skip


@pytest.fixture(scope="module")
def failed_order(stack, store) -> str:
    """PROCESSED orders Processed, one in Error (its alert sent), one bad message parked by the
    app."""
    good = [send(stack, i) for i in range(PROCESSED)]
    wait_until(
        lambda: all(state_of(store, oid) is ProcessState.PROCESSED for oid in good),
        timeout=90,
        interval=0.3,
        what=f"{PROCESSED} orders Processed",
    )
    failed = error_order(stack, store, PROCESSED)
    park_one(stack, store)
    return failed


@pytest.fixture(scope="module", autouse=True)
def patient_expectations() -> Iterator[None]:
    """Each expectation waits up to WAIT_MS (Playwright's default is 5 s): in the suite, on two
    cores, one API call of the page through a starved dev host took 28 s. What is expected
    is unchanged; only how long it may take."""
    expect.set_options(timeout=WAIT_MS)
    yield
    expect.set_options(timeout=5_000)


ACTOR = "Dana on call"


@pytest.fixture
def page(stack, browser, failed_order) -> Iterator[Page]:
    opened = browser.new_page()
    calls = _CallLog(opened)
    opened.goto(f"{stack.api_url}/api/dashboard")
    expect(opened.locator("#updated-at")).not_to_have_attribute("data-refreshes", "0")
    opened.fill("#actor", ACTOR)  # no sign-in here: who acts is asked for
    yield opened
    print(calls.summary(opened))  # shown only when the test failed: what the page waited on
    opened.close()


class _CallLog:
    """The page's API calls: how long each kind took, which never finished."""

    def __init__(self, page: Page) -> None:
        self.started: dict[Any, float] = {}
        self.took: dict[str, list[float]] = {}
        self.failed: list[str] = []
        page.on("request", lambda r: self.started.__setitem__(r, time.monotonic()))
        page.on("requestfinished", self._finished)
        page.on("requestfailed", lambda r: self.failed.append(f"{r.url}: {r.failure}"))

    def _finished(self, request: Any) -> None:
        began = self.started.pop(request, None)
        if began is not None:
            kind = request.url.split("?")[0].rsplit("/api/", 1)[-1]
            self.took.setdefault(kind, []).append(time.monotonic() - began)

    def summary(self, page: Page) -> str:
        lines = [
            f"{kind}: {len(t)} call(s), longest {max(t):.1f} s, mean {sum(t) / len(t):.1f} s"
            for kind, t in sorted(self.took.items())
        ]
        now = time.monotonic()
        lines += [f"unfinished {r.url} after {now - t:.1f} s" for r, t in self.started.items()]
        lines += [f"failed {line}" for line in self.failed]
        problem = page.locator("#problem")
        lines.append(f"refreshes {page.locator('#updated-at').get_attribute('data-refreshes')}")
        lines.append(f"problem shown: {problem.text_content()!r}")
        return "\n".join(lines)


def test_the_counts_match_the_store(page, store):
    # Read straight from the table (whole state rows, one query per state), not through the
    # route the page uses (counts of one column over the whole table).
    for state in ProcessState:
        expected = len(list(store.query_states(process_state=state)))
        card = page.locator(f"[data-state-count='{state.value}']")
        expect(card).to_have_text(str(expected))
    assert page.locator("[data-state-count='Processed']").inner_text() == str(PROCESSED)
    assert page.locator("[data-state-count='Error']").inner_text() == "1"
    # One card and one table for parked messages of both kinds; this run poisoned nothing, so
    # all are the app's.
    expect(page.locator("[data-count='parked']")).to_have_text(str(len(store.list_parked(100))))
    expect(page.locator("#parked tbody tr")).to_have_count(1)
    app = page.locator("#parked tbody tr[data-by='app']")
    expect(app).to_have_count(1)
    expect(app.locator(".by")).to_have_text("app")
    expect(app).to_contain_text("this is not an order")
    expect(app).to_contain_text(store.list_parked(1)[0].id)
    expect(page.locator("#problem")).to_be_hidden()


def test_the_filters_narrow_the_orders_table(page, failed_order):
    rows = page.locator("#orders tbody tr")
    expect(rows).to_have_count(PROCESSED + 1)
    page.select_option("#filter-state", "Error")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-order-id", failed_order)
    page.select_option("#filter-state", "")
    page.select_option("#filter-priority", "high")
    expect(page.locator("#orders-empty")).to_be_visible()
    page.select_option("#filter-priority", "")
    page.fill("#filter-older", "60")  # nothing here is an hour old
    page.dispatch_event("#filter-older", "change")
    expect(page.locator("#orders-empty")).to_be_visible()
    page.fill("#filter-older", "")
    page.fill("#filter-workflow", "order")  # every order here is one
    page.dispatch_event("#filter-workflow", "change")
    expect(rows).to_have_count(PROCESSED + 1)
    expect(rows.first.locator("td").nth(1)).to_have_text("order")
    page.fill("#filter-workflow", "ordr")
    page.dispatch_event("#filter-workflow", "change")
    expect(page.locator("#problem")).to_contain_text("no workflow 'ordr' is deployed")
    page.fill("#filter-workflow", "")
    page.dispatch_event("#filter-workflow", "change")
    expect(page.locator("#problem")).to_be_hidden()


def test_orders_page_through_and_narrow_to_absolute_times(page, store):
    rows = page.locator("#orders tbody tr")
    shown = page.locator("#orders-shown")
    page.fill("#filter-limit", "2")
    page.dispatch_event("#filter-limit", "change")
    expect(shown).to_have_text(re.compile(r"^showing 2 of \d+$"))
    total = int(shown.get_attribute("data-total") or 0)
    first_page = [rows.nth(i).get_attribute("data-order-id") for i in range(2)]
    expect(page.locator("#page-previous")).to_be_disabled()
    page.click("#page-next")
    expect(shown).to_have_text(f"showing 3-4 of {total}")
    expect(rows).to_have_count(2)
    second_page = [rows.nth(i).get_attribute("data-order-id") for i in range(2)]
    assert not set(first_page) & set(second_page)
    page.click("#page-previous")
    expect(shown).to_have_text(f"showing 2 of {total}")
    # Absolute times, in UTC: every order was submitted before now, none before 2000.
    page.fill("#filter-limit", "50")
    page.fill("#filter-until", "2000-01-01 00:00")  # 24-hour UTC, as the page shows times
    page.dispatch_event("#filter-until", "change")
    expect(shown).to_have_text("showing 0 of 0")
    page.fill("#filter-until", "")
    page.fill("#filter-from", "2000-01-01 13:00:00")
    page.dispatch_event("#filter-from", "change")
    expect(shown).to_have_text(f"showing {total} of {total}")


def test_orders_filter_on_error_text_and_say_how_many_match(page, failed_order):
    rows = page.locator("#orders tbody tr")
    page.fill("#filter-limit", "1")
    page.dispatch_event("#filter-limit", "change")
    expect(rows).to_have_count(1)
    expect(page.locator("#orders-shown")).to_have_text(re.compile(r"^showing 1 of \d+$"))
    assert int(page.locator("#orders-shown").get_attribute("data-total") or 0) > PROCESSED
    page.fill("#filter-limit", "50")
    page.fill("#filter-error", "UNDO REFUSED")  # any case
    page.dispatch_event("#filter-error", "change")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-order-id", failed_order)
    expect(page.locator("#orders-shown")).to_have_text("showing 1 of 1")


def test_an_error_order_is_resubmitted_from_its_timeline_and_finishes(
    page, stack, store, failed_order
):
    page.locator(f"#orders tbody tr[data-order-id='{failed_order}']").click()
    timeline = page.locator("#timeline")
    expect(timeline).to_be_visible()
    expect(page.locator("#timeline-state")).to_have_text("Error")
    expect(page.locator("#timeline-error")).to_contain_text("undo refused")
    history = page.locator("#history tbody tr")
    stored = store.get_history(failed_order)
    expect(history).to_have_count(len(stored))
    kinds = Counter(entry.kind for entry in stored)
    assert kinds["refused"] >= 2  # the ship, then the refund
    for kind, count in kinds.items():
        expect(page.locator(f"#history tbody tr[data-kind='{kind}']")).to_have_count(count)
    expect(page.locator("#compensation tbody tr").first).to_be_visible()
    expect(page.locator("#steps tbody tr")).to_have_count(2)  # reserve and charge were applied
    # The order's input, and what each step returned (the simulator's effect ids).
    expect(page.locator("#timeline-input")).to_contain_text('"customer_id"')
    reserved = {s.name: s.result for s in store.get_steps(failed_order)}["reserve"]
    expect(page.locator("#steps tbody tr[data-step='reserve'] .result")).to_contain_text(
        reserved["effect_id"]
    )
    trace_id = telemetry.trace_id_of(store.get_state(failed_order).value.traceparent)
    assert trace_id is not None  # the order was traced: the page must show its id
    expect(page.locator("#timeline-trace")).to_have_text(trace_id)

    # Resubmitted without fixing the cause: it says so while the order runs, and once the
    # order is back in Error the box returns without the old news.
    page.click("#resubmit")
    expect(page.locator("#resubmit-outcome")).to_have_text(re.compile("^resubmitted: now "))
    expect(page.locator("#resubmit-box")).to_be_hidden()
    expect(page.locator("#resubmit-box")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#timeline-state")).to_have_text("Error")
    expect(page.locator("#resubmit-outcome")).to_have_text("")

    configure_faults(stack.simulator_url, {})  # the operator fixed the cause
    page.click("#resubmit")
    expect(page.locator("#resubmit-outcome")).to_have_attribute("data-outcome", "ok")
    # Its failed step was the refund: run again, it succeeds, and the undo finishes.
    expect(page.locator("#timeline-state")).to_have_text("Compensated", timeout=WAIT_MS)
    expect(page.locator("#resubmit-box")).to_be_hidden()
    assert state_of(store, failed_order) is ProcessState.COMPENSATED
    assert "resubmitted" in [entry.kind for entry in store.get_history(failed_order)]
    resubmitted = page.locator("#history tbody tr[data-kind='resubmitted']")
    expect(resubmitted).to_have_count(2)  # before the cause was fixed, and after
    for entry in resubmitted.all():
        expect(entry).to_contain_text(ACTOR)
    expect(page.locator("[data-state-count='Error']")).to_have_text("0")


def test_pause_stops_the_live_refresh(page):
    refreshed = page.locator("#updated-at")
    page.click("#pause")
    expect(page.locator("#status")).to_have_text("paused")
    count = refreshed.get_attribute("data-refreshes")
    page.wait_for_timeout(3000)  # longer than one refresh interval
    assert refreshed.get_attribute("data-refreshes") == count
    page.click("#pause")
    expect(refreshed).not_to_have_attribute("data-refreshes", count or "")


def test_the_api_reference_renders_with_no_network(stack, browser):
    """/api/docs loads nothing from elsewhere: every request not to the app is refused here."""
    opened = browser.new_page()
    elsewhere: list[str] = []

    def only_the_app(route: Any) -> None:
        if route.request.url.startswith(stack.api_url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    opened.route("**/*", only_the_app)
    try:
        opened.goto(f"{stack.api_url}/api/docs")
        expect(opened.locator("h2", has_text="/api/orders/{order_id}/resubmit")).to_be_visible()
        expect(opened.locator("h2#post--api-orders")).to_contain_text("Submit Order")
        assert elsewhere == []
    finally:
        opened.close()


def test_an_order_opens_from_its_link_and_by_its_id(stack, browser, failed_order):
    opened = browser.new_page(viewport={"width": 1366, "height": 768})
    try:
        opened.goto(f"{stack.api_url}/api/dashboard#order={failed_order}")
        expect(opened.locator("#timeline-order")).to_have_text(failed_order)
        expect(opened.locator("#timeline h2")).to_be_in_viewport()  # brought into view
        opened.click("#timeline-close")
        expect(opened.locator("#timeline")).to_be_hidden()
        assert "#order=" not in opened.url
        opened.fill("#find-order", "no-such-order")
        opened.press("#find-order", "Enter")
        expect(opened.locator("#find-outcome")).to_contain_text("order no-such-order: 404")
        expect(opened.locator("#timeline")).to_be_hidden()
        opened.fill("#find-order", failed_order)
        opened.click("#find button[type=submit]")
        expect(opened.locator("#timeline-order")).to_have_text(failed_order)
        assert opened.url.endswith(f"/api/dashboard#order={failed_order}")  # a link to share
    finally:
        opened.close()


def test_the_error_orders_the_filters_match_are_resubmitted_after_a_dry_run(page, stack, store):
    failed = error_order(stack, store, PROCESSED + 1)
    page.click("#bulk-check")
    outcome = page.locator("#bulk-outcome")
    # Every Error order there is (this one, after the resubmit test let the first finish).
    shown = re.compile(rf"Error order\(s\) would be resubmitted: .*{failed}")
    expect(outcome).to_contain_text(shown)
    assert state_of(store, failed) is ProcessState.ERROR  # a dry run changes nothing
    configure_faults(stack.simulator_url, {})  # the cause fixed
    page.click("#bulk-confirm")
    expect(outcome).to_have_text(re.compile(r"^resubmitted (\d+) of \1$"))
    expect(page.locator("#bulk-confirm")).to_be_hidden()
    wait_until(
        lambda: state_of(store, failed) is ProcessState.COMPENSATED,
        timeout=90,
        interval=0.3,
        what="the resubmitted order undone",
    )
    actors = [e.actor for e in store.get_history(failed) if e.kind == "resubmitted"]
    assert actors == [ACTOR]


def test_a_parked_message_is_replayed_then_discarded_from_the_page(page, store):
    (first,) = [m.id for m in store.list_parked(10)]
    row = page.locator(f"#parked tbody tr[data-parked-id='{first}']")
    row.locator("button.replay").click()
    outcome = page.locator("#parked-outcome")
    expect(outcome).to_have_text(f"replayed {first}")
    expect(row).to_have_count(0)
    # Still not an order: the app parks it again, under a new id.
    wait_until(lambda: store.list_parked(10), timeout=30, interval=0.3, what="parked again")
    (again,) = [m.id for m in store.list_parked(10)]
    assert again != first
    discard = page.locator(f"#parked tbody tr[data-parked-id='{again}'] button.discard")
    discard.click()
    expect(discard).to_have_text("Discard for good")  # armed, across the page's refreshes
    refreshes = page.locator("#updated-at").get_attribute("data-refreshes")
    expect(page.locator("#updated-at")).not_to_have_attribute("data-refreshes", refreshes or "")
    expect(discard).to_have_text("Discard for good")
    discard.click()
    expect(outcome).to_have_text(f"discarded {again}")
    expect(page.locator("#parked-empty")).to_be_visible()
    assert store.list_parked(10) == []


def test_parked_messages_matching_a_filter_are_replayed_then_discarded_in_bulk(page, stack, store):
    for earlier in store.list_parked(100):  # the module's own bad message, if still parked
        store.drop_parked(earlier.id)
    orders_queue = queue_service_client(stack.settings.storage).get_queue_client(
        stack.settings.lane(QUEUE_ORDERS, "normal"),
        message_encode_policy=TextBase64EncodePolicy(),
    )
    for text in ("bulk one", "bulk two"):
        orders_queue.send_message(text)
    wait_until(lambda: len(store.list_parked(10)) == 2, timeout=30, interval=0.3, what="parked")
    first = {m.id for m in store.list_parked(10)}
    page.select_option("#parked-by", "app")
    page.fill("#parked-queue", stack.settings.lane(QUEUE_ORDERS, "normal"))
    page.press("#parked-queue", "Enter")
    expect(page.locator("#parked-shown")).to_have_text("showing 2 of 2", timeout=WAIT_MS)

    outcome = page.locator("#parked-bulk-outcome")
    page.click("#parked-bulk-replay")
    expect(outcome).to_contain_text("2 message(s) would be replayed")
    assert {m.id for m in store.list_parked(10)} == first  # a dry run changes nothing
    page.click("#parked-bulk-confirm")
    expect(outcome).to_have_text("replayed 2 of 2")
    # Still not orders: parked again, under new ids.
    wait_until(
        lambda: (
            len(store.list_parked(10)) == 2 and not first & {m.id for m in store.list_parked(10)}
        ),
        timeout=30,
        interval=0.3,
        what="parked again",
    )
    page.fill("#parked-older", "60")  # none is an hour old: nothing matches
    page.press("#parked-older", "Enter")
    page.click("#parked-bulk-discard")
    expect(outcome).to_have_text("no parked message matches")
    expect(page.locator("#parked-bulk-confirm")).to_be_hidden()
    page.fill("#parked-older", "")
    page.press("#parked-older", "Enter")
    page.click("#parked-bulk-discard")
    expect(outcome).to_contain_text("2 message(s) would be discarded")
    expect(page.locator("#parked-bulk-confirm")).to_have_text("Discard them for good")
    page.click("#parked-bulk-confirm")
    expect(outcome).to_have_text("discarded 2 of 2")
    expect(page.locator("#parked-empty")).to_be_visible()
    assert store.list_parked(10) == []


@pytest.mark.timeout(420)  # an order to Error first, then a breaker to open: beside the suite
def test_the_health_view_shows_an_open_breaker_and_the_open_alert(page, stack, store):
    """Inventory answers 503 to every call until its breaker opens (the agents' own doing);
    an order stopped in Error has its alert open."""
    stopped = error_order(stack, store, 24)
    breakers = TableBreakerStore(table_client(stack.settings.storage, stack.settings.table_name))

    def inventory_open() -> bool:
        found = breakers.get("inventory")
        return found is not None and found.value.status is BreakerStatus.OPEN

    configure_faults(stack.simulator_url, {"per_service": {"inventory": {"transient_rate": 1.0}}})
    try:
        send(stack, PROCESSED + 3)
        wait_until(inventory_open, timeout=60, interval=0.3, what="inventory's breaker open")
        inventory = page.locator("#endpoints tbody tr[data-target='inventory']")
        expect(inventory).to_have_attribute("data-breaker", "open", timeout=WAIT_MS)
    finally:
        configure_faults(stack.simulator_url, {})
    expect(page.locator("#endpoints tbody tr[data-target='shipping']")).to_have_attribute(
        "data-breaker", "closed"
    )
    alert = page.locator("#alerts tbody tr").filter(has_text=stopped)
    expect(alert.locator("td").nth(2)).to_contain_text("refused")
    expect(page.locator("#counts [data-count='alerts']")).not_to_have_text("—")
    expect(page.locator("#health-summary")).to_contain_text("failure rate")
    assert int(page.locator("#health-summary").get_attribute("data-failed") or 0) >= 1
    expect(page.locator("#throughput svg rect[data-series='processed']").first).to_be_visible()
    axis = page.locator("#throughput .axis")  # when, and how tall a bar is
    expect(axis.locator("time")).to_have_count(2)
    expect(axis.locator(".scale")).to_have_text(
        re.compile(r"^tallest bar: \d+ order\(s\) per \d+ min$")
    )
    alert.locator(f"a[title='{stopped}']").click()  # a link to the order's timeline
    expect(page.locator("#timeline")).to_have_attribute("data-order-id", stopped)


def test_the_health_view_says_when_the_supervisor_holds_retries_back(page, stack):
    """A Supervisor whose retry budget ran out publishes how many expired steps it held back in
    the last minute (written here as it would write it): the page says the app is saturated.
    When it is not is the health view's own logic (tests/unit/test_health.py)."""
    live = table_client(stack.settings.storage, live_table_name(stack.settings.table_name))
    budgets = TableBudgetStore(live)
    summary = page.locator("#health-summary")
    budgets.publish(HeldRetries("supervisor-e2e", 12, datetime.now(UTC)))
    expect(summary).to_contain_text("saturated: 12 expired step(s)", timeout=WAIT_MS)
    expect(summary).to_have_attribute("data-saturated", "true")
    budgets.publish(HeldRetries("supervisor-e2e", 0, datetime.now(UTC)))  # as it clears


def test_an_error_order_settled_by_hand_is_closed_then_purged(page, stack, store):
    """Last in this module: the purge takes the Closed orders of the stack."""
    settled = error_order(stack, store, PROCESSED + 2)
    page.goto(f"{stack.api_url}/api/dashboard#order={settled}")
    expect(page.locator("#timeline-state")).to_have_text("Error")
    page.click("#close-order")  # no reason given: refused, nothing changes
    expect(page.locator("#resubmit-outcome")).to_have_text("not closed: say how it was settled")
    page.fill("#close-reason", "refunded by hand")
    page.click("#close-order")
    expect(page.locator("#timeline-state")).to_have_text("Closed")
    expect(page.locator("#resubmit-box")).to_be_hidden()
    expect(page.locator("#resubmit-outcome")).to_have_text("closed: now Closed")
    closing = [(e.actor, e.detail) for e in store.get_history(settled) if e.kind == "closed"]
    assert closing == [(ACTOR, "refunded by hand")]

    # The operator's CLI, a process of its own, on the settings the stack wrote.
    summary = page.locator("#health-summary")
    page.reload()  # the health view read after the close
    expect(summary).to_contain_text("failure rate")
    rates = re.compile(r"(\d+) finished.*, (\d+) failed \(failure rate ([\d.]+)%")
    before = rates.search(summary.text_content() or "")
    settings = str(stack.devhost.log_dir.parent / "local.settings.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAS_", "SasStorage"))}
    done = subprocess.run(
        [sys.executable, "-m", "sas_cli", "--settings", settings, "purge", "--older-than", "0s",
         "--state", "Closed", "--actor", "purger", "--yes"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "purged 1 of 1" in done.stdout, done.stderr
    assert store.get_state(settled) is None
    page.reload()  # the rates are the app's own: purging what an operator closed leaves them
    expect(summary).to_contain_text("failure rate")
    after = rates.search(summary.text_content() or "")
    assert before is not None and after is not None and before.groups() == after.groups()
    page.fill("#find-order", settled)
    page.press("#find-order", "Enter")
    expect(page.locator("#find-outcome")).to_contain_text(f"order {settled}: 404")
    # The audit keeps both acts on the order the purge removed, newest first.
    acts = page.locator(f"#audit tbody tr[data-target='{settled}']")
    expect(acts).to_have_count(2)
    expect(acts.nth(0)).to_contain_text("purger")
    expect(acts.nth(0)).to_have_attribute("data-action", "purge")
    expect(acts.nth(1)).to_have_attribute("data-action", "close")
    expect(acts.nth(1)).to_contain_text(ACTOR)
    expect(acts.nth(1)).to_contain_text("refunded by hand")


def test_nothing_is_done_without_a_name_for_the_audit_trail(stack, browser, store):
    failed_order = error_order(stack, store, PROCESSED + 4)
    opened = browser.new_page()
    try:
        opened.goto(f"{stack.api_url}/api/dashboard#order={failed_order}")
        expect(opened.locator("#resubmit")).to_be_visible()
        expect(opened.locator("#actor")).to_have_value("")
        opened.click("#resubmit")
        expect(opened.locator("#resubmit-outcome")).to_contain_text("say who is acting first")
        expect(opened.locator("#actor")).to_be_focused()
        assert state_of(store, failed_order) is ProcessState.ERROR
    finally:
        opened.close()


def test_at_800_px_times_errors_and_actions_stay_in_view(stack, browser, store, failed_order):
    park_one(stack, store)
    opened = browser.new_page(viewport={"width": 800, "height": 900})
    try:
        opened.goto(f"{stack.api_url}/api/dashboard")
        expect(opened.locator("#orders tbody tr").first).to_be_visible()
        expect(opened.locator("#parked tbody tr").first).to_be_visible()
        assert opened.evaluate("document.documentElement.scrollWidth") <= 800
        for cell in (
            "#orders th:has-text('Submitted')",
            "#orders th:has-text('Updated')",
            "#orders th:has-text('Last error')",
            "#parked .replay",
            "#parked .discard",
        ):
            box = opened.locator(cell).first.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 800, cell
            # inside its scrolling table too, not hidden past its right edge
            visible = opened.locator(cell).first.evaluate(
                "n => { const s = n.closest('.scroll'); if (!s) return true;"
                " const a = n.getBoundingClientRect(), b = s.getBoundingClientRect();"
                " return a.right <= b.right + 1; }"
            )
            assert visible, cell
        opened.goto(f"{stack.api_url}/api/dashboard#order={failed_order}")  # results wrap
        expect(opened.locator("#steps tbody tr").first).to_be_visible()
        assert opened.evaluate("document.documentElement.scrollWidth") <= 800
    finally:
        opened.close()


def running_at(store: TableStateStore, order_id: str, step: str) -> bool:
    found = store.get_state(order_id)
    return (
        found is not None
        and found.value.step == step
        and found.value.process_state is ProcessState.PROCESSING
    )


def test_a_running_order_is_cancelled_from_its_timeline_and_every_effect_undone(page, stack, store):
    """Shipping answers late: the order is cancelled while ship runs; ship's late ok is
    recorded and undone with the rest, as the simulator's ledger shows."""
    slow_ship = {"per_service": {"shipping": {"slow_rate": 1.0, "slow_seconds": 12}}}
    configure_faults(stack.simulator_url, slow_ship)
    try:
        running = send(stack, 20)
        wait_until(lambda: running_at(store, running, "ship"), timeout=60, interval=0.2,
                   what="the order shipping")  # fmt: skip
        page.goto(f"{stack.api_url}/api/dashboard#order={running}")
        expect(page.locator("#timeline-state")).to_have_text("Processing")
        page.click("#cancel-order")  # no reason: refused, nothing changes
        expect(page.locator("#resubmit-outcome")).to_have_text("not cancelled: say why first")
        page.fill("#steer-reason", "the customer changed their mind")
        page.click("#cancel-order")
        expect(page.locator("#resubmit-outcome")).to_contain_text("cancelled: now ")
    finally:
        configure_faults(stack.simulator_url, {})
    expect(page.locator("#timeline-state")).to_have_text("Cancelled", timeout=WAIT_MS)
    expect(page.locator("#cancel-order")).to_be_hidden()
    expect(page.locator("#history tbody tr[data-kind='cancelled']")).to_contain_text(ACTOR)
    ledger = fetch_ledger(stack.simulator_url)
    effects = ledger["effects"]
    assert isinstance(effects, list)
    mine = {"effects": [e for e in effects if e.get("order_id") == running]}
    report = check_effects(mine, {running: ProcessState.CANCELLED}, ORDER_WORKFLOW)
    assert report.problems == [] and report.undone == 3  # reserve, charge, and ship's late ok
    acts = page.locator(f"#audit tbody tr[data-target='{running}']")
    expect(acts).to_have_attribute("data-action", "cancel")


def test_a_suspended_order_runs_nothing_new_until_it_is_resumed(page, stack, store):
    """Every call answers 4 s late: the order is suspended while reserve runs; reserve
    finishes, and charge is not claimed over three Supervisor periods; resumed, it ends
    Processed."""
    configure_faults(stack.simulator_url, {"slow_rate": 1.0, "slow_seconds": 4})
    try:
        held = send(stack, 21)
        wait_until(lambda: running_at(store, held, "reserve"), timeout=60, interval=0.2,
                   what="the order reserving")  # fmt: skip
        page.goto(f"{stack.api_url}/api/dashboard#order={held}")
        page.click("#suspend-order")
        expect(page.locator("#resubmit-outcome")).to_contain_text("suspended: now ")
    finally:
        configure_faults(stack.simulator_url, {})
    expect(page.locator("#timeline-step")).to_contain_text("charge", timeout=WAIT_MS)
    expect(page.locator("#timeline-step")).to_contain_text("suspended")
    expect(page.locator("#resume-order")).to_be_visible()
    page.wait_for_timeout(6_000)  # three Supervisor periods (every 2 s here)
    found = store.get_state(held)
    assert found is not None and found.value.process_state is ProcessState.PENDING
    kinds = [entry.kind for entry in store.get_history(held)]
    assert "claimed" in kinds and not any(k.startswith("expired") for k in kinds)
    assert [e.step for e in store.get_history(held) if e.kind == "claimed"] == ["reserve"]
    page.click("#resume-order")
    expect(page.locator("#timeline-state")).to_have_text("Processed", timeout=WAIT_MS)
    actions = page.locator(f"#audit tbody tr[data-target='{held}']")
    expect(actions).to_have_count(2)
    expect(actions.nth(0)).to_have_attribute("data-action", "resume")


def test_an_alert_is_acknowledged_and_another_clears_when_its_order_is_resubmitted(
    page, stack, store
):
    acknowledged = error_order(stack, store, 22)
    group = page.locator("#alerts tbody tr").filter(has_text=acknowledged)
    expect(group).to_be_visible(timeout=WAIT_MS)
    page.fill("#ack-note", "refunds are down: on it")
    group.locator("button.acknowledge").click()
    expect(page.locator("#alerts-outcome")).to_contain_text("acknowledged")
    expect(group).to_have_count(0)
    ack = page.locator(
        f"#audit tbody tr[data-action='acknowledge'][data-target^='{acknowledged}:']"
    )
    expect(ack.first).to_contain_text("refunds are down")
    cleared = error_order(stack, store, 23)  # same cause: a new group, of it alone
    group = page.locator("#alerts tbody tr").filter(has_text=cleared)
    expect(group).to_be_visible(timeout=WAIT_MS)
    configure_faults(stack.simulator_url, {})  # the refunds work again
    page.goto(f"{stack.api_url}/api/dashboard#order={cleared}")
    page.click("#resubmit")
    expect(page.locator("#timeline-state")).to_have_text("Compensated", timeout=WAIT_MS)
    expect(page.locator("#alerts tbody tr").filter(has_text=cleared)).to_have_count(0)
