"""An application's declared workflows: validated when declared, loaded by name, input checked
against the workflow's schema (sas/domain/workflow.py, sas/declared.py)."""

from __future__ import annotations

import sys
from datetime import timedelta
from types import ModuleType

import pytest

from sas import declared, settings
from sas.domain.errors import ConfigurationError
from sas.domain.workflow import PythonAgent, Registry, StepDefinition, Workflow
from sas.testing import Harness
from sas_local.infra import param_name
from workflows import REGISTRY
from workflows.order import ORDER_WORKFLOW

pytestmark = [pytest.mark.unit, pytest.mark.fast]

STEP = StepDefinition("provision", "cloud", "provision", timedelta(seconds=15))


@pytest.fixture
def load(monkeypatch):
    """``declared.registry()`` of the module named, its cache cleared before and after."""
    declared.registry.cache_clear()

    def registry_of(name: str, module: ModuleType | None = None) -> Registry:
        if module is not None:
            monkeypatch.setitem(sys.modules, name, module)
        monkeypatch.setenv(declared.WORKFLOWS_MODULE, name)
        declared.registry.cache_clear()
        return declared.registry()

    yield registry_of
    declared.registry.cache_clear()


def test_the_app_declares_the_two_example_workflows_and_their_agents():
    # The examples, whatever else an application adds beside them.
    assert REGISTRY.named("order") is ORDER_WORKFLOW
    assert ORDER_WORKFLOW.agents == ("inventory", "payment", "shipping")
    assert {"inventory", "payment", "shipping", "cloud", "mailer"} <= set(REGISTRY.agents)
    assert set(ORDER_WORKFLOW.agents) <= set(REGISTRY.http_agents)
    assert {"cloud", "mailer"}.isdisjoint(REGISTRY.http_agents)
    assert REGISTRY.tables.count("workspaces") == 1  # declared by both Python agents, kept once
    assert "workspace" in REGISTRY and "nope" not in REGISTRY


def test_a_table_of_the_app_s_own_name_is_refused_at_start(monkeypatch):
    monkeypatch.setattr(settings, "APP_TABLES", ("Orders",))
    env = {settings.TRANSPORT: "storage", settings.STORAGE_CONNECTION: "UseDevelopmentStorage=true"}
    env |= {settings.remote_url_setting(a): "http://x.example" for a in settings.HTTP_AGENTS}
    with pytest.raises(ConfigurationError, match="a Python agent declares it too"):
        settings.load({**env, settings.TABLE_NAME: "orders"})
    assert settings.load({**env, settings.TABLE_NAME: "sales"}).tables[-1] == "Orders"


def test_a_module_named_by_the_setting_declares_the_workflows(load):
    module = ModuleType("my_workflows")
    module.REGISTRY = Registry((Workflow("setup", (STEP,)),))  # type: ignore[attr-defined]
    assert load("my_workflows", module).agents == ("cloud",)


def test_a_missing_module_or_registry_is_a_clear_configuration_error(load):
    with pytest.raises(ConfigurationError, match="no module 'no_such_workflows'"):
        load("no_such_workflows")
    with pytest.raises(ConfigurationError, match="REGISTRY must be a sas Registry"):
        load("empty_workflows", ModuleType("empty_workflows"))


@pytest.mark.parametrize("seconds", [10, 301])
def test_a_budget_a_deployment_cannot_keep_is_refused_at_start_saying_why(load, seconds):
    step = StepDefinition("provision", "cloud", "provision", timedelta(seconds=seconds))
    module = ModuleType("short_workflows")
    module.REGISTRY = Registry((Workflow("setup", (step,)),))  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match=r"step 'provision': budget .* Service Bus"):
        load("short_workflows", module)
    with pytest.raises(ConfigurationError, match="send timeout"):
        Harness(module.REGISTRY)  # the in-memory harness checks as the app does


SETUP = Workflow("setup", (StepDefinition("go", "cloud", "go", timedelta(seconds=5)),))
SETUP2 = Workflow(
    "setup",
    (
        StepDefinition("go", "cloud", "go", timedelta(seconds=5)),
        StepDefinition("tell", "mail", "tell", timedelta(seconds=5)),
    ),
)
CLOUD_A = PythonAgent("cloud", {"go": print}, settings={"CLOUD_URL": "http://a"})
CLOUD_B = PythonAgent("cloud", {"go": print}, settings={"CLOUD_URL": "http://b"})
MAIL_B = PythonAgent("mail", {"tell": print}, settings={"CLOUD_URL": "http://b"})
CLOUD_T = PythonAgent("cloud", {"go": print}, tables=("records",))
MAIL_T = PythonAgent("mail", {"tell": print}, tables=("Records",))


