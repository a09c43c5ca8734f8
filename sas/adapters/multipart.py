"""Entity-group transactions without a thread pool per request.

azure-core runs the per-part policies of a multipart/mixed request (a Tables transaction) on a
new ``ThreadPoolExecutor``, once to prepare the changeset's parts and once to read the
response's parts: for one order transition of 3-4 entities that is three pools and up to nine
short-lived threads, per request, to run a policy that sets two headers. Under load a profile of
the dev host showed a fifth of its busy samples starting those threads. :func:`install`
replaces the two helpers with versions that run the same policies, in the same order per part,
on the calling thread. The error handling stays the SDK's.

It only replaces code it recognises: the helpers must exist and be azure-core's own (whose
source starts the pool); otherwise the SDK's behaviour is kept and one warning is logged.

The same goes for the multipart codec: azure-core writes a transaction's body and reads its
response with the ``email`` package (a MIME message built, flattened and parsed again for every
request), which a profile of the dev host under a burst put at a seventh of its CPU.
:func:`multipart_body` and :func:`raw_parts` write and read the same bytes directly. The writer is
checked against the SDK's own on a sample transaction when it is installed (it is only installed
if the bytes are identical); the reader hands any body it does not recognise exactly (another
line ending, a missing delimiter, a part that is not ``application/http`` or a changeset) to the
SDK's parser.
"""

from __future__ import annotations

import logging
import threading
from http.client import HTTPResponse
from typing import Any

from azure.core.pipeline import PipelineContext, PipelineRequest, PipelineResponse
from azure.core.pipeline._base import Pipeline
from azure.core.pipeline._tools import await_result
from azure.core.rest import HttpRequest, _helpers, _http_response_impl
from azure.core.utils._pipeline_transport_rest_shared import BytesIOSocket

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_installed: bool | None = None


def prepare_parts_in_order(request: Any) -> None:
    """``Pipeline._prepare_multipart_mixed_request``, one part after another."""
    info = request.multipart_mixed_info
    if not info:
        return
    parts, policies, options = info[0], info[1], info[3]
    for part in parts:
        if part.multipart_mixed_info:  # a changeset inside the batch
            prepare_parts_in_order(part)
        pipeline_request = PipelineRequest(part, PipelineContext(None, **options))
        for policy in policies:
            await_result(policy.on_request, pipeline_request)


def parts_in_order(response: Any) -> list[Any]:
    """``_parts_helper`` (the response's parts, through the per-part policies), in order."""
    if not response.content_type or not response.content_type.startswith("multipart/mixed"):
        raise ValueError("You can't get parts if the response is not multipart/mixed")
    parts: list[Any] = response._get_raw_parts()
    info = response.request.multipart_mixed_info
    if info:
        for part in parts:
            context = PipelineContext(None)
            pipeline_request = PipelineRequest(part.request, context)
            pipeline_response = PipelineResponse(part.request, part, context=context)
            for policy in info[1]:
                await_result(policy.on_response, pipeline_request, pipeline_response)
    return parts


CRLF = b"\r\n"


class _Unrecognised(ValueError):
    """A multipart body this module does not read exactly as the SDK would: the SDK reads it."""


def multipart_body(request: Any, content_index: int = 0) -> int:
    """``_prepare_multipart_body_helper`` without the email package: the request's parts, each
    framed by its boundary, as the SDK's MIME flattening writes them. Returns the next index."""
    info = request.multipart_mixed_info
    if not info:
        return 0
    parts, boundary = info[0], info[2]
    if not boundary:  # the SDK invents one: leave that to it
        return int(_sdk_body(request, content_index))
    out: list[bytes] = []
    for part in parts:
        if part.multipart_mixed_info:  # a changeset: its own body first, then framed here
            content_index = part.prepare_multipart_body(content_index=content_index)
            head = b"Content-Type: " + part.headers["Content-Type"].encode("ascii") + CRLF
            payload = part.serialize()
            payload = payload[payload.index(b"--") :]
        else:
            head = (
                b"Content-Type: application/http\r\n"
                b"Content-Transfer-Encoding: binary\r\n"
                b"Content-ID: " + str(content_index).encode("ascii") + CRLF
            )
            payload = part.serialize()
            content_index += 1
        out += (b"--", boundary.encode("ascii"), CRLF, head, CRLF, payload, CRLF)
    out += (b"--", boundary.encode("ascii"), b"--", CRLF)
    request.set_bytes_body(b"".join(out))
    request.headers["Content-Type"] = "multipart/mixed; boundary=" + boundary
    return content_index


