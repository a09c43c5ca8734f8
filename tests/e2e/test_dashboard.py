"""The operators' dashboard in headless Chromium (Debian's package, driven by Playwright)
against the dev host: its numbers match the store, an Error order's timeline shows, and
Resubmit (once the cause is fixed) lets the order finish."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from azure.storage.queue import TextBase64EncodePolicy
from playwright.sync_api import Browser, Page, expect, sync_playwright

from sas.adapters.clients import queue_service_client
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.model import ProcessState
from sas.domain.wire import submission_message_id
from sas.services import telemetry
from sas.settings import QUEUE_ORDERS
from sas_local.browser import launch
from sas_local.demo import demo_order
from sas_local.devhost.worker import PRELOAD_ENV
from sas_local.ledger import configure_faults
from sas_local.processes import wait_until
from sas_local.span_capture import CAPTURE_DIR_ENV
from sas_local.stack import LocalStack

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
    # Traced as `make run` is (each worker records its spans), so orders carry a trace id.
    spans = tmp_path_factory.mktemp("spans")
    traced = {PRELOAD_ENV: "sas_local.span_capture", CAPTURE_DIR_ENV: str(spans)}
    logs = tmp_path_factory.mktemp("stack")
    with LocalStack.start(layout="flex", workers=1, log_dir=logs, env_overrides=traced) as running:
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


@pytest.fixture(scope="module")
def failed_order(stack, store) -> str:
    """PROCESSED orders Processed, one in Error (its alert sent), one bad message parked by the
    app."""
    transport = StorageQueueTransport(queue_service_client(stack.settings.storage))

    def send(index: int) -> str:
        order = demo_order(index, "dash")
        transport.send(
            stack.settings.lane(QUEUE_ORDERS, order.priority),
            order,
            message_id=submission_message_id(order.order_id),
            correlation_id=order.order_id,
        )
        return order.order_id

    good = [send(i) for i in range(PROCESSED)]
    wait_until(
        lambda: all(state_of(store, oid) is ProcessState.PROCESSED for oid in good),
        timeout=90,
        interval=0.3,
        what=f"{PROCESSED} orders Processed",
    )
    configure_faults(stack.simulator_url, REFUSE_SHIP_AND_REFUND)
    failed = send(PROCESSED)
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
    orders_queue = queue_service_client(stack.settings.storage).get_queue_client(
        stack.settings.lane(QUEUE_ORDERS, "normal"),
        message_encode_policy=TextBase64EncodePolicy(),
    )
    orders_queue.send_message("this is not an order")
    wait_until(lambda: store.list_parked(10), timeout=30, interval=0.3, what="a parked message")
    return failed


@pytest.fixture
def page(stack, browser, failed_order) -> Iterator[Page]:
    opened = browser.new_page()
    opened.goto(f"{stack.api_url}/api/dashboard")
    expect(opened.locator("#updated-at")).not_to_have_attribute("data-refreshes", "0")
    yield opened
    opened.close()


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
        expect(entry).to_contain_text("dashboard")
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
    opened = browser.new_page()
    try:
        opened.goto(f"{stack.api_url}/api/dashboard#order={failed_order}")
        expect(opened.locator("#timeline-order")).to_have_text(failed_order)
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
