"""Session fixtures: the package as deployed now, and one requirements-only venv to index it.

The venv and the runtime wheel cost 30-90 s, so they are made once per session (pip's own
cache is reused). Outside CI the tests skip when PyPI cannot be reached; any other failure fails.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.deploy.packaging import ROOT, RUNTIME_VERSION, build_package, pip_install, python311


@pytest.fixture(scope="session")
def package_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zip azd would upload from this working tree, as it is."""
    zip_path = tmp_path_factory.mktemp("package") / "sas.zip"
    build_package(ROOT, zip_path)
    return zip_path


@pytest.fixture(scope="session")
def package_dir(package_zip: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package unzipped, as the Functions host sees it in /home/site/wwwroot."""
    target = tmp_path_factory.mktemp("wwwroot")
    with zipfile.ZipFile(package_zip) as package:
        package.extractall(target)
    return target


@pytest.fixture(scope="session")
def app_python(package_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with only the package's own requirements.txt installed: no dev tools."""
    venv = tmp_path_factory.mktemp("venv") / "app"
    subprocess.run([python311(), "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip_install(
        python, "-r", str(package_dir / "requirements.txt"), what="the package's requirements.txt"
    )
    return python


@pytest.fixture(scope="session")
def runtime_dir(app_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """azure-functions-runtime (the worker's registry), in a folder of its own, test-only.

    The wheel is pure Python and declares Python >= 3.13, but works on 3.11."""
    target = tmp_path_factory.mktemp("runtime")
    pip_install(
        app_python,
        "--no-deps",
        "--ignore-requires-python",
        "--target",
        str(target),
        f"azure-functions-runtime=={RUNTIME_VERSION}",
        what=f"azure-functions-runtime=={RUNTIME_VERSION}",
    )
    return target
