"""Calibration: predicted against measured step times from trainer feedback, by profile and cluster.

A group's verdict says when its cost profile no longer describes the cluster: ``re-profile`` when the
median error of at least 3 steps is above 10%, ``watch`` above 5%, else ``ok``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from typing import Any

from api.store.profile_names import profile_name

WATCH = 0.05
REPROFILE = 0.10
MIN_POINTS = 3
EDGES = [round(-0.5 + 0.05 * k, 2) for k in range(21)]


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty list."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarise(profile: str, cluster: str | None, ratios: list[float], name: str | None = None) -> dict[str, Any]:
    """The figures of one group: ``profile`` its label, ``name`` the name shown (the label's profile name when
    not given)."""
    errors = [abs(r - 1.0) for r in ratios]
    median_err = _quantile(errors, 0.5)
    verdict = "ok"
    if median_err > REPROFILE and len(ratios) >= MIN_POINTS:
        verdict = "re-profile"
    elif median_err > WATCH:
        verdict = "watch"
    return {
        "profile": profile,
        "profile_name": profile_name(profile) if name is None else name,
        "cluster": cluster,
        "n": len(ratios),
        "median_ratio": _quantile(ratios, 0.5),
        "mean_abs_error": sum(errors) / len(errors),
        "p90_abs_error": _quantile(errors, 0.9),
        "verdict": verdict,
    }


def histogram(ratios: list[float]) -> dict[str, Any]:
    """Counts of measured / predicted - 1 in 5% bins from -50% to +50%; the outer bins hold what lies beyond."""
    counts = [0] * (len(EDGES) - 1)
    for r in ratios:
        k = bisect_right(EDGES, r - 1.0) - 1  # bins closed on the left
        counts[min(max(k, 0), len(counts) - 1)] += 1
    return {"edges": EDGES, "counts": counts}


def calibration(rows: list[dict[str, Any]], total: int, points: int) -> dict[str, Any]:
    """Figures over every row given (newest first); the ``points`` newest go out for the scatter, each with the
    index of its profile and cluster group (so the long profile names are sent once)."""
    by_group: dict[tuple[str, str | None], list[float]] = defaultdict(list)
    kept: list[tuple[dict[str, Any], float, tuple[str, str | None]]] = []
    for r in rows:
        if not r["predicted_step_time_s"] or r["predicted_step_time_s"] <= 0:
            continue
        ratio = r["measured_step_time_s"] / r["predicted_step_time_s"]
        key = (r["profile"], r["cluster"])
        by_group[key].append(ratio)
        if len(kept) < points:
            kept.append((r, ratio, key))
    keys = sorted(by_group, key=lambda k: (k[0], k[1] or ""))
    index = {k: i for i, k in enumerate(keys)}
    ratios = [x for v in by_group.values() for x in v]
    return {
        "points": [
            {
                "feedback_id": r["id"],
                "plan_id": r["plan_id"],
                "predicted_step_time_s": r["predicted_step_time_s"],
                "measured_step_time_s": r["measured_step_time_s"],
                "ratio": ratio,
                "group": index[key],
            }
            for r, ratio, key in kept
        ],
        "total": total,
        "groups": [summarise(p, c, by_group[(p, c)]) for p, c in keys],
        "histogram": histogram(ratios),
        "overall": summarise("all", None, ratios, name="all") if ratios else None,
    }
