"""The state machine of tests/unit/test_stateful.py, over the real Table store on Azurite:
ETags, entity-group transactions, key encoding and the in-flight index as Table Storage
implements them. Fewer, shorter runs (every step is a few HTTP round trips); each run gets
a table of its own, dropped at its teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from azure.data.tables import TableServiceClient
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from sas.adapters.table_store import TableStateStore
from sas.domain.wire import live_table_name
from sas.services.ports import StateStore
from sas_local.azurite import Azurite
from tests.unit.test_stateful import SasMachine

pytestmark = pytest.mark.integration


def test_the_pattern_keeps_its_invariants_on_table_storage(azurite: Azurite) -> None:
    service = TableServiceClient.from_connection_string(azurite.connection_string)

    def fresh_table() -> tuple[StateStore, Callable[[], None]]:
        name = f"t{uuid.uuid4().hex[:16]}"
        client = service.create_table(name)
        live = service.create_table(live_table_name(name))

        def drop() -> None:
            service.delete_table(name)
            service.delete_table(live.table_name)

        return TableStateStore(client, live), drop

    class OnTableStorage(SasMachine):
        store_factory = staticmethod(fresh_table)

    run_state_machine_as_test(
        OnTableStorage,
        settings=settings(
            max_examples=12,
            stateful_step_count=25,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
