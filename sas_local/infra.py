"""`python -m sas_local.infra` (`make infra`): what follows from the app's declared workflows
(workflows/) outside the code: the marked regions of infra/main.bicep (the queue prefix's
longest length; each agent's queue lanes; the Python agents' tables; each HTTP agent's URL,
endpoints and capacity parameters and app settings; each Python agent's own settings), their
entries in infra/main.parameters.json, and in local.settings.example.json each HTTP agent's
URL (on the simulator) and each Python agent's setting at its local value; and
infra/workflows.lock.json, each workflow version's definition (sas_local/workflow_lock.py).
`--check` changes nothing and fails if any is stale (tests/unit/test_infra_consistency.py runs
it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from sas import settings
from sas.declared import registry
from sas.domain.wire import live_table_name, queue_word
from sas_local import workflow_lock
from sas_local.user_settings import SIMULATOR_PORT

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
BICEP = INFRA / "main.bicep"
PARAMETERS = INFRA / "main.parameters.json"
LOCAL_SETTINGS = ROOT / "local.settings.example.json"
SIMULATOR = f"http://127.0.0.1:{SIMULATOR_PORT}"
"""Where `python -m sas_local.simulator` listens by default: every remote a local run needs."""
_REGION = re.compile(
    r"(?P<head>^[ \t]*// generated: (?P<name>[a-z ]+) \(make infra\)\n)(?P<body>.*?)"
    r"(?P<tail>^[ \t]*// end generated: (?P=name)\n)",
    re.MULTILINE | re.DOTALL,
)


def param_name(agent: str, what: str) -> str:
    """The Bicep parameter of an HTTP agent's ``what`` (Url, Endpoints, Capacity)."""
    return "remote" + "".join(part.capitalize() for part in agent.split("_")) + what


def setting_param(key: str) -> str:
    """The Bicep parameter of a Python agent's setting: WORKSPACE_DOMAIN, settingWorkspaceDomain."""
    return "setting" + "".join(part.capitalize() for part in key.split("_"))


def _setting_params(key: str, agents: str) -> str:
    return (
        f"@description('App setting {key}, read by the {agents} agent\\'s actions (for a "
        f"secret, a Key Vault reference).')\n"
        f"@minLength(1)\n"
        f"param {setting_param(key)} string\n"
    )


def _params(agent: str) -> str:
    upper = agent.upper()
    return (
        f"@description('Base URL of the remote {agent} service (SAS_REMOTE_{upper}_URL); empty: "
        f"the simulator\\'s, with deploySimulator.')\n"
        f"param {param_name(agent, 'Url')} string = ''\n\n"
        f'@description(\'Endpoints of the {agent} service, [{{"name": "west", "url": '
        f'"https://...", "capacity": 8}}, ...] (capacity optional); empty: the one URL above '
        f"(SAS_REMOTE_{upper}_ENDPOINTS, as JSON).')\n"
        f"param {param_name(agent, 'Endpoints')} array = []\n\n"
        f"@description('Calls the {agent} service\\'s one URL takes at once; empty: no limit "
        f"(SAS_REMOTE_{upper}_CAPACITY).')\n"
        f"param {param_name(agent, 'Capacity')} string = ''\n"
    )


def url_module(agent: str) -> str:
    """The module (modules/remote-url.bicep) that says where an HTTP agent's URL comes from."""
    return f"remote{agent.capitalize()}"


def _url_module(agent: str) -> str:
    url = param_name(agent, "Url")
    return (
        f"module {url_module(agent)} 'modules/remote-url.bicep' = {{\n"
        f"  name: 'remote-url-{agent}'\n"
        f"  scope: rg\n"
        f"  params: {{\n"
        # any(): Bicep types the ternary as '' | 'simulator' | 'parameter' and would refuse it
        # at compile time against @allowed; ARM checks the value when it deploys.
        f"    source: any(empty({url}) ? (deploySimulator ? 'simulator' : '') : 'parameter')\n"
        f"  }}\n"
        f"}}\n"
    )


def _url_setting(agent: str) -> str:
    url = param_name(agent, "Url")
    return (
        f"  {settings.remote_url_setting(agent)}: ('parameter' == "
        f"{url_module(agent)}.outputs.source) ? {url} : '${{simulatorUrl}}/{agent}'\n"
    )


def _options(agent: str) -> str:
    """The optional settings of an HTTP agent; its endpoints, an array, as JSON."""
    endpoints = param_name(agent, "Endpoints")
    return (
        f"  {settings.remote_endpoints_setting(agent)}: empty({endpoints}) ? '' : "
        f"string({endpoints})\n"
        f"  {settings.remote_capacity_setting(agent)}: {param_name(agent, 'Capacity')}\n"
    )


def _queue_prefix() -> str:
    """The queuePrefix parameter, held to what ``settings.queue_names`` accepts: its length here
    (the longest agent's queue bounds it), its characters by ``queuePrefixValid`` in
    main.bicep (Bicep has no regular expressions)."""
    return (
        f"@description('Every queue\\'s name starts with this and a hyphen (SAS_QUEUE_PREFIX): "
        f"<prefix>-orders, <prefix>-orders-high, ... <prefix>-alerts. Lowercase letters, digits "
        f"and single hyphens, a letter or digit at each end (a deployment with another fails); "
        f"at most {settings.MAX_QUEUE_PREFIX} characters, so that the longest queue name and "
        f"its -poison queue fit 63.')\n"
        f"@minLength(1)\n"
        f"@maxLength({settings.MAX_QUEUE_PREFIX})\n"
        f"param queuePrefix string = '{settings.DEFAULT_QUEUE_PREFIX}'\n"
    )


