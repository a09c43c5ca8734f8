"""The deployment package holds the app and nothing else, even from a cluttered checkout.

The package is built as azd and Core Tools build it: the project directory minus what
`.funcignore` denies. It must hold exactly function_app.py, host.json, requirements.txt, the
sas package's modules and the app's workflows/: no local tooling, CLI, tests, docs, infra,
caches, venvs, settings.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.deploy.packaging import (
    ROOT,
    build_package,
    copy_files,
    expected_package,
    project_files,
)

pytestmark = pytest.mark.deploy

# Junk a developer's checkout really has, next to the project's own files.
JUNK = (
    ".venv/lib/x.py",
    "venv/bin/python",
    "node_modules/azurite/x.js",
    "sas/__pycache__/bootstrap.cpython-311.pyc",
    "sas/domain/__pycache__/x.pyc",
    "sas.egg-info/PKG-INFO",  # `pip install -e .` (make setup) writes it
    ".coverage",
    ".coverage.host.123",
    "htmlcov/index.html",
    "coverage.xml",
    "local.settings.json",
    ".azurite/x",
    "__azurite_db_table__.json",
    "__blobstorage__/x",
    ".sas-run/demo.log",
    "devhost.log",
    ".pytest_cache/x",
    ".mypy_cache/x",
    ".ruff_cache/x",
    ".hypothesis/x",
    ".env",
    ".azure/env/.env",
    "docs/x.md",
    "sas_local/new_tool.py",
    "tests/new_test.py",
)


def difference(built: set[str], expected: set[str]) -> str:
    return (
        f"shipped but should not: {sorted(built - expected)}\n"
        f"missing from the package: {sorted(expected - built)}"
    )


@pytest.fixture
def hostile_tree(tmp_path: Path) -> Path:
    """A copy of the project's files with a developer's junk planted around them."""
    tree = tmp_path / "checkout"
    copy_files(project_files(), ROOT, tree)
    for junk in JUNK:
        (tree / junk).parent.mkdir(parents=True, exist_ok=True)
        (tree / junk).write_text("junk\n")
    return tree


def test_the_package_of_this_checkout_holds_exactly_the_app(package_zip: Path):
    with zipfile.ZipFile(package_zip) as package:
        built = set(package.namelist())
    expected = expected_package(project_files())
    assert built == expected, difference(built, expected)
    assert {"function_app.py", "host.json", "requirements.txt", "sas/bootstrap.py"} <= built
    # The dashboard is served from files inside the package, not only .py modules.
    dashboard = "sas/entrypoints/dashboard"
    assert {
        f"{dashboard}/{name}" for name in ("index.html", "dashboard.js", "dashboard.css")
    } <= built


def test_the_package_of_a_cluttered_checkout_holds_exactly_the_app(
    hostile_tree: Path, tmp_path: Path
):
    built = build_package(hostile_tree, tmp_path / "sas.zip")
    expected = expected_package(project_files())
    assert built == expected, difference(built, expected)


@pytest.mark.parametrize(
    ("removed", "now_shipped"),
    [
        ("sas_local/", "sas_local/new_tool.py"),
        ("tests/", "tests/new_test.py"),
        (".venv/", ".venv/lib/x.py"),
        ("local.settings.json", "local.settings.json"),
        ("__pycache__/", "sas/domain/__pycache__/x.pyc"),
    ],
)
def test_the_check_fails_when_a_funcignore_line_goes(
    hostile_tree: Path, tmp_path: Path, removed: str, now_shipped: str
):
    lines = (hostile_tree / ".funcignore").read_text().splitlines()
    assert removed in lines
    kept = [line for line in lines if line != removed]
    if removed == "__pycache__/":  # *.py[cod] denies the same files: both must go
        kept.remove("*.py[cod]")
    built = build_package(hostile_tree, tmp_path / "sas.zip", funcignore="\n".join(kept))
    assert now_shipped in built
    assert built != expected_package(project_files())