def raw_parts(response: Any, http_response_type: Any = None) -> list[Any]:
    """``_get_raw_parts_helper`` without the email package: one response per request part, in
    order, each parsed by http.client as the SDK does; anything unexpected goes to the SDK."""
    response_type = http_response_type or _http_response_impl.RestHttpClientTransportResponse
    try:
        body = response.body()
        boundary = _boundary(response.content_type)
        return _responses(body, boundary, response.request.multipart_mixed_info[0], response_type)
    except _Unrecognised:
        return list(_sdk_raw_parts(response, http_response_type))


def _responses(body: bytes, boundary: str, requests: Any, response_type: Any) -> list[Any]:
    found: list[Any] = []
    for index, (content_type, payload) in enumerate(_split(body, boundary)):
        media = content_type.split(";", 1)[0].strip().lower()
        if media == "application/http":
            if index >= len(requests):  # more answers than requests: the SDK decides
                raise _Unrecognised("an answer without its request")
            request = requests[index]
            socket = BytesIOSocket(payload)  # type: ignore[no-untyped-call]
            internal = HTTPResponse(socket, method=request.method)  # type: ignore[arg-type]
            internal.begin()
            found.append(response_type(request=request, internal_response=internal))
        elif (
            media == "multipart/mixed"
            and index < len(requests)
            and requests[index].multipart_mixed_info
        ):
            changeset = requests[index].multipart_mixed_info[0]
            found += _responses(payload, _boundary(content_type), changeset, response_type)
        else:
            raise _Unrecognised(media)
    return found


def _split(body: bytes, boundary: str) -> list[tuple[str, bytes]]:
    """(content type, payload) of each part of a CRLF-delimited multipart body."""
    delimiter = b"--" + boundary.encode("ascii")
    if not body.startswith(delimiter + CRLF):
        raise _Unrecognised("no opening delimiter")
    end = body.find(CRLF + delimiter + b"--")
    if end < 0:
        raise _Unrecognised("no closing delimiter")
    parts: list[tuple[str, bytes]] = []
    for chunk in body[len(delimiter) + 2 : end].split(CRLF + delimiter + CRLF):
        head, blank, payload = chunk.partition(CRLF + CRLF)
        if not blank:
            raise _Unrecognised("a part without headers")
        content_type = None
        for line in head.split(CRLF):
            name, colon, value = line.partition(b":")
            if not colon or name[:1] in (b" ", b"\t") or b"\n" in line or b"\r" in line:
                raise _Unrecognised("a header line")
            header = name.strip().lower()
            if header == b"content-type":
                try:
                    content_type = value.strip().decode("ascii")
                except UnicodeDecodeError:
                    raise _Unrecognised("a content type") from None
            elif header == b"content-transfer-encoding" and value.strip().lower() not in (
                b"binary",
                b"7bit",
                b"8bit",
            ):
                raise _Unrecognised("an encoded part")  # the SDK decodes it
        if content_type is None:
            raise _Unrecognised("a part without a content type")
        parts.append((content_type, payload))
    return parts


def _boundary(content_type: str | None) -> str:
    for parameter in (content_type or "").split(";")[1:]:
        name, _, value = parameter.strip().partition("=")
        if name.lower() == "boundary" and value:
            return value.strip('"')
    raise _Unrecognised("no boundary")


