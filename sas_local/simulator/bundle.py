"""Assemble the simulator's function app package: `python3 bundle.py [out]` (default `build`).

azd runs it before packaging the `simulator` service (azure.yaml), from this directory, with
whatever Python the deployer has: so the standard library only, and no import of sas_local.
The package: a function_app.py that imports `azure_app`, a host.json, the runtime lock
(requirements.txt, the app's: the simulator needs a subset of it), the `sas` package (the
simulator reads its wire rules) and this directory's modules.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODULES = ("__init__.py", "__main__.py", "app.py", "azure_app.py", "books.py", "faults.py")
"""This directory's modules the deployed simulator imports (not this script)."""
ENTRY = "from sas_local.simulator.azure_app import app\n"
"""The line that makes a directory an earlier package, which bundling again may replace."""
FUNCTION_APP = '"""sas\'s remote-service simulator (sas_local/simulator/azure_app.py)."""\n\n'
FUNCTION_APP += ENTRY + '\n__all__ = ["app"]\n'
HOST = {
    "version": "2.0",
    "extensions": {"http": {"routePrefix": ""}},  # the local simulator's URLs: /inventory/...
    # Beyond the slowest answer its faults allow (slow_seconds 600 s + an endpoint's 60 s).
    "functionTimeout": "00:12:00",
}


def bundle(out: Path) -> list[str]:
    """Write the package to ``out`` (emptied first); the files written, relative to it.

    ValueError if ``out`` holds anything but an earlier package: nothing else is deleted."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: a file, not a directory; nothing written")
    if out.exists() and any(out.iterdir()):
        earlier = out / "function_app.py"
        if not (earlier.is_file() and ENTRY in earlier.read_text()):
            raise ValueError(f"{out}: not empty and not a simulator package; nothing written")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "function_app.py").write_text(FUNCTION_APP)
    (out / "host.json").write_text(json.dumps(HOST, indent=2) + "\n")
    shutil.copy2(ROOT / "requirements.txt", out / "requirements.txt")
    for source in sorted((ROOT / "sas").rglob("*.py")):
        relative = source.relative_to(ROOT)
        if relative.parts[1] == "testing":  # the in-memory harness stays home, as in the app
            continue
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, out / relative)
    (out / "sas_local" / "simulator").mkdir(parents=True)
    shutil.copy2(ROOT / "sas_local" / "__init__.py", out / "sas_local" / "__init__.py")
    for name in MODULES:
        shutil.copy2(HERE / name, out / "sas_local" / "simulator" / name)
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else HERE / "build"
    try:
        files = bundle(out if out.is_absolute() else Path.cwd() / out)
    except ValueError as exc:
        print(f"bundle.py: {exc}", file=sys.stderr)
        return 2
    print(f"simulator package: {len(files)} files in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
