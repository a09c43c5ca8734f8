"""The layers of sas depend one way: domain <- services <- adapters <- bootstrap <- entrypoints,
and the deployed package never imports the local tooling or the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SAS = Path(__file__).resolve().parents[2] / "sas"

# For each layer: the sas modules it may import (by prefix), and third-party roots it may not.
ALLOWED_SAS = {
    "domain": ("sas.domain",),
    "services": ("sas.domain", "sas.services"),
    "adapters": (
        "sas.domain",
        "sas.services.ports",
        "sas.services.breaker",
        "sas.services.telemetry",  # the trace context a transport carries; API only
        "sas.adapters",
        "sas.settings",
    ),
}
FORBIDDEN_EXTERNAL = {
    "domain": ("azure", "httpx", "fastapi", "tenacity"),
    "services": ("azure", "httpx", "fastapi"),
}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def layer_files(layer: str) -> list[Path]:
    return sorted((SAS / layer).glob("*.py"))


@pytest.mark.parametrize("layer", sorted(ALLOWED_SAS))
def test_each_layer_imports_only_the_layers_below_it(layer: str) -> None:
    wrong = []
    for path in layer_files(layer):
        for module in imports(path):
            root = module.split(".")[0]
            if root == "sas" and not module.startswith(ALLOWED_SAS[layer]):
                wrong.append(f"{path.name} imports {module}")
            if root in FORBIDDEN_EXTERNAL.get(layer, ()):
                wrong.append(f"{path.name} imports {module}")
    assert wrong == []


def test_the_deployed_package_never_imports_local_tooling_or_the_cli() -> None:
    wrong = [
        f"{path.relative_to(SAS.parent)} imports {module}"
        for path in sorted(SAS.rglob("*.py"))
        for module in imports(path)
        if module.split(".")[0] in ("sas_local", "sas_cli", "tests")
    ]
    assert wrong == []
