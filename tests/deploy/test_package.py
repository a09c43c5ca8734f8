"""The deployment package holds the app and nothing else, even from a cluttered checkout.

The package is built as azd and as Core Tools build it, each with its own `.funcignore`
matcher (tests/deploy/packaging.py): the project directory minus what `.funcignore` denies.
It must hold exactly function_app.py, host.json, requirements.txt, the sas package's modules
and the app's workflows/: no local tooling, CLI, tests, docs, infra, caches, venvs, settings.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.deploy.packaging import (
    MATCHERS,
    ROOT,
    Matcher,
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
    "main_env/bin/python",  # `azd restore`'s venv: <directory>_env
    "sas_local/simulator/build/function_app.py",  # the simulator's package (bundle.py)
    "node_modules/azurite/x.js",
    "sas/__pycache__/bootstrap.cpython-311.pyc",
    "sas/domain/__pycache__/x.pyc",
    "sas/x/__pycache__/y.pyc",
    "workflows/__pycache__/order.cpython-311.pyc",
    "sas/stray.pyc",
    ".DS_Store",
    "sas/.DS_Store",
    "sas/.http_api.py.swp",
    "sas/bootstrap.py~",
    ".envrc",
    "sas/.env",
    ".python-version",
    ".tox/py311/x",
    ".devcontainer/devcontainer.json",
    "sas/NOTES.md",
    "workflows/debug.log",
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


@pytest.mark.parametrize("matcher", MATCHERS)
def test_the_package_of_a_cluttered_checkout_holds_exactly_the_app(
    hostile_tree: Path, tmp_path: Path, matcher: Matcher
):
    built = build_package(hostile_tree, tmp_path / "sas.zip", matcher=matcher)
    expected = expected_package(project_files())
    assert built == expected, difference(built, expected)


def test_core_tools_packages_this_checkout_as_azd_does(package_zip: Path, tmp_path: Path):
    with zipfile.ZipFile(package_zip) as package:
        by_azd = set(package.namelist())
    by_core_tools = build_package(ROOT, tmp_path / "func.zip", matcher="core tools")
    assert by_core_tools == by_azd, difference(by_core_tools, by_azd)


ALL_PYC = ("__pycache__/", "**/__pycache__/", "*.pyc", "**/*.pyc")


@pytest.mark.parametrize(
    ("removed", "now_shipped", "matcher"),
    [
        (("sas_local/",), "sas_local/new_tool.py", "azd"),
        (("tests/",), "tests/new_test.py", "core tools"),
        ((".venv/",), ".venv/lib/x.py", "azd"),
        (("local.settings.json",), "local.settings.json", "azd"),
        (("**/__pycache__/", "**/*.pyc"), "sas/domain/__pycache__/x.pyc", "core tools"),
        (
            ("__pycache__/", "**/__pycache__/", "*.pyc", "**/*.pyc"),
            "sas/x/__pycache__/y.pyc",
            "azd",
        ),
        (("requirements.in",), "requirements.in", "core tools"),
    ],
)
def test_the_check_fails_when_a_funcignore_line_goes(
    hostile_tree: Path, tmp_path: Path, removed: tuple[str, ...], now_shipped: str, matcher: Matcher
):
    lines = (hostile_tree / ".funcignore").read_text().splitlines()
    assert set(removed) <= set(lines)
    kept = [line for line in lines if line not in removed]
    built = build_package(hostile_tree, tmp_path / "sas.zip", "\n".join(kept), matcher)
    assert now_shipped in built
    assert built != expected_package(project_files())
