"""The docs' options table is the one the definitions give (``scripts/docs_tables.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import docs_tables  # noqa: E402

from optimizer.problem.options import OPTION_SPECS  # noqa: E402


def test_the_options_table_in_the_docs_matches_the_definitions():
    text = docs_tables.INPUTS.read_text(encoding="utf-8")
    assert docs_tables.rewritten(text) == text, "run: python scripts/docs_tables.py --write"
    for spec in OPTION_SPECS:
        assert f"| `{spec.name}` |" in text


def test_a_stale_table_is_found_and_rewritten():
    text = docs_tables.INPUTS.read_text(encoding="utf-8")
    stale = text.replace("| `time_budget_ms` |", "| `time_budget` |", 1)
    assert stale != text and docs_tables.rewritten(stale) == text
