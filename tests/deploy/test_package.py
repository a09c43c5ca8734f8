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
    CoreToolsIgnore,
    Matcher,
    build_package,
    copy_files,
    expected_package,
    project_files,
)

pytestmark = pytest.mark.deploy

# Junk a developer's checkout really has, next to the project's own files. Names inside a
# directory that start with a symbol (`.lock`, `@azure`) matter: Core Tools' `\b` treats them
# apart from names that start with a letter.
JUNK = (
    ".venv/lib/x.py",
    ".venv/.installed",
    ".venv/.lock",
    ".venv/bin/python",
    ".venv/pyvenv.cfg",
    ".venv/lib/python3.11/site-packages/azure/__init__.py",
    "venv/bin/python",
    "venv/.gitignore",
    "main_env/bin/python",  # `azd restore`'s venv: <directory>_env
    "sas_local/simulator/build/function_app.py",  # the simulator's package (bundle.py)
    "node_modules/azurite/x.js",
    "node_modules/.bin/azurite",
    "node_modules/.package-lock.json",
    "node_modules/@azure/storage-blob/package.json",
    "node_modules/.installed",
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
    ".pytest_cache/.gitignore",
    ".mypy_cache/x",
    ".mypy_cache/.gitignore",
    ".ruff_cache/x",
    ".ruff_cache/.gitignore",
    ".hypothesis/x",
    "htmlcov/.gitignore",
    "sas/__pycache__/.x.pyc",
    ".env",
    ".azure/env/.env",
    "docs/x.md",
    "sas_local/new_tool.py",
    "tests/new_test.py",
    "tests/.env",
    "docs/.x.md",
)

CORE_TOOLS_CANNOT_DENY = frozenset({"sas/bootstrap.py~"})
"""What Core Tools ships from JUNK, as .funcignore's header says: a name that only adds
symbols to a shipped one matches no pattern that does not match the shipped one too."""


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
    if matcher == "core tools":
        expected |= CORE_TOOLS_CANNOT_DENY
    assert built == expected, difference(built, expected)


def test_core_tools_packages_this_checkout_as_azd_does(package_zip: Path, tmp_path: Path):
    with zipfile.ZipFile(package_zip) as package:
        by_azd = set(package.namelist())
    by_core_tools = build_package(ROOT, tmp_path / "func.zip", matcher="core tools")
    assert by_core_tools == by_azd, difference(by_core_tools, by_azd)


@pytest.mark.parametrize(
    ("removed", "now_shipped", "matcher"),
    [
        (("sas_local",), "sas_local/new_tool.py", "azd"),
        (("tests",), "tests/new_test.py", "core tools"),
        ((".venv",), ".venv/lib/x.py", "azd"),
        ((".venv",), ".venv/.lock", "core tools"),
        (("node_modules",), "node_modules/@azure/storage-blob/package.json", "core tools"),
        (("local.settings.json",), "local.settings.json", "azd"),
        (("**/__pycache__", "**/*.pyc"), "sas/domain/__pycache__/x.pyc", "core tools"),
        (("__pycache__", "**/__pycache__", "*.pyc", "**/*.pyc"), "sas/x/__pycache__/y.pyc", "azd"),
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


def test_a_trailing_slash_lets_core_tools_ship_what_starts_with_a_symbol(
    hostile_tree: Path, tmp_path: Path
):
    text = (hostile_tree / ".funcignore").read_text()
    slashed = "\n".join(
        f"{line}/" if line in (".venv", "node_modules") else line for line in text.splitlines()
    )
    built = build_package(hostile_tree, tmp_path / "func.zip", slashed, "core tools")
    assert {".venv/.lock", "node_modules/@azure/storage-blob/package.json"} <= built
    assert ".venv/lib/x.py" not in built  # a letter after the slash still meets the `\b`
    # azd reads `x/` as the directory x: the same lines keep it to the app.
    by_azd = build_package(hostile_tree, tmp_path / "azd.zip", slashed, "azd")
    assert by_azd == expected_package(project_files())


# Core Tools' own unit tests of its parser (test/Cli/Func.UnitTests/ParserTests/
# GitIgnoreParserTests.cs): a .gitignore and the verdicts it gives; `test1File.wat` is accepted
# only because of the `\b` (`/test1` would otherwise deny it).
CORE_TOOLS_SAMPLE = """# a comment
node_modules
*.log
nonexistent
!/nonexistent/foo
/baz
foo/*.wat
/test1
test2
othernonexistent/**/what
!/othernonexistent/**/what/foo
*.swp
"""


@pytest.mark.parametrize(
    ("path", "accepted"),
    [
        ("test/index.js", True),
        ("wat/test/index.js", True),
        ("/othernonexistent/blah/adsasd/whatads", True),
        ("/othernonexistent/blah/adsasd/what/foo", True),
        ("test1File.wat", True),
        ("nonexistent/foo", True),
        ("nonexistent/foo/wat", True),
        ("test1", False),
        ("test2", False),
        ("test.swp", False),
        ("node_modules/what.js", False),
        ("node_modules", False),
        ("foo/bar.wat", False),
        ("othernonexistent/blah/what", False),
        ("nonexistent", False),
        ("nonexistent/bar", False),
    ],
)
def test_the_core_tools_emulation_gives_core_tools_own_verdicts(path: str, accepted: bool):
    assert CoreToolsIgnore(CORE_TOOLS_SAMPLE).accepts(path) is accepted