# The SDK's codec, kept for what this module does not handle (looked up by name: private).
_WRITER, _READER = "_prepare_multipart_body_helper", "_get_raw_parts_helper"
_sdk_body = vars(_helpers)[_WRITER]
_sdk_raw_parts = vars(_http_response_impl)[_READER]


def _same_body_as_the_sdk() -> bool:
    """Whether :func:`multipart_body` writes what the SDK writes, on a sample transaction."""

    def sample() -> HttpRequest:
        top = HttpRequest("GET", "http://127.0.0.1:10002/devstoreaccount1/t()")
        parts = [
            HttpRequest(
                "PATCH",
                "http://127.0.0.1:10002/devstoreaccount1/t(PartitionKey='o',RowKey='state')",
                headers={"If-Match": "W/\"datetime'2026'\"", "Content-Type": "application/json"},
                content=b'{"PartitionKey": "o", "Text": "\\u00e9\\n"}',
            ),
            HttpRequest("DELETE", "http://127.0.0.1:10002/devstoreaccount1/t(PartitionKey='o')"),
        ]
        changeset = HttpRequest("POST", "")
        changeset.set_multipart_mixed(*parts, boundary="changeset_sample")
        request = HttpRequest("POST", "http://127.0.0.1:10002/devstoreaccount1/$batch")
        request.set_multipart_mixed(top, changeset, enforce_https=False, boundary="batch_sample")
        return request

    ours, theirs = sample(), sample()
    installed = vars(_helpers)[_WRITER]
    try:  # the changeset's body is written through the module's helper: each side its own
        vars(_helpers)[_WRITER] = _sdk_body
        _sdk_body(theirs)
        vars(_helpers)[_WRITER] = multipart_body
        multipart_body(ours)
    finally:
        vars(_helpers)[_WRITER] = installed
    return bool(ours.content == theirs.content and ours.headers == theirs.headers)


def _install_codec() -> bool:
    if vars(_helpers)[_WRITER] is multipart_body:
        return True
    try:
        same = _same_body_as_the_sdk()
    except Exception:  # the SDK's request API moved: keep its codec
        same = False
    if not same:
        logger.warning(
            "sas.sdk_multipart_codec_kept: azure-core writes transactions differently than "
            "expected; its email-based codec is kept"
        )
        return False
    vars(_helpers)[_WRITER] = multipart_body
    vars(_http_response_impl)[_READER] = raw_parts
    return True


def _starts_a_pool(function: Any) -> bool:
    """Whether ``function`` is the SDK helper this module replaces (it names the executor)."""
    code = getattr(function, "__code__", None)
    return code is not None and "ThreadPoolExecutor" in code.co_names


def install() -> bool:
    """Replace the SDK's helpers once per process; False when some were not recognised (those
    are kept, with one warning each)."""
    global _installed
    with _lock:
        if _installed is None:
            _installed = _install_pool_free_parts() & _install_codec()
        return _installed


def _install_pool_free_parts() -> bool:
    prepare = Pipeline.__dict__.get("_prepare_multipart_mixed_request")
    parts = getattr(_http_response_impl, "_parts_helper", None)
    if prepare is not None and prepare.__func__ is prepare_parts_in_order:
        return True
    if not (
        isinstance(prepare, staticmethod)
        and _starts_a_pool(prepare.__func__)
        and _starts_a_pool(parts)
    ):
        logger.warning(
            "sas.sdk_multipart_kept: azure-core's multipart helpers are not the expected "
            "ones; transactions keep the SDK's thread pools"
        )
        return False
    Pipeline._prepare_multipart_mixed_request = staticmethod(prepare_parts_in_order)  # type: ignore[method-assign]
    _http_response_impl._parts_helper = parts_in_order  # type: ignore[attr-defined,assignment]
    return True