def regions() -> dict[str, str]:
    """The text of each generated region of main.bicep, from the declared workflows."""
    declared = registry()
    http = declared.http_agents
    keys = declared.settings
    own = {settings.DEFAULT_TABLE.lower(), live_table_name(settings.DEFAULT_TABLE).lower()}
    if clash := [table for table in declared.tables if table.lower() in own]:
        raise ValueError(f"table {clash[0]!r}: sas's own (tableName) has that name")
    return {
        "queue prefix": _queue_prefix(),
        "agent parameters": "\n".join(
            [*(_params(agent) for agent in http), *(_setting_params(k, _readers(k)) for k in keys)]
        ),
        "agent queues": "".join(f"  'agent-{queue_word(agent)}'\n" for agent in declared.agents),
        "app tables": "".join(f"  '{table}'\n" for table in declared.tables),
        "agent urls": "\n".join(_url_module(agent) for agent in http),
        "agent settings": "".join(_url_setting(a) for a in http)
        + "".join(f"  {key}: {setting_param(key)}\n" for key in keys),
        "agent options": "".join(_options(agent) for agent in http),
    }


def _readers(key: str) -> str:
    return " and ".join(a.name for a in registry().python_agents if key in a.settings)


def bicep_text(current: str) -> str:
    """``current`` with every generated region rewritten; ValueError for a region missing."""
    wanted = regions()
    found: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in wanted:
            raise ValueError(f"main.bicep: unknown generated region {name!r}")
        found.add(name)
        return match.group("head") + wanted[name] + match.group("tail")

    text = _REGION.sub(replace, current)
    if missing := set(wanted) - found:
        raise ValueError(f"main.bicep: generated regions missing: {sorted(missing)}")
    for name in wanted:
        if current.count(f"// generated: {name} (make infra)") != 1:
            raise ValueError(f"main.bicep: the region {name!r} must be there once")
    return text


def generated_parameters(bicep: str) -> set[str]:
    """The parameters a main.bicep's generated region declares (those make infra owns)."""
    found = next(m for m in _REGION.finditer(bicep) if m.group("name") == "agent parameters")
    return set(re.findall(r"^param (\w+) ", found.group("body"), re.MULTILINE))


def parameters_text(current: str, owned: set[str]) -> str:
    """main.parameters.json with one entry per HTTP agent parameter (azd fills them from the
    environment) in place of those ``owned`` (generated before), the rest as it is."""
    document = json.loads(current)
    generated: dict[str, Any] = {}
    for agent in registry().http_agents:
        upper = agent.upper()
        generated[param_name(agent, "Url")] = {"value": f"${{SAS_REMOTE_{upper}_URL=}}"}
        # An array: azd parses the variable as JSON (a string parameter would take it raw
        # into its parameters file, where the JSON's quotes break it).
        # `=[]`: unset or empty, an empty array (azd cannot parse "" as JSON).
        endpoints = f"SAS_REMOTE_{upper}_ENDPOINTS"
        generated[param_name(agent, "Endpoints")] = {"value": f"${{{endpoints}=[]}}"}
        capacity = f"SAS_REMOTE_{upper}_CAPACITY"
        generated[param_name(agent, "Capacity")] = {"value": f"${{{capacity}=}}"}
    for key in registry().settings:
        generated[setting_param(key)] = {"value": f"${{{key}}}"}
    parameters: dict[str, Any] = {}
    for name, value in document["parameters"].items():
        if name in owned:
            parameters.update(generated)  # at the first remote parameter's place
            generated = {}
        else:
            parameters[name] = value
    parameters.update(generated)
    document["parameters"] = parameters
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def generated_settings(bicep: str) -> set[str]:
    """The app settings a main.bicep's generated region sets (those make infra owns)."""
    found = next(m for m in _REGION.finditer(bicep) if m.group("name") == "agent settings")
    return set(re.findall(r"^\s*(\w+): ", found.group("body"), re.MULTILINE))


def local_settings_text(current: str, owned: set[str]) -> str:
    """local.settings.example.json with a URL on the simulator for each HTTP agent and each
    Python agent's setting at its local value, in place of those ``owned`` (generated before);
    the rest as it is."""
    document = json.loads(current)
    values = {key: value for key, value in document["Values"].items() if key not in owned}
    for agent in registry().http_agents:
        values[settings.remote_url_setting(agent)] = f"{SIMULATOR}/{agent}"
    values |= registry().settings
    document["Values"] = values
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def rewritten() -> dict[Path, str]:
    """Each file's text as the declarations make it (all built before any is written).
    SystemExit, naming the change, if a locked workflow version was changed in place."""
    bicep = BICEP.read_text(encoding="utf-8")
    owned = generated_parameters(bicep)
    local = LOCAL_SETTINGS.read_text(encoding="utf-8")
    lock = workflow_lock.read()
    changed = workflow_lock.changes(registry(), lock)
    if changed:
        sys.exit("\n".join(changed))
    return {
        BICEP: bicep_text(bicep),
        PARAMETERS: parameters_text(PARAMETERS.read_text(encoding="utf-8"), owned),
        LOCAL_SETTINGS: local_settings_text(local, generated_settings(bicep)),
        workflow_lock.LOCK: workflow_lock.render(workflow_lock.locked(registry(), lock)),
    }


def stale() -> list[str]:
    """The files whose generated parts differ from the declarations."""
    return [path.name for path, text in rewritten().items() if text != _text(path)]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m sas_local.infra", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if anything is stale")
    args = parser.parse_args()
    if args.check:
        found = stale()
        if found:
            sys.exit(f"stale: {', '.join(found)}: run `make infra`")
        return
    for path, text in rewritten().items():
        path.write_text(text, encoding="utf-8")
        print(path)


if __name__ == "__main__":
    main()
