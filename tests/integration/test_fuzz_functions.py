"""Fuzzing the real queue function bodies on Azurite: given any body, each function returns
normally (so the message is settled, no retry storm) and either processes the message or
parks it in ``~rejected`` with the parser's reason, writing nothing else.

The bodies are those of tests/unit/test_fuzz_parsers.py: arbitrary bytes, arbitrary JSON,
mutated valid messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from azure.data.tables import TableClient
from azure.functions.queue import QueueMessage
from hypothesis import HealthCheck, given, settings

from sas.domain.errors import InvalidMessage
from sas.domain.messages import (
    Message,
    OrderSubmitted,
    ScheduleRequest,
    StepReply,
    StepRequest,
    decode,
)
from sas.domain.wire import PRIORITIES, REJECTED_PARTITION, lane_function_name
from sas.settings import AGENTS
from tests.unit.test_fuzz_parsers import bodies

pytestmark = pytest.mark.integration

NORMAL_LANES: dict[str, type[Message]] = {
    "submit": OrderSubmitted,
    "schedule": ScheduleRequest,
    "on_reply": StepReply,
    **{f"agent_{agent}": StepRequest for agent in AGENTS},
}
FUNCTIONS: dict[str, type[Message]] = {
    lane_function_name(name, priority): model
    for name, model in NORMAL_LANES.items()
    for priority in PRIORITIES
}


def user_function(name: str) -> Callable[[QueueMessage], None]:
    from sas.entrypoints import queues

    for builder in queues.blueprint._function_builders:
        if builder._function.get_function_name() == name:
            function: Callable[[QueueMessage], None] = builder._function.get_user_function()
            return function
    raise LookupError(name)


def test_every_queue_function_is_fuzzed() -> None:
    from sas.entrypoints import queues

    names = {b._function.get_function_name() for b in queues.blueprint._function_builders}
    assert names == set(FUNCTIONS)


def rows(table: TableClient) -> tuple[list[dict[str, Any]], set[tuple[str, str, Any]]]:
    """The parked rows, and every other row (keys and ETag, to see any write)."""
    parked: list[dict[str, Any]] = []
    others: set[tuple[str, str, Any]] = set()
    for entity in table.list_entities():
        if entity["PartitionKey"] == REJECTED_PARTITION:
            parked.append(dict(entity))
        else:
            others.add((entity["PartitionKey"], entity["RowKey"], entity.metadata["etag"]))
    return parked, others


@pytest.mark.parametrize("function", sorted(FUNCTIONS))
def test_any_body_is_processed_or_parked_never_raised(
    app_env: None, table: TableClient, function: str
) -> None:
    model = FUNCTIONS[function]
    run = user_function(function)

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(body=bodies(model))
    def check(body: bytes) -> None:
        parked_before, others_before = rows(table)
        run(QueueMessage(id="m1", body=body, dequeue_count=1))  # returns: the message is settled
        parked_after, others_after = rows(table)
        try:
            decode(model, body)
        except InvalidMessage as exc:
            seen = {row["RowKey"] for row in parked_before}
            new = [row for row in parked_after if row["RowKey"] not in seen]
            assert len(new) == 1 and new[0]["Reason"] == exc.reason, new
            assert new[0]["BodyLength"] == len(body)
            assert others_after == others_before  # nothing else written
            return
        # Valid: processed (an unknown order is parked too, by the service, not the parser).
        assert len(parked_after) - len(parked_before) in (0, 1)

    check()
