"""The app's HTTP session sends what requests' own ``Session.request`` would send, for every
shape of call azure-core's transport makes, and hands anything else to requests.

Both sessions send through an adapter that records the prepared request and the send options
and answers with a canned response: this compares two request-building paths of one library,
nothing of Azure Storage is imitated (the integration tests send everything through this session
to Azurite)."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter

from sas.adapters.clients import SdkSession, http_session, pooled_session

pytestmark = pytest.mark.unit


class RecordingAdapter(BaseAdapter):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[requests.PreparedRequest, dict[str, Any]]] = []

    def send(self, request: requests.PreparedRequest, **options: Any) -> requests.Response:  # type: ignore[override]
        self.sent.append((request, options))
        response = requests.Response()
        response.status_code = 201
        response._content = b"<ok/>"
        response.headers["Set-Cookie"] = "affinity=1; Path=/"
        response.request = request
        response.url = request.url or ""
        return response

    def close(self) -> None:
        pass


def _session(cls: type[requests.Session]) -> tuple[requests.Session, RecordingAdapter]:
    session = cls()
    session.trust_env = False
    adapter = RecordingAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session, adapter


def _seen(prepared: requests.PreparedRequest, options: dict[str, Any]) -> dict[str, Any]:
    return {
        "method": prepared.method,
        "url": prepared.url,
        "headers": dict(prepared.headers),
        "body": prepared.body,
        "options": options,
    }


def _not_this_path(*_: Any, **__: Any) -> None:
    raise AssertionError("requests' own path was taken")


AZURE_CALLS = [
    pytest.param(
        {
            "method": "PUT",
            "url": "http://127.0.0.1:10002/devstoreaccount1/Tables(PartitionKey='a',RowKey='b')"
            "?$format=application%2Fjson%3Bodata%3Dminimalmetadata",
            "headers": {
                "x-ms-version": "2019-02-02",
                "If-Match": "W/\"datetime'2026-11-23T10%3A00%3A00Z'\"",
                "Content-Type": "application/json",
                "Authorization": "SharedKey devstoreaccount1:abc=",
            },
            "data": '{"PartitionKey": "a", "RowKey": "b", "Note": "caf\u00e9"}',
        },
        id="table update, str body with non-ASCII",
    ),
    pytest.param(
        {
            "method": "post",
            "url": "https://account.table.core.windows.net/$batch",
            "headers": {"Content-Type": "multipart/mixed; boundary=batch_1", "Drop": None},
            "data": b"--batch_1\r\nContent-Type: application/http\r\n\r\n--batch_1--\r\n",
        },
        id="transaction, bytes body, lower-case method, a header set to None",
    ),
    pytest.param(
        {
            "method": "GET",
            "url": "http://127.0.0.1:10001/devstoreaccount1/orders/messages?numofmessages=16"
            "&visibilitytimeout=300",
            "headers": {"Accept": "application/xml", "User-Agent": "azsdk-python-storage-queue"},
            "data": None,
            "stream": True,
        },
        id="queue receive, no body, streamed",
    ),
    pytest.param(
        {
            "method": "DELETE",
            "url": "http://127.0.0.1:10001/devstoreaccount1/orders/messages/1?popreceipt=a%2Bb",
            "headers": {},
            "data": None,
            "proxies": {"http": "http://proxy.invalid:3128", "https": None},
        },
        id="queue delete through a proxy",
    ),
]


@pytest.mark.parametrize("call", AZURE_CALLS)
def test_the_request_on_the_wire_is_the_one_requests_would_send(
    call: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    for cls in (requests.Session, SdkSession):
        session, adapter = _session(cls)
        session.headers["Accept-Encoding"] = None  # type: ignore[assignment]  # requests drops it
        if cls is SdkSession:  # and it does not get there by requests' own path
            monkeypatch.setattr(requests.Session, "prepare_request", _not_this_path)
        response = session.request(
            call["method"],
            call["url"],
            headers=call["headers"],
            data=call["data"],
            files=None,
            verify=True,
            timeout=(3, 7),
            cert=None,
            allow_redirects=False,
            proxies=call.get("proxies"),
            stream=call.get("stream", False),
        )
        assert response.status_code == 201 and response.content == b"<ok/>"
        ((prepared, options),) = adapter.sent
        seen.append(_seen(prepared, options))
    assert seen[1] == seen[0]


def test_anything_the_sdk_does_not_use_takes_requests_own_path() -> None:
    session, adapter = _session(SdkSession)
    called: list[str] = []
    session.request("GET", "http://127.0.0.1/a", params={"q": "1"}, allow_redirects=False)
    session.request("GET", "http://127.0.0.1/b", cookies={"c": "1"}, allow_redirects=False)
    session.request(
        "GET",
        "http://127.0.0.1/c",
        hooks={"response": lambda r, **_: called.append(r.url)},
        allow_redirects=False,
    )
    session.request("GET", "http://127.0.0.1/d")  # redirects followed: requests' path
    (first, _), (second, _), _, (fourth, options) = adapter.sent
    assert first.url == "http://127.0.0.1/a?q=1"
    assert second.headers["Cookie"] == "c=1"
    assert called == ["http://127.0.0.1/c"]
    assert fourth.url == "http://127.0.0.1/d" and options["verify"] is True


def test_the_lean_path_reads_the_body_and_times_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    session, adapter = _session(SdkSession)
    monkeypatch.setattr(requests.Session, "prepare_request", _not_this_path)
    response = session.request("GET", "http://127.0.0.1/a", allow_redirects=False)
    assert len(adapter.sent) == 1
    assert getattr(response, "_content_consumed")  # noqa: B009  # the connection goes back to the pool
    assert response.elapsed.total_seconds() >= 0


def test_the_app_sends_through_it() -> None:
    assert isinstance(pooled_session(), SdkSession)
    assert isinstance(http_session(), SdkSession)


@pytest.mark.parametrize("cls", [requests.Session, SdkSession])
def test_the_sessions_own_response_hooks_run_on_the_lean_path(
    cls: type[requests.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dev host watches the app's sends with a session hook (sas_local/devhost/watcher.py):
    the hook sees the response, and the options it was sent with, as requests' own path gives
    them, and the lean path stays lean."""
    session, adapter = _session(cls)
    seen: list[tuple[str, str, dict[str, Any]]] = []
    session.hooks["response"].append(
        lambda r, **options: seen.append((r.request.method, r.url, options))
    )
    if cls is SdkSession:
        monkeypatch.setattr(requests.Session, "prepare_request", _not_this_path)
    session.request(
        "POST", "http://127.0.0.1/q/messages", data=b"<m/>", timeout=(3, 7), allow_redirects=False
    )
    ((_, options),) = adapter.sent
    assert seen == [("POST", "http://127.0.0.1/q/messages", options)]
