"""The checker's design file agrees with the product it judges.

The checker restates the product's wire rules and workflow in ``sas_local/chaos/design.toml``
instead of importing them (it must judge from the outside). This test is the one place where
the two meet: a change to a wire rule in ``sas/`` fails here until the design file is updated
on purpose, so the checker never silently judges against a stale design."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sas import settings
from sas.domain import wire
from sas.domain.model import TERMINAL_STATES
from sas.services.context import ALERT_LEASE
from sas_local import stack
from sas_local.chaos import deployed_workflows
from sas_local.chaos.checker import Design
from workflows import REGISTRY

pytestmark = pytest.mark.unit

DESIGN = Design.load()


def test_table_keys_are_the_product_wire_rules() -> None:
    assert DESIGN.table_name == settings.DEFAULT_TABLE
    assert (DESIGN.order_row, DESIGN.state_row) == (wire.ORDER_ROW, wire.STATE_ROW)
    assert DESIGN.step_row_prefix == wire.STEP_ROW_PREFIX
    assert DESIGN.history_row_prefix == wire.HISTORY_ROW_PREFIX
    assert DESIGN.live_table == wire.live_table_name(settings.DEFAULT_TABLE)
    assert DESIGN.live_partition == wire.LIVE_PARTITION
    assert DESIGN.rejected_partition == wire.REJECTED_PARTITION
    assert wire.step_row_key(0, "reserve").startswith(DESIGN.step_row_prefix)
    key = DESIGN.do_key.format(order="o-1", incarnation="0123456789ab", step="ship")
    assert key == wire.idempotency_key("o-1", "0123456789ab", "ship", "do")
    legacy = DESIGN.legacy_do_key.format(order="o-1", step="ship")
    assert legacy == wire.idempotency_key("o-1", "", "ship", "do")


def test_queues_and_alerts_are_the_product_defaults() -> None:
    assert DESIGN.orders_queue == settings.DEFAULT_QUEUES[settings.QUEUE_ORDERS]
    assert DESIGN.alerts_queue == settings.DEFAULT_QUEUES[settings.QUEUE_ALERTS]
    assert DESIGN.poison_suffix == wire.POISON_SUFFIX
    assert DESIGN.alert_lease_seconds == ALERT_LEASE.total_seconds()
    alert_id = wire.alert_message_id("o-1", 7, datetime(2026, 11, 22, 12, 0, 1, 5, tzinfo=UTC))
    parsed = DESIGN.alert_id.fullmatch(alert_id)
    assert parsed is not None and (parsed["order"], parsed["attempt"]) == ("o-1", "7")
    key = wire.missing_definition_key("order", 2, "0123456789abcdef")
    missing = wire.missing_alert_id(key, datetime(2026, 11, 28, 9, 0, 0, 7, tzinfo=UTC))
    found = DESIGN.missing_alert_id.fullmatch(missing)
    assert found is not None and found["key"] == key
    assert DESIGN.alert_id.fullmatch(missing) is None


def test_policy_and_workflows_are_the_local_stack_s() -> None:
    local = stack.app_env("UseDevelopmentStorage=true", "http://127.0.0.1:1")
    assert DESIGN.max_failures == int(local[settings.MAX_FAILURES])
    assert DESIGN.clock_skew_seconds == settings.DEFAULT_CLOCK_SKEW_SECONDS
    assert DESIGN.terminal == {str(s) for s in TERMINAL_STATES}
    # The examples the campaign runs, as the app declares them (it may declare more), and
    # the version 2s its deploy fault brings.
    assert list(DESIGN.workflows) == [
        ("order", 1),
        ("order", 2),
        ("workspace", 1),
        ("workspace", 2),
    ]
    deployed = deployed_workflows.REGISTRY
    for name, version in DESIGN.workflows:
        workflow = deployed.named(name, version)
        flow = DESIGN.workflows[(name, version)]
        assert (flow.version, flow.on_failure) == (workflow.version, workflow.on_failure)
        assert [
            (s.name, s.agent, s.action, s.undo, s.max_failures, s.on_failure) for s in flow.steps
        ] == [
            (s.name, s.agent, s.action, s.undo, s.max_failures, s.on_failure)
            for s in workflow.steps
        ]
    assert set(DESIGN.effect_tables) <= set(REGISTRY.tables)
    assert (DESIGN.steps, DESIGN.on_failure) == (
        DESIGN.workflows[("order", 1)].steps,
        DESIGN.workflows[("order", 1)].on_failure,
    )


def test_the_deploy_brings_the_app_s_versions_unchanged_and_a_new_version_of_each() -> None:
    deployed = deployed_workflows.REGISTRY
    for workflow in REGISTRY.workflows:  # orders in flight stay bound to what they began on
        assert deployed.bound(workflow.name, workflow.version, workflow.fingerprint) is workflow
    assert deployed.versions("order") == (*REGISTRY.versions("order"), 2)
    assert deployed.versions("workspace") == (*REGISTRY.versions("workspace"), 2)
    notify = deployed.named("workspace", 2).steps[-1]
    assert (notify.name, notify.on_failure) == ("notify", "continue")
    assert deployed.python_agents == REGISTRY.python_agents
    assert set(deployed.agents) == set(REGISTRY.agents)  # no queue or function to add
