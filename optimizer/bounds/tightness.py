"""How tight each lower bound is known to be: measured against proven optima, said beside a plan's gap.

A plan's gap to its bound is the plan's distance from the optimum plus the bound's distance below it;
a user reading "3% above the bound" needs to know which of the two it is. ``bench.optimum_gap
--write-tightness`` scores every bound against the proven optima of mid-size batches
(``tests/fixtures/optima.json``, made by ``bench.optimum_fixtures``) and writes
``optimizer/presets/bound_tightness.json``: for each bound, on how many of the optima it was the binding
one (the largest) and, there, how far below the optimum it lay (median, worst). :func:`tightness_note`
turns the record of the binding bound into the sentence a plan carries in ``solver.details.bound_tightness``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

FILE = Path(__file__).resolve().parent.parent / "presets" / "bound_tightness.json"


@functools.cache
def _records() -> dict[str, Any]:
    try:
        doc = json.loads(FILE.read_text())
    except (OSError, ValueError):  # not written yet, or unreadable: the plan then says nothing of it
        return {}
    return doc if isinstance(doc.get("bounds"), dict) else {}


def tightness_note(bound: str) -> str | None:
    """What the proven optima say of ``bound`` (a name of ``solver.details.bound``), or None when nothing
    was measured for it."""
    doc = _records()
    record = doc.get("bounds", {}).get(bound)
    if not record or not record.get("binding"):
        return None
    below_median = (1.0 - record["median"]) * 100.0
    below_worst = (1.0 - record["loosest"]) * 100.0
    return (
        f"{bound} was the binding bound on {record['binding']} of {doc['cases']} proven optima of mid-size "
        f"batches, and lay {below_median:.1f}% below the optimum in the median there, {below_worst:.1f}% at "
        f"worst (bench.optimum_gap, {doc['measured']})"
    )
