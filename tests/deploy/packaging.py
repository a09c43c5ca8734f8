"""Test tooling: build the deployment zip the way azd and Core Tools do, and a venv to index it.

`azd deploy` and `func azure functionapp publish` both zip the project directory minus the
paths `.funcignore` denies, each with a matcher of its own (``MATCHERS``): azd reads it as
gitignore syntax; Core Tools (a port of the gitignore-parser npm package) turns each line into a
regular expression matched at the start of the path and ending at a word boundary, so a pattern
without ``**/`` never reaches into a subdirectory, ``x/`` denies ``x/a`` but not ``x/.a`` or
``x/@a``, ``[...]`` is literal and ``*`` needs at least one character.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import pathspec
import pytest

ROOT = Path(__file__).resolve().parents[2]

RUNTIME_VERSION = "1.3.0"
"""azure-functions-runtime: the Python worker's function registry, installed test-only."""

APP_FILES = frozenset({"function_app.py", "host.json", "requirements.txt"})

# What pip prints when it cannot reach the index at all (DNS, no route, refused, timed out).
NETWORK_ERRORS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "Connection refused",
    "ProxyError",
    "Max retries exceeded",
)


def funcignore_spec(text: str) -> pathspec.PathSpec[pathspec.Pattern]:
    # "gitignore" is pathspec 1.x's name for the gitwildmatch patterns ("gitwildmatch" is
    # deprecated there): gitignore semantics, no Git-specific re-include edge cases.
    return pathspec.PathSpec.from_lines("gitignore", text.splitlines())


Matcher = Literal["azd", "core tools"]
MATCHERS: tuple[Matcher, ...] = ("azd", "core tools")


class CoreToolsIgnore:
    """``.funcignore`` as Core Tools' GitIgnoreParser reads it (Azure/azure-functions-core-tools,
    src/Cli/func/Common/GitIgnoreParser.cs): each line (``!`` lines apart, a leading ``/``
    dropped) a regular expression, ``**`` any characters, ``*`` one or more but no ``/``,
    everything else literal; the lines joined as ``^((a)|(b)|...)\\b``, matched at the start of
    the relative path. Its regexes are ECMAScript ones, whose ``\\b`` is ASCII (``re.ASCII``)."""

    def __init__(self, text: str) -> None:
        lines = [line.strip() for line in text.split("\n")]
        lines = [line for line in lines if line and not line.startswith("#")]
        deny = [line.removeprefix("/") for line in lines if not line.startswith("!")]
        keep = [line[1:].removeprefix("/") for line in lines if line.startswith("!")]
        self._deny, self._keep = self._either(deny), self._either(keep)

    @staticmethod
    def _either(patterns: list[str]) -> re.Pattern[str]:
        if not patterns:
            return re.compile(r"$^")
        either = ")|(".join(_core_tools_regex(p) for p in sorted(patterns))
        return re.compile("^((" + either + "))\\b", re.ASCII)

    def accepts(self, path: str) -> bool:
        return bool(self._keep.match(path)) or not self._deny.match(path)


def _core_tools_regex(pattern: str) -> str:
    escaped = re.sub(r"[\-\[\]/{}()+?.\\^$|]", lambda m: "\\" + m.group(0), pattern)
    return escaped.replace("**", "(.+)").replace("*", "([^\\/]+)")


def _links_back_up(parent: Path, name: str) -> bool:
    """Whether ``parent/name`` is a link to ``parent`` or one of its ancestors (a walk into it
    would not end; Core Tools would not finish either)."""
    target = (parent / name).resolve()
    return target == parent.resolve() or target in parent.resolve().parents


CORE_TOOLS_SKIPS = (
    {".git", ".vscode"},
    {".funcignore", ".gitignore", "local.settings.json", "project.lock.json"},
)
"""Directory and file names Core Tools leaves out (any case) whatever .funcignore says
(FileSystemHelpers.GetLocalFiles)."""


