"""`python -m sas.devhost`: see sas.devhost.cli."""

from __future__ import annotations

if __name__ == "__main__":
    from sas.devhost.cli import main

    raise SystemExit(main())
