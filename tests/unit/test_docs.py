"""The docs stand alone in the repository: what they name exists, and nothing cites a
document that is not in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("infra/*.md")])
TOP_LEVEL = ("sas/", "sas_local/", "sas_cli/", "tests/", "infra/", "docs/", ".ci/")
FILES = ("function_app.py", "host.json", "requirements.txt", "local.settings.example.json")
BACKTICKED = re.compile(r"`([^`\s]+)`")
OUTSIDE_DOCS = re.compile(r"(?:\.\./shared|\bpattern\.md|\bdesign\.md|\bfacts\.md)")


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / name for name in listed.split("\0") if name]


def named_paths(text: str) -> set[str]:
    named = set()
    for token in BACKTICKED.findall(text):
        path = token.split("::")[0].rstrip(".,:;")
        if path.startswith(TOP_LEVEL) or path in FILES:
            named.add(token.rstrip(".,:;"))
    return named


def test_the_architecture_document_exists() -> None:
    assert (ROOT / "docs" / "architecture.md").is_file()


LINE_BUDGETS = {"README.md": 200, "docs/architecture.md": 400}


@pytest.mark.parametrize(("name", "budget"), LINE_BUDGETS.items())
def test_a_doc_stays_within_its_line_budget(name: str, budget: int) -> None:
    lines = len((ROOT / name).read_text().splitlines())
    assert lines <= budget, f"{name} has {lines} lines, over {budget}: cut repetition and history"


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_file_and_test_a_doc_names_exists(doc: Path) -> None:
    """...or that the doc itself creates (a tutorial's ``<!-- file: PATH -->`` blocks)."""
    missing = []
    text = doc.read_text()
    created = set(re.findall(r"<!-- file: (\S+) -->", text))
    for token in sorted(named_paths(text)):
        path, _, test = token.partition("::")
        if path in created:
            continue
        target = ROOT / path
        if any(ch in path for ch in "*<>{}") or path.endswith("/"):
            if not any(ch in path for ch in "*<>{}") and not target.is_dir():
                missing.append(token)
            continue
        defined = rf"def {re.escape(test.split('[')[0])}\b"
        if not target.exists() or (test and not re.search(defined, target.read_text())):
            missing.append(token)
    assert missing == []


def test_nothing_in_the_repository_cites_a_document_outside_it() -> None:
    citing = []
    for path in tracked_files():
        if (
            path.suffix in {".png", ".zip"}
            or path.name == "package-lock.json"
            or path == Path(__file__)
        ):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_DOCS.search(line):
                citing.append(f"{path.relative_to(ROOT)}:{number}")
    assert citing == []
