"""The layers of sas depend one way: domain <- services <- adapters <- bootstrap <- entrypoints,
and the deployed package never imports the local tooling or the CLI."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.fast]

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


DEPENDENCIES = ("azure", "requests", "urllib3", "httpx", "pydantic", "tenacity", "opentelemetry")
"""Top-level packages whose dotted module names, written as a string, count as an import
(``importlib.import_module("azure.x._y")`` imports as surely as an import statement)."""


def private_imports(source: str) -> list[str]:
    """Imports of a dependency's private (``_``-prefixed) module or name, one per statement,
    and strings naming such a module."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+", node.value)
            and node.value.split(".")[0] in DEPENDENCIES
        ):
            modules = [node.value]
        else:
            continue
        private = [
            module
            for module in modules
            if module.split(".")[0] not in ("sas", "sas_local", "sas_cli", "__future__")
            and any(part.startswith("_") for part in module.split("."))
        ]
        found += private[:1]
    return found


def test_the_app_and_its_tooling_import_no_private_module_of_a_dependency() -> None:
    """Only public, supported APIs: a private module may change in any release."""
    root = SAS.parent
    sources = [root / "function_app.py"]
    for package in ("sas", "sas_local", "sas_cli"):
        sources += sorted((root / package).rglob("*.py"))
    found = {str(path.relative_to(root)): private_imports(path.read_text()) for path in sources}
    assert {path: hits for path, hits in found.items() if hits} == {}


def test_the_private_import_check_sees_every_spelling() -> None:
    source = (
        "from azure.core.pipeline._base import Pipeline\n"
        "from azure.core.rest import _helpers\n"
        "import azure.core.pipeline._tools\n"
        "from azure.core import MatchConditions\n"
        "from sas.domain import _private_of_our_own\n"
        'models = importlib.import_module("azure.storage.queue._generated.models")\n'
        'LATER = "azure.storage.queue._generated._utils.model_base"\n'
        'PUBLIC = "azure.storage.queue"\n'
    )
    assert sorted(private_imports(source)) == [
        "azure.core.pipeline._base",
        "azure.core.pipeline._tools",
        "azure.core.rest._helpers",
        "azure.storage.queue._generated._utils.model_base",
        "azure.storage.queue._generated.models",
    ]


MAX_FUNCTION_LINES = 50


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions (and methods) longer than ``limit`` lines, decorators and docstring included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if node.end_lineno - start + 1 > limit:
                found.append(f"{node.name} ({node.end_lineno - start + 1} lines)")
    return found


def test_no_function_of_the_app_is_longer_than_fifty_lines() -> None:
    """Complexity is ruff's (C90, PLR0912, PLR0915 in pyproject.toml); length is this test's."""
    found = {
        str(path.relative_to(SAS.parent)): long_functions(path.read_text())
        for path in sorted(SAS.rglob("*.py"))
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_the_length_check_counts_decorators_and_docstrings() -> None:
    body = "\n".join(f"    x = {n}" for n in range(48))
    fits = f"@decorated\ndef f():\n{body}\n"
    assert long_functions(fits) == []
    assert long_functions(f'@decorated\ndef f():\n    """Doc."""\n{body}\n') == ["f (51 lines)"]
