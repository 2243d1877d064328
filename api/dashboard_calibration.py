"""Calibration: predicted against measured step times from trainer feedback, by profile and cluster.

A group's verdict says when its cost profile no longer describes the cluster: ``re-profile`` when the
median error of at least 3 steps is above 10%, ``watch`` above 5%, else ``ok``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from typing import Any

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


def summarise(profile: str, cluster: str | None, ratios: list[float]) -> dict[str, Any]:
    errors = [abs(r - 1.0) for r in ratios]
    median_err = _quantile(errors, 0.5)
    verdict = "ok"
    if median_err > REPROFILE and len(ratios) >= MIN_POINTS:
        verdict = "re-profile"
    elif median_err > WATCH:
        verdict = "watch"
    return {"profile": profile, "cluster": cluster, "n": len(ratios), "median_ratio": _quantile(ratios, 0.5), "mean_abs_error": sum(errors) / len(errors),
            "p90_abs_error": _quantile(errors, 0.9), "verdict": verdict}


def histogram(ratios: list[float]) -> dict[str, Any]:
    """Counts of measured / predicted - 1 in 5% bins from -50% to +50%; the outer bins hold what lies beyond."""
    counts = [0] * (len(EDGES) - 1)
    for r in ratios:
        k = bisect_right(EDGES, r - 1.0) - 1  # bins closed on the left
        counts[min(max(k, 0), len(counts) - 1)] += 1
    return {"edges": EDGES, "counts": counts}


def calibration(rows: list[dict[str, Any]], total: int) -> dict[str, Any]:
    points = []
    by_group: dict[tuple[str, str | None], list[float]] = defaultdict(list)
    for r in rows:
        ratio = r["measured_step_time_s"] / r["predicted_step_time_s"] if r["predicted_step_time_s"] > 0 else None
        if ratio is None:
            continue
        points.append({"feedback_id": r["id"], "plan_id": r["plan_id"], "predicted_step_time_s": r["predicted_step_time_s"],
                       "measured_step_time_s": r["measured_step_time_s"], "ratio": ratio, "cluster": r["cluster"], "model": r["model"],
                       "profile": r["profile"]})
        by_group[(r["profile"], r["cluster"])].append(ratio)
    ratios = [p["ratio"] for p in points]
    groups = [summarise(p, c, v) for (p, c), v in sorted(by_group.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]
    return {"points": points, "total": total, "groups": groups, "histogram": histogram(ratios),
            "overall": summarise("all", None, ratios) if ratios else None}
