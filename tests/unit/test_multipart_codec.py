"""The transaction codec (sas/adapters/multipart.py) writes exactly the SDK's bytes and reads
only what it recognises exactly; real responses are compared in
tests/integration/test_transactions_without_pools.py."""

from __future__ import annotations

import pytest
from azure.core.rest import HttpRequest

from sas.adapters import multipart

pytestmark = pytest.mark.unit

URL = "http://127.0.0.1:10002/devstoreaccount1/orders"


def _transaction(parts: list[HttpRequest]) -> HttpRequest:
    changeset = HttpRequest("POST", "")
    changeset.set_multipart_mixed(*parts, boundary="changeset_5b0e6c1d-0f8a-4c55-9d39-0a9c0f0e1a2b")
    request = HttpRequest(
        "POST", f"{URL.rsplit('/', 1)[0]}/$batch", headers={"x-ms-version": "2019-02-02"}
    )
    request.set_multipart_mixed(changeset, enforce_https=False, boundary="batch_0c9b2f1e-71d8")
    return request


def _update(row: str, body: bytes) -> HttpRequest:
    return HttpRequest(
        "PATCH",
        f"{URL}(PartitionKey='order-{row}',RowKey='{row}')",
        headers={
            "If-Match": "W/\"datetime'2026-11-23T12%3A00%3A00.1234567Z'\"",
            "Content-Type": "application/json;odata=nometadata",
        },
        content=body,
    )


SHAPES = {
    "one update": lambda: [_update("state", b'{"ProcessState": "Running", "Attempt": 2}')],
    "insert, update, delete": lambda: [
        HttpRequest(
            "POST", URL, headers={"Prefer": "return-no-content"}, content=b'{"RowKey": "h-1"}'
        ),
        _update("state", b"{}"),
        HttpRequest("DELETE", f"{URL}(PartitionKey='o',RowKey='x')", headers={"If-Match": "*"}),
    ],
    "escaped text": lambda: [_update("s", b'{"Detail": "\\u00e9\\u20ac \\"quoted\\" \\r\\n end"}')],
    "a hundred operations": lambda: [_update(f"r{n:03d}", b'{"N": %d}' % n) for n in range(100)],
    "a long line": lambda: [_update("long", b'{"Detail": "' + b"x" * 5000 + b'"}')],
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_writer_writes_the_sdks_bytes(shape: str) -> None:
    ours, theirs = _transaction(SHAPES[shape]()), _transaction(SHAPES[shape]())
    assert multipart.multipart_body(ours) == multipart._sdk_body(theirs)
    assert ours.content == theirs.content
    assert ours.headers == theirs.headers


def test_a_request_without_a_boundary_is_left_to_the_sdk() -> None:
    request = HttpRequest("POST", URL)
    request.set_multipart_mixed(_update("s", b"{}"), enforce_https=False)
    assert multipart.multipart_body(request) == 1
    assert request.headers["Content-Type"].startswith("multipart/mixed; boundary=")


BODY = (
    b"--b\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n"
    b'HTTP/1.1 204 No Content\r\nETag: W/"1"\r\n\r\n\r\n--b--\r\n'
)


def test_the_reader_splits_a_crlf_body_into_its_parts() -> None:
    assert multipart._split(BODY, "b") == [
        ("application/http", b'HTTP/1.1 204 No Content\r\nETag: W/"1"\r\n\r\n')
    ]
    assert multipart._boundary('multipart/mixed; boundary="batch_1"') == "batch_1"


@pytest.mark.parametrize(
    "body",
    [
        BODY.replace(b"\r\n", b"\n"),  # another line ending
        BODY.replace(b"--b--", b"--c--"),  # no closing delimiter
        b"preamble\r\n" + BODY,  # something before the first delimiter
        BODY.replace(
            b"Content-Type: application/http\r\n", b"Content-Type: application/http\r\n folded\r\n"
        ),
        BODY.replace(b"Content-Type: application/http\r\n", b""),  # no content type
        BODY.replace(b"binary", b"base64"),  # an encoded part: the SDK decodes it
        BODY.replace(b"application/http", "applicätion/http".encode()),  # not ASCII
    ],
)
def test_the_reader_leaves_anything_else_to_the_sdk(body: bytes) -> None:
    with pytest.raises(multipart._Unrecognised):
        multipart._split(body, "b")
