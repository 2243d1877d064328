"""The epoch summary: predicted epoch time against static layouts, the distribution of gaps to the
lower bound, and the communicators each step adds."""

from __future__ import annotations

from typing import Any

import numpy as np

from jobs.planfile import new_communicators

GAP_BINS = (0.0, 0.005, 0.01, 0.02, 0.05, 0.10, float("inf"))


def _quantiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    q = np.quantile(values, [0.0, 0.5, 0.9, 0.99, 1.0])
    return {
        "min": float(q[0]),
        "median": float(q[1]),
        "p90": float(q[2]),
        "p99": float(q[3]),
        "max": float(q[4]),
        "mean": float(values.mean()),
    }


def static_mesh(ok: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best single power-of-two group size for every step of the epoch (a static mesh) and its epoch time."""
    if not ok:
        return None
    common = set(ok[0]["static_degrees"])
    for r in ok[1:]:
        common &= set(r["static_degrees"])
    best = None
    for c in sorted(common):
        total = sum(r["static_times"][r["static_degrees"].index(c)] for r in ok)
        if best is None or total < best[1]:
            best = (c, total)
    if best is None:
        return None
    return {"degree": best[0], "epoch_time_s": best[1]}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of an epoch's records (in step order)."""
    ok = [r for r in records if r["status"] == "ok"]
    failed = [r for r in records if r["status"] != "ok"]
    predicted = float(sum(r["predicted_step_time_s"] for r in ok))
    out: dict[str, Any] = {
        "steps": len(records),
        "planned": len(ok),
        "failed": len(failed),
        "predicted_epoch_time_s": predicted,
        "lower_bound_epoch_s": float(sum(r["lower_bound_s"] for r in ok)),
    }
    per_step = [r["static_step_time_s"] for r in ok if r.get("static_step_time_s") is not None]
    if ok and len(per_step) == len(ok):
        total = float(sum(per_step))
        out["static_per_step"] = {
            "epoch_time_s": total,
            "speedup": total / predicted if predicted > 0 else None,
            "what": "each step on its own best static power-of-two layout",
        }
    mesh = static_mesh(ok)
    if mesh is not None:
        mesh["speedup"] = mesh["epoch_time_s"] / predicted if predicted > 0 else None
        mesh["what"] = "one power-of-two group size for the whole epoch (a static mesh), the best one"
        out["static_mesh"] = mesh
    gaps = np.array([r["gap"] for r in ok], dtype=np.float64)
    out["gap"] = _quantiles(gaps)
    if gaps.size:
        counts = np.histogram(gaps, bins=np.array(GAP_BINS))[0].tolist()
        out["gap_histogram"] = [
            {
                "from": GAP_BINS[i],
                "to": GAP_BINS[i + 1] if GAP_BINS[i + 1] != float("inf") else None,
                "steps": counts[i],
            }
            for i in range(len(counts))
        ]
    new = [n for r, n in zip(records, new_communicators(records), strict=True) if r["status"] == "ok"]
    if new:
        later = np.array(new[1:], dtype=np.float64)
        out["new_communicators"] = {
            "distinct": int(sum(new)),
            "first_step": int(new[0]),
            "later_steps_with_new": int((later > 0).sum()),
            "later_max": int(later.max()) if later.size else 0,
            "later_mean": float(later.mean()) if later.size else 0.0,
        }
    wall = [r.get("wall_ms", 0.0) for r in records]
    cpu = [r.get("cpu_ms", 0.0) for r in records]
    out["planning_ms"] = {
        "total": float(sum(wall)),
        "mean_per_step": float(np.mean(wall)) if wall else 0.0,
        "cpu_total": float(sum(cpu)),
        "cpu_mean_per_step": float(np.mean(cpu)) if cpu else 0.0,
    }
    out["failures"] = [
        {k: r["error"].get(k) for k in ("step", "sample", "kind", "field", "message", "hint")} for r in failed[:1000]
    ]
    return out


def summary_text(s: dict[str, Any]) -> str:
    lines = [
        f"steps: {s['steps']} ({s['planned']} planned, {s['failed']} failed)",
        f"predicted epoch time: {s['predicted_epoch_time_s']:.6g} s (lower bound {s['lower_bound_epoch_s']:.6g} s)",
    ]
    if "static_per_step" in s:
        st = s["static_per_step"]
        lines.append(f"best static layout per step: {st['epoch_time_s']:.6g} s -> speedup {st['speedup']:.3f}x")
    if "static_mesh" in s:
        m = s["static_mesh"]
        lines.append(
            f"best static mesh for the epoch (CP {m['degree']} everywhere): {m['epoch_time_s']:.6g} s -> speedup "
            f"{m['speedup']:.3f}x"
        )
    g = s.get("gap")
    if g:
        lines.append(
            f"gap to lower bound: median {g['median'] * 100:.2f}%, p90 {g['p90'] * 100:.2f}%, "
            f"p99 {g['p99'] * 100:.2f}%, max {g['max'] * 100:.2f}%"
        )
    nc = s.get("new_communicators")
    if nc:
        lines.append(
            f"communicators: {nc['distinct']} distinct, {nc['first_step']} at the first step; "
            f"later steps adding new ones: {nc['later_steps_with_new']} (at most {nc['later_max']}, "
            f"mean {nc['later_mean']:.2f})"
        )
    pm = s["planning_ms"]
    lines.append(
        f"planning time, summed over steps: {pm['total'] / 1000:.1f} s wall ({pm['mean_per_step']:.1f} ms per step), "
        f"{pm.get('cpu_total', 0.0) / 1000:.1f} s CPU ({pm.get('cpu_mean_per_step', 0.0):.1f} ms per step)"
    )
    for f in s["failures"][:10]:
        sample = f" sample {f['sample']!r}" if f.get("sample") else ""
        lines.append(f"failed: step {f['step']}{sample}: {f.get('field') or ''}: {f['message']}")
    if s["failed"] > 10:
        lines.append(f"... {s['failed'] - 10} more failed steps (see index.json)")
    return "\n".join(lines)
