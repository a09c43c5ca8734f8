"""Bad input (I8) and liveness, found by a hostile review.

A remote answer of a few hundred bytes, nested 200+ deep, is well
under MAX_RESULT_BYTES and parses with json, but the reply built from it either cannot be
encoded (the agent raises -> retries -> poison) or cannot be decoded (on_reply parks a valid
reply of the current attempt, so the order can never advance past that step)."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from azure.storage.queue import QueueServiceClient

from sas import bootstrap, settings
from sas.adapters.remote_http import HttpRemoteService
from sas.domain.model import ProcessState
from tests.integration.test_bad_input import VALID_ORDER
from tests.integration.test_hostile_queue_escapes import run

pytestmark = pytest.mark.integration


def take(azurite, setting: str) -> list[bytes]:
    name = bootstrap.settings().queues[setting]
    client = QueueServiceClient.from_connection_string(azurite.connection_string).get_queue_client(
        name
    )
    out = []
    for message in client.receive_messages(max_messages=32):
        out.append(base64.b64decode(message.content))
        client.delete_message(message)
    return out


def drive_to_reply(azurite, monkeypatch, depth: int) -> None:
    answer = {"reservation": json.loads("[" * depth + "]" * depth)}
    assert len(json.dumps(answer)) < 8 * 1024  # far below MAX_RESULT_BYTES
    monkeypatch.setattr(HttpRemoteService, "perform", lambda self, *a, **k: answer)
    run("submit", json.dumps(VALID_ORDER).encode())  # claims and dispatches the first step
    (request,) = take(azurite, settings.agent_queue_setting("inventory"))
    run("agent_inventory", request)  # must return normally


@pytest.mark.parametrize("depth", [300])
def test_a_deeply_nested_remote_answer_does_not_crash_the_agent(
    app_env, table, azurite, monkeypatch, depth
):
    drive_to_reply(azurite, monkeypatch, depth)


@pytest.mark.parametrize("depth", [220])
def test_a_deeply_nested_remote_answer_is_applied_not_parked(
    app_env, table, azurite, monkeypatch, depth
):
    drive_to_reply(azurite, monkeypatch, depth)
    (reply,) = take(azurite, settings.QUEUE_REPLIES)
    run("on_reply", reply)
    assert bootstrap.store().list_parked() == []  # a current, genuine reply was parked
    found = bootstrap.store().get_state("o1")
    assert found is not None
    state = found.value
    assert state.process_state is ProcessState.PROCESSING and state.step_index == 1


def http_remote(status: int, text: str):
    """The real HttpRemoteService over a provider that answers ``text`` with ``status``."""

    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status, content=text.encode(), headers={"content-type": "application/json"}
        )

    client = httpx.Client(transport=httpx.MockTransport(respond))
    return HttpRemoteService(bootstrap.settings().remote_urls, client=client)


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (200, '{"reservation": "a\\ud800b"}'),  # a lone-surrogate escape: json.loads accepts it
        (422, '{"detail": "out of stock \\ud800"}'),  # the same in a refusal's detail
    ],
)
def test_a_remote_answer_with_a_lone_surrogate_does_not_crash_the_agent(
    app_env, table, azurite, monkeypatch, status, text
):
    monkeypatch.setattr(bootstrap, "_remote", lambda: http_remote(status, text))
    bootstrap.reset()
    from sas_local.provision import provision

    provision(bootstrap.settings())
    run("submit", json.dumps(VALID_ORDER).encode())  # claims and dispatches the first step
    (request,) = take(azurite, settings.agent_queue_setting("inventory"))
    run("agent_inventory", request)  # must return normally
