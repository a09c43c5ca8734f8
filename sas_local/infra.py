"""`python -m sas_local.infra` (`make infra`): the parts of infra/ that follow from the app's
declared workflows (workflows/), written into their marked regions of infra/main.bicep and into
infra/main.parameters.json: each agent's queue lanes, and each HTTP agent's URL, endpoints and
capacity parameters and app settings. `--check` changes nothing and fails if they are stale
(tests/unit/test_infra_consistency.py runs it).
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

INFRA = Path(__file__).resolve().parents[1] / "infra"
BICEP = INFRA / "main.bicep"
PARAMETERS = INFRA / "main.parameters.json"
_REGION = re.compile(
    r"(?P<head>^[ \t]*// generated: (?P<name>[a-z ]+) \(make infra\)\n)(?P<body>.*?)"
    r"(?P<tail>^[ \t]*// end generated: (?P=name)\n)",
    re.MULTILINE | re.DOTALL,
)


def param_name(agent: str, what: str) -> str:
    """The Bicep parameter of an HTTP agent's ``what`` (Url, Endpoints, Capacity)."""
    return f"remote{agent.capitalize()}{what}"


def _params(agent: str) -> str:
    upper = agent.upper()
    return (
        f"@description('Base URL of the remote {agent} service (SAS_REMOTE_{upper}_URL).')\n"
        f"@minLength(8)\n"
        f"param {param_name(agent, 'Url')} string\n\n"
        f'@description(\'Endpoints of the {agent} service as JSON, [{{"name": "west", "url": '
        f'"https://...", "capacity": 8}}, ...] (capacity optional); empty: the one URL above '
        f"(SAS_REMOTE_{upper}_ENDPOINTS).')\n"
        f"param {param_name(agent, 'Endpoints')} string = ''\n\n"
        f"@description('Calls the {agent} service\\'s one URL takes at once; empty: no limit "
        f"(SAS_REMOTE_{upper}_CAPACITY).')\n"
        f"param {param_name(agent, 'Capacity')} string = ''\n"
    )


def regions() -> dict[str, str]:
    """The text of each generated region of main.bicep, from the declared workflows."""
    declared = registry()
    http = declared.http_agents
    return {
        "agent parameters": "\n".join(_params(agent) for agent in http),
        "agent queues": "".join(f"  'agent-{agent}'\n" for agent in declared.agents),
        "agent urls": "".join(
            f"  {settings.remote_url_setting(a)}: {param_name(a, 'Url')}\n" for a in http
        ),
        "agent options": "".join(
            f"  {setting(a)}: {param_name(a, what)}\n"
            for a in http
            for setting, what in (
                (settings.remote_endpoints_setting, "Endpoints"),
                (settings.remote_capacity_setting, "Capacity"),
            )
        ),
    }


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
    return text


def parameters_text(current: str) -> str:
    """main.parameters.json with one entry per HTTP agent parameter (azd fills them from the
    environment), where the remote parameters were, the rest as it is."""
    document = json.loads(current)
    generated: dict[str, Any] = {}
    for agent in registry().http_agents:
        upper = agent.upper()
        generated[param_name(agent, "Url")] = {"value": f"${{SAS_REMOTE_{upper}_URL}}"}
        for what in ("Endpoints", "Capacity"):
            env = f"SAS_REMOTE_{upper}_{what.upper()}"
            generated[param_name(agent, what)] = {"value": f"${{{env}=}}"}
    parameters: dict[str, Any] = {}
    for name, value in document["parameters"].items():
        if re.fullmatch(r"remote[A-Z][a-z0-9]*(Url|Endpoints|Capacity)", name):
            parameters.update(generated)  # at the first remote parameter's place
            generated = {}
        else:
            parameters[name] = value
    parameters.update(generated)
    document["parameters"] = parameters
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def stale() -> list[str]:
    """The infra files whose generated parts differ from the declarations."""
    return [
        path.name
        for path, make in ((BICEP, bicep_text), (PARAMETERS, parameters_text))
        if make(path.read_text(encoding="utf-8")) != path.read_text(encoding="utf-8")
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m sas_local.infra", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if infra/ is stale")
    args = parser.parse_args()
    if args.check:
        found = stale()
        if found:
            sys.exit(f"stale: {', '.join(found)}: run `make infra`")
        return
    for path, make in ((BICEP, bicep_text), (PARAMETERS, parameters_text)):
        path.write_text(make(path.read_text(encoding="utf-8")), encoding="utf-8")
        print(path)


if __name__ == "__main__":
    main()
