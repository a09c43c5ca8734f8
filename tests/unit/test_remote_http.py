import logging

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sas.adapters.remote_http import MAX_RETRY_AFTER, HttpRemoteService, quiet_request_log
from sas.domain.errors import PermanentRemoteError, TransientRemoteError

pytestmark = pytest.mark.unit


def remote(status: int, headers: dict[str, str] | None = None, body: object = None):
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Idempotency-Key"] == "o1:charge"
        return httpx.Response(status, headers=headers, json=body if body is not None else {})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    return HttpRemoteService({"payment": "http://remote/payment"}, client)


def call(service: HttpRemoteService):
    return service.perform("payment", "charge", idempotency_key="o1:charge", payload={}, timeout=1)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("3", 3.0), ("-5", 0.0), ("inf", None), ("nan", None), ("1e12", MAX_RETRY_AFTER),
     ("Wed, 21 Oct 2026 07:28:00 GMT", None)],
)  # fmt: skip
def test_retry_after_is_finite_and_bounded(value, expected):
    with pytest.raises(TransientRemoteError) as raised:
        call(remote(429, {"Retry-After": value}))
    assert raised.value.retry_after == expected


@pytest.mark.parametrize("status", [408, 425, 429, 500, 503])
def test_transient_statuses(status):
    with pytest.raises(TransientRemoteError):
        call(remote(status))


@pytest.mark.parametrize("status", [400, 402, 404, 409, 422])
def test_business_refusals_are_permanent(status):
    with pytest.raises(PermanentRemoteError):
        call(remote(status, body={"detail": "card declined"}))


def test_a_reply_that_is_not_an_object_is_transient():
    with pytest.raises(TransientRemoteError):
        call(remote(200, body=[1, 2]))


def test_success_returns_the_body():
    assert call(remote(200, body={"effect_id": "e1"})) == {"effect_id": "e1"}


def raw_remote(status: int, content: bytes) -> HttpRemoteService:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=content)

    return HttpRemoteService(
        {"payment": "http://remote/payment"}, httpx.Client(transport=httpx.MockTransport(handler))
    )


@pytest.mark.parametrize("status", [200, 402])
def test_an_answer_nested_deeper_than_json_parses_is_classified_not_raised(status):
    """A deeply nested body raised RecursionError out of the agent: the host then retried
    the message until it was poisoned."""
    deep = b"[" * 100_000 + b"]" * 100_000
    if status == 200:
        with pytest.raises(TransientRemoteError, match="not JSON"):
            call(raw_remote(status, deep))
    else:
        with pytest.raises(PermanentRemoteError):
            call(raw_remote(status, deep))


@settings(max_examples=200, deadline=None)
@given(status=st.sampled_from([200, 201, 400, 402, 409, 429, 500]), content=st.binary())
def test_any_answer_is_a_result_or_a_classified_error(status, content):
    try:
        result = call(raw_remote(status, content))
    except (TransientRemoteError, PermanentRemoteError):
        return
    assert isinstance(result, dict)


@pytest.fixture
def httpx_log():
    logger = logging.getLogger("httpx")
    level = logger.level
    yield logger
    logger.setLevel(level)


def test_httpx_does_not_log_each_remote_call(httpx_log, caplog):
    httpx_log.setLevel(logging.NOTSET)
    quiet_request_log()
    with caplog.at_level(logging.INFO):
        call(remote(200, body={"ok": True}))
    assert not [r for r in caplog.records if r.name.startswith("httpx")]


def test_a_level_set_for_httpx_on_purpose_is_kept(httpx_log):
    httpx_log.setLevel(logging.DEBUG)
    quiet_request_log()
    assert httpx_log.level == logging.DEBUG
