"""Syntax check of every Bicep file under infra/ (no Bicep compiler can be installed here).

pycep-parser is syntax-only: unknown resource types, symbols and properties pass. One valid
construct it rejects is a loop with a condition (``[for x in xs: if (c) {...}]``); the infra
filters the array instead (``[for x in (c ? xs : [])]``) or puts the condition on a module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lark.exceptions import LarkError
from pycep import BicepParser

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
BICEP_FILES = sorted(INFRA.rglob("*.bicep"))


@pytest.fixture(scope="module")
def parser() -> BicepParser:
    return BicepParser()


def parse(parser: BicepParser, path: Path) -> dict[str, Any]:
    return dict(parser.parse(file_path=path))


def test_infra_has_bicep_files() -> None:
    names = {path.relative_to(INFRA).as_posix() for path in BICEP_FILES}

    assert "main.bicep" in names
    assert any(name.startswith("modules/") for name in names)


@pytest.mark.parametrize("path", BICEP_FILES, ids=lambda p: p.relative_to(INFRA).as_posix())
def test_bicep_file_parses(parser: BicepParser, path: Path) -> None:
    parsed = parse(parser, path)

    declared = parsed.get("resources") or parsed.get("modules") or parsed.get("outputs")
    assert declared, f"{path.name} declares nothing"


def test_main_targets_the_subscription(parser: BicepParser) -> None:
    parsed = parse(parser, INFRA / "main.bicep")

    assert parsed["globals"]["scope"]["value"] == "subscription"


def test_every_module_main_uses_exists(parser: BicepParser) -> None:
    parsed = parse(parser, INFRA / "main.bicep")
    paths = [module["detail"]["path"] for module in parsed["modules"].values()]

    assert paths
    for relative in paths:
        assert (INFRA / relative).is_file(), f"main.bicep uses missing module {relative}"
    nested = parse(parser, INFRA / "modules" / "simulator.bicep")["modules"].values()
    for relative in (module["detail"]["path"] for module in nested):
        assert (INFRA / "modules" / relative).is_file(), f"simulator.bicep uses {relative}"


def without_last_closing_brace(text: str) -> str:
    index = text.rindex("}")
    return text[:index] + text[index + 1 :]


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(without_last_closing_brace, id="missing-closing-brace"),
        pytest.param(lambda t: t.replace("param location string", "param location", 1),
                     id="param-without-type"),
        pytest.param(lambda t: t.replace("'Microsoft.Resources", "Microsoft.Resources", 1),
                     id="unterminated-string"),
    ],
)  # fmt: skip
def test_a_broken_copy_fails_to_parse(parser: BicepParser, tmp_path: Path, breakage: Any) -> None:
    """The check can fail: a damaged copy of main.bicep is rejected."""
    original = (INFRA / "main.bicep").read_text()
    broken = breakage(original)
    assert broken != original, "the breakage did not change the file"
    copy = tmp_path / "main.bicep"
    copy.write_text(broken)

    with pytest.raises(LarkError):
        parser.parse(file_path=copy)
