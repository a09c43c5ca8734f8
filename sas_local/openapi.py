"""docs/openapi.json: the HTTP API's OpenAPI schema, as the app itself serves it at
/api/openapi.json. `make openapi` rewrites it; tests/unit/test_openapi.py fails when it is stale.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sas.entrypoints.http_api import api

DOC = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"


def schema_text() -> str:
    return json.dumps(api.openapi(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the HTTP API's OpenAPI schema.")
    parser.add_argument("--out", type=Path, default=DOC)
    args = parser.parse_args(argv)
    args.out.write_text(schema_text(), encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