@pytest.mark.parametrize(
    ("declare", "problem"),
    [
        (lambda: Registry(()), "workflows must be a non-empty tuple"),
        (lambda: Registry([ORDER_WORKFLOW]), "workflows must be a non-empty tuple"),  # type: ignore[arg-type]
        (lambda: Registry((ORDER_WORKFLOW, ORDER_WORKFLOW)), "two workflows share a name"),
        (lambda: Workflow("setup", ()), "steps must be a non-empty tuple"),
        (lambda: Workflow("setup", (STEP,) * 17), "more than 16 steps"),
        (lambda: Workflow("setup", (STEP,), on_failure="retry"), "on_failure"),  # type: ignore[arg-type]
        (lambda: Workflow("setup", (STEP,), pickup_budget=timedelta(0)), "pickup_budget"),
        (lambda: Workflow("setup", (STEP,), input=dict), "pydantic model class"),  # type: ignore[arg-type]
        (lambda: StepDefinition("go", "cloud", "go", timedelta.max), "at most a day"),
        (lambda: StepDefinition("go", "cloud", "go", timedelta(1), max_failures=True), "an int"),
        (lambda: StepDefinition("go", "cloud", "go", timedelta(1), max_failures=101), "an int"),
        (lambda: StepDefinition("go", "cloud", "go", timedelta(1), input="x"), "a function"),  # type: ignore[arg-type]
        (lambda: Workflow("setup", (STEP, STEP)), "repeats a step name"),
        (lambda: Workflow("Set Up", (STEP,)), "workflow name"),
        (lambda: StepDefinition("x", "cloud", "provision", timedelta(seconds=5)), "step name"),
        (lambda: StepDefinition("go", "cloud", "go", timedelta(0)), "budget must be positive"),
        (lambda: PythonAgent("cloud", {}, tables=("my-table",)), "table 'my-table' must match"),
        (lambda: PythonAgent("cloud", {}, tables="records"), "tables must be a tuple"),  # type: ignore[arg-type]
        (lambda: PythonAgent("cloud", {}, settings={"cloud_url": "x"}), "setting 'cloud_url'"),
        (lambda: PythonAgent("cloud", {}, settings={"CLOUD__URL": "x"}), "single underscores"),
        (lambda: PythonAgent("cloud", {}, settings={"SAS_CLOUD": "x"}), "not starting with SAS_"),
        (lambda: PythonAgent("cloud", {}, settings={"CLOUD_URL": ""}), "local value"),
        (lambda: Registry((SETUP,), (CLOUD_A, CLOUD_B)), "two Python agents share a name"),
        (lambda: Registry((SETUP2,), (CLOUD_A, MAIL_B)), "two local values"),
        (lambda: Registry((SETUP2,), (CLOUD_T, MAIL_T)), "differ only in case"),
    ],
)
def test_a_bad_declaration_fails_with_what_is_wrong(declare, problem):
    with pytest.raises(ValueError, match=problem):
        declare()


def test_an_unknown_workflow_is_named():
    with pytest.raises(ValueError, match="unknown workflow 'nope'"):
        REGISTRY.named("nope")


def test_a_workflow_without_a_schema_takes_any_json_object():
    details = {"anything": [1, {"nested": True}]}
    assert Workflow("setup", (STEP,)).parse_input(details) == details


def test_an_agents_process_needs_every_declared_setting_and_passes_it_on(monkeypatch):
    from sas import bootstrap

    monkeypatch.setenv(settings.TRANSPORT, "storage")
    monkeypatch.setenv(settings.STORAGE_CONNECTION, "UseDevelopmentStorage=true")
    for agent in settings.HTTP_AGENTS:
        monkeypatch.setenv(settings.remote_url_setting(agent), "http://x.example")
    for key in REGISTRY.settings:
        monkeypatch.delenv(key, raising=False)
    bootstrap.reset()
    with pytest.raises(ConfigurationError, match="missing setting WORKSPACE_DOMAIN"):
        bootstrap.agent_context()
    monkeypatch.setenv("WORKSPACE_DOMAIN", "contoso.example")
    monkeypatch.setenv("MAIL_FROM", "ops@contoso.example")
    bootstrap.reset()
    agents = bootstrap.agent_context().agents
    assert agents is not None
    assert agents.settings == {
        "WORKSPACE_DOMAIN": "contoso.example",
        "MAIL_FROM": "ops@contoso.example",
    }
    bootstrap.reset()


@pytest.mark.parametrize(
    "name", ["reserve__flight", "_reserve", "reserve_", "Reserve_flight", "r" * 32, "a", "2fa"]
)
def test_a_name_that_is_not_snake_case_is_refused_saying_what_a_name_may_be(name):
    with pytest.raises(ValueError, match="must be snake_case: a lowercase letter"):
        StepDefinition(name, "cloud", "go", timedelta(seconds=15))


def test_snake_case_names_are_declared_and_queues_and_settings_are_derived_from_them(
    monkeypatch,
):
    step = StepDefinition("reserve_flight", "flight_api", "hold_seat", timedelta(seconds=15))
    trip = Workflow("business_trip", (step,))
    assert Registry((trip,)).http_agents == ("flight_api",)
    monkeypatch.setattr(settings, "AGENTS", ("flight_api",))
    queues = settings.queue_names({})
    assert queues[settings.agent_queue_setting("flight_api")] == "sas-agent-flight-api"
    assert settings.agent_queue_setting("flight_api") == "SAS_QUEUE_AGENT_FLIGHT_API"
    assert settings.remote_url_setting("flight_api") == "SAS_REMOTE_FLIGHT_API_URL"
    assert param_name("flight_api", "Url") == "remoteFlightApiUrl"
    assert Harness(Registry((trip,))).routes.agents["flight_api"].endswith("agent-flight-api")