def package_paths(root: Path, funcignore: str | None = None, matcher: Matcher = "azd") -> list[str]:
    """The files of `root` that the package holds: every file `.funcignore` does not deny."""
    if funcignore is None:
        funcignore = (root / ".funcignore").read_text()
    if matcher == "core tools":
        return _core_tools_paths(root, CoreToolsIgnore(funcignore))
    spec = funcignore_spec(funcignore)
    kept: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if here == "." else f"{here}/"
        # A denied directory is not entered (nothing below it can be re-included).
        dirnames[:] = sorted(d for d in dirnames if not spec.match_file(f"{prefix}{d}/"))
        kept.extend(
            f"{prefix}{name}" for name in sorted(filenames) if not spec.match_file(prefix + name)
        )
    return sorted(kept)


def _core_tools_paths(root: Path, ignore: CoreToolsIgnore) -> list[str]:
    """Every file its matcher accepts: Core Tools walks them all, into every directory, through
    symbolic links too (.NET's directory listing follows them)."""
    skipped_dirs, skipped_files = ({n.lower() for n in names} for names in CORE_TOOLS_SKIPS)
    kept: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if here == "." else f"{here}/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d.lower() not in skipped_dirs and not _links_back_up(Path(dirpath), d)
        )
        kept.extend(
            f"{prefix}{name}"
            for name in sorted(filenames)
            if name.lower() not in skipped_files and ignore.accepts(prefix + name)
        )
    return sorted(kept)


def build_package(
    root: Path, zip_path: Path, funcignore: str | None = None, matcher: Matcher = "azd"
) -> set[str]:
    """Write the deployment zip of `root` to `zip_path`; return the names it holds."""
    paths = package_paths(root, funcignore, matcher)
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as package:
        for path in paths:
            package.write(root / path, path)
    with zipfile.ZipFile(zip_path) as package:
        return set(package.namelist())


def project_files(root: Path = ROOT) -> list[str]:
    """The project's files as they are: tracked ones plus new ones not yet committed (but
    not git-ignored), that exist in the working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({p for p in listed.split("\0") if p and (root / p).is_file()})


APP_ASSETS = (".py", ".html", ".js", ".css")
"""The sas package's modules, and the dashboard's page, script and style it serves."""


def expected_package(files: Iterable[str]) -> set[str]:
    """What the package must hold, exactly: the entry point, host.json, requirements.txt,
    the sas package's modules and assets, and the application's workflows."""
    return set(APP_FILES) | {
        p
        for p in files
        if p.startswith(("sas/", "workflows/"))
        and not p.startswith("sas/testing/")  # the test harness stays home
        and p.endswith(APP_ASSETS)
    }


def copy_files(files: Iterable[str], source: Path, target: Path) -> None:
    for path in files:
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / path, target / path)


def python311() -> str:
    found = shutil.which("python3.11")
    if found:
        return found
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    pytest.fail("python3.11 is not on PATH: the deployment tests need the app's Python")


def pip_install(python: Path, *args: str, what: str) -> None:
    """pip install into `python`'s venv; skip only if the package index cannot be reached."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode == 0:
        return
    output = f"{done.stdout}\n{done.stderr}"
    # CI (CI=true) reaches PyPI by construction: there a network error fails, never hides.
    if any(marker in output for marker in NETWORK_ERRORS) and not os.environ.get("CI"):
        pytest.skip(f"PyPI unreachable while installing {what}: {output.strip()[-600:]}")
    pytest.fail(f"installing {what} failed (exit {done.returncode}):\n{output[-4000:]}")


def run_in_package(
    python: Path, app_dir: Path, script: str, args: list[str], env: dict[str, str], tag: str
) -> dict[str, Any]:
    """Run ``script`` with ``python`` in ``app_dir`` (its cwd, as the worker's) with only ``env``;
    the JSON it prints after ``tag`` on one line of its output."""
    done = subprocess.run(
        [str(python), "-B", "-c", script, *args],
        cwd=app_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{tag} failed:\n{done.stderr[-4000:]}"
    [line] = [x for x in done.stdout.splitlines() if x.startswith(f"{tag} ")]
    result: dict[str, Any] = json.loads(line.removeprefix(f"{tag} "))
    return result
