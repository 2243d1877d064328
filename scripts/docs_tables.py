"""The tables of ``docs/inputs.md`` that come from the field definitions, written from them.

The planner options are defined once (:data:`optimizer.problem.options.OPTION_SPECS`); their table in
the docs is generated here, between two marks, so that it cannot drift from the definition::

    python scripts/docs_tables.py           # exit 1 and say which table is stale
    python scripts/docs_tables.py --write   # rewrite the stale tables in place

``tests/test_docs_tables.py`` runs the check.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer.problem.fields import FieldSpec  # noqa: E402
from optimizer.problem.options import OPTION_SPECS  # noqa: E402

INPUTS = ROOT / "docs" / "inputs.md"
BEGIN = "<!-- options table: written by scripts/docs_tables.py from optimizer/problem/options.py -->"
END = "<!-- end of the options table -->"


def accepts(spec: FieldSpec) -> str:
    """What a field takes, in words: its choices, its range with its unit, or its kind; and its other form."""
    if spec.either is not None:
        return f"{_one_form(spec)}, or {_one_form(spec.either)}"
    return _one_form(spec)


def _one_form(spec: FieldSpec) -> str:
    if spec.choices:
        return ", ".join(f"`{choice}`" for choice in spec.choices)
    if spec.kind == "bool":
        return "`true`, `false`"
    kind = "integer" if spec.kind == "int" else "number"
    if spec.range is None:
        return kind
    span = spec.range.span
    return f"{kind} {span}" + (f" {spec.range.unit}" if spec.range.unit else "")


def default(spec: FieldSpec) -> str:
    if spec.default is None:
        return "-"
    if isinstance(spec.default, bool):
        return f"`{str(spec.default).lower()}`"
    if isinstance(spec.default, float) and spec.default.is_integer():
        return f"`{int(spec.default)}`"
    return f"`{spec.default}`"


def options_table() -> str:
    rows = ["| option | flag | accepts | default | meaning |", "|---|---|---|---|---|"]
    for spec in OPTION_SPECS:
        flag = f"`{spec.flag}`" if spec.flag else "-"
        rows.append(f"| `{spec.name}` | {flag} | {accepts(spec)} | {default(spec)} | {spec.help} |")
    return "\n".join(rows)


def rewritten(text: str) -> str:
    """``text`` with the options table between its marks as the definitions give it."""
    head, begin, rest = text.partition(BEGIN)
    body, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{INPUTS} lacks the marks {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{options_table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = INPUTS.read_text(encoding="utf-8")
    fresh = rewritten(text)
    if fresh == text:
        print(f"{INPUTS.relative_to(ROOT)}: the options table matches the definitions")
        return 0
    if "--write" in argv:
        INPUTS.write_text(fresh, encoding="utf-8")
        print(f"{INPUTS.relative_to(ROOT)}: options table rewritten")
        return 0
    print(f"{INPUTS.relative_to(ROOT)}: the options table is stale; run python scripts/docs_tables.py --write")
    return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
