"""Entity-group transactions without a thread pool per request.

azure-core runs the per-part policies of a multipart/mixed request (a Tables transaction) on a
new ``ThreadPoolExecutor``, once to prepare the changeset's parts and once to read the
response's parts: for one order transition of 3-4 entities that is three pools and up to nine
short-lived threads, per request, to run a policy that sets two headers. Under load a profile of
the dev host showed a fifth of its busy samples starting those threads. :func:`install`
replaces the two helpers with versions that run the same policies, in the same order per part,
on the calling thread. Nothing else changes: the body, the headers and the error handling stay
the SDK's.

It only replaces code it recognises: the helpers must exist and be azure-core's own (whose
source starts the pool); otherwise the SDK's behaviour is kept and one warning is logged.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from azure.core.pipeline import PipelineContext, PipelineRequest, PipelineResponse
from azure.core.pipeline._base import Pipeline
from azure.core.pipeline._tools import await_result
from azure.core.rest import _http_response_impl

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_installed = False


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


def _starts_a_pool(function: Any) -> bool:
    """Whether ``function`` is the SDK helper this module replaces (it names the executor)."""
    code = getattr(function, "__code__", None)
    return code is not None and "ThreadPoolExecutor" in code.co_names


def install() -> bool:
    """Replace the SDK's two helpers once per process; False when they were not recognised."""
    global _installed
    with _lock:
        if _installed:
            return True
        prepare = Pipeline.__dict__.get("_prepare_multipart_mixed_request")
        parts = getattr(_http_response_impl, "_parts_helper", None)
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
        _installed = True
        return True
