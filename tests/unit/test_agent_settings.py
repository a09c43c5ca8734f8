"""An HTTP agent given no service fails alone, naming the setting to set: its function at each
message (as in Azure, where nothing runs before it), and locally the dev host before it starts
the function (tests/e2e/test_devhost.py starts one)."""

from __future__ import annotations

from collections.abc import Iterator

import azure.functions as func
import pytest

from sas import bootstrap, settings
from sas.domain.errors import ConfigurationError
from sas.entrypoints import queues
from sas.settings import HTTP_AGENTS
from sas_local.devhost.config import DevHostError
from sas_local.devhost.loader import Plan, QueueFunction, preflight

pytestmark = pytest.mark.unit

AGENT = HTTP_AGENTS[0]
SETTING = settings.remote_url_setting(AGENT)


@pytest.fixture
def without_one_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    env = {
        settings.TRANSPORT: "storage",
        settings.STORAGE_CONNECTION: "UseDevelopmentStorage=true",
        **{settings.remote_url_setting(a): f"http://127.0.0.1:9/{a}" for a in HTTP_AGENTS},
        **bootstrap.workflows().settings,
    }
    del env[SETTING]
    monkeypatch.delenv(SETTING, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bootstrap.reset()
    yield env
    bootstrap.reset()


def test_the_agents_function_fails_naming_the_setting_and_reads_nothing(without_one_url):
    with pytest.raises(ConfigurationError, match=f"^missing setting {SETTING}: "):
        queues.run_step(AGENT)(func.QueueMessage(body=b"never read"), f"agent_{AGENT}", "lane")
    for other in HTTP_AGENTS[1:]:
        bootstrap.check_agent(other)  # the other agents run


def test_the_dev_host_runs_each_functions_own_check_before_it_starts(without_one_url):
    def record(msg: object) -> None:
        raise AssertionError("never invoked")

    record.preflight = lambda env: bootstrap.check_agent(AGENT, env)  # type: ignore[attr-defined]
    plain = QueueFunction("plain", "msg", lambda msg: None, "q", "SasStorage", "cs")
    checked = QueueFunction("agent_x", "msg", record, "q", "SasStorage", "cs")
    preflight(Plan((plain,), (), ()), without_one_url)  # no check of its own: nothing to do
    with pytest.raises(DevHostError, match=r"^function 'agent_x' cannot run: missing setting"):
        preflight(Plan((plain, checked), (), ()), without_one_url)
    preflight(Plan((checked,), (), ()), {**without_one_url, SETTING: "http://127.0.0.1:9/x"})
