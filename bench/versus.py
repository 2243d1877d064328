"""dhp against the real FlexSP solver under the same profiles (``dhp bench --suite flexsp``).

Per case (profile, workload, ranks, samples, seed) the grid records, all scored by the verifier under
the case's profile:

- ``dhp-default``: ``plan()`` with the engine's default options (200 ms budget, backend auto);
- ``dhp-1s``: the same with a 1 s budget (the exact path has time to work);
- ``dhp-heuristic-default``: the same with backend ``heuristic`` (the heuristic alone);
- ``flexsp``: the real FlexSP solver (:mod:`bench.flexsp_real`), skipped with the reason recorded where
  its cost model cannot express the profile (ring profiles such as the analytical one);
- the lower bound (under groups up to the whole domain, the rule FlexSP plans with), and the wall
  time of each call (dhp: the whole ``plan()`` call against its budget; FlexSP: its solve call).

Summary lines: the cases where dhp at 200 ms is at most FlexSP's step time, the median and worst ratio
of dhp at 1 s to the bound, and whether dhp at 1 s is strictly faster than the heuristic alone on
every case where the heuristic is more than 3% above the bound.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.plots import pyplot, save_figure

HEURISTIC, DEFAULT, ONE_S, FLEXSP = "dhp-heuristic-default", "dhp-default", "dhp-1s", "flexsp"
PLANNERS = (HEURISTIC, DEFAULT, ONE_S, FLEXSP)
GAP_FOR_EXACT = 1.03
"""Heuristic step time above this multiple of the bound: cases where the exact path should improve on it."""

FULL: dict[str, Any] = {
    "workloads": ("video", "long-text", "mixed", "image-sft", "anyres"),
    "ranks": (64, 256),
    "samples": (512,),
    "seeds": 3,
    "profiles": ("analytical", "flexsp-gpt7b", "flexsp-gpt30b", "stress-slow-inter", "stress-group-constant"),
    "planners": PLANNERS,
    "repeats": 1,
    "memory": False,
    "max_micro_batches": 512,
    "max_samples": 512,
}
"""The full grid: 5 workloads x 3 seeds x 64 and 256 ranks x 512 samples x 5 profiles."""

QUICK: dict[str, Any] = {
    **FULL,
    "workloads": ("video",),
    "ranks": (16,),
    "samples": (32,),
    "seeds": 1,
    "profiles": ("flexsp-gpt7b",),
    "max_micro_batches": 32,
}
"""A small variant (CI): one video batch of 32 samples on 16 ranks under FlexSP's gpt-7b profile
(with a 1 s SCIP limit)."""
QUICK_TIME_LIMIT_S = 1.0


def median_or_none(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else f"{x:{spec}}"


def records_by_batch(doc: dict[str, Any]) -> dict[tuple[Any, ...], dict[str, dict[str, Any]]]:
    """A grid's records by batch (profile, workload, ranks, samples, seed), then by planner."""
    by: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in doc["records"]:
        by[(r.get("profile", "analytical"), r["workload"], r["ranks"], r["samples"], r["seed"])][r["planner"]] = r
    return by


def cases(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case: step times, bound, ratios and wall times of the four planners."""
    rows = []
    for (profile, w, ranks, n, seed), recs in records_by_batch(doc).items():
        row: dict[str, Any] = {"profile": profile, "workload": w, "ranks": ranks, "samples": n, "seed": seed}
        bound = next((r.get("lower_bound_s") for r in recs.values() if r.get("lower_bound_s") is not None), None)
        row["lower_bound_s"] = bound
        row["bound_source"] = next(
            (r.get("bound_source") for r in recs.values() if r.get("bound_source") is not None), None
        )
        for p in PLANNERS:
            r = recs.get(p, {})
            row[f"{p}_status"] = r.get("status")
            row[f"{p}_s"] = r.get("step_time_s") if r.get("status") == "ok" else None
            if r.get("status") not in (None, "ok"):
                row[f"{p}_note"] = r.get("note")
            walls = r.get("wall_ms") or []
            row[f"{p}_wall_ms"] = walls[0] if walls else None
        details = recs.get(FLEXSP, {}).get("details") or {}
        row["flexsp_solve_wall_s"] = details.get("solve_wall_s")
        row["flexsp_own_step_time_s"] = details.get("flexsp_predicted_step_time_s")
        f, d, one, h = row[f"{FLEXSP}_s"], row[f"{DEFAULT}_s"], row[f"{ONE_S}_s"], row[f"{HEURISTIC}_s"]
        row["dhp_over_flexsp"] = d / f if d and f else None
        row["dhp1s_over_flexsp"] = one / f if one and f else None
        row["dhp_over_bound"] = d / bound if d and bound else None
        row["dhp1s_over_bound"] = one / bound if one and bound else None
        row["heuristic_over_bound"] = h / bound if h and bound else None
        rows.append(row)
    return rows


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    rows = cases(doc)
    both = [r for r in rows if r["dhp_over_flexsp"] is not None]
    wins = [r for r in both if r[f"{DEFAULT}_s"] <= r[f"{FLEXSP}_s"] * (1 + 1e-9)]
    to_bound = [r["dhp1s_over_bound"] for r in rows if r["dhp1s_over_bound"] is not None]
    gap_cases = [
        r
        for r in rows
        if r["heuristic_over_bound"] is not None
        and r["heuristic_over_bound"] > GAP_FOR_EXACT
        and r[f"{ONE_S}_s"] is not None
    ]
    improved = [r for r in gap_cases if r[f"{ONE_S}_s"] < r[f"{HEURISTIC}_s"] * (1 - 1e-9)]
    walls: dict[str, list[float]] = {
        p: [r[f"{p}_wall_ms"] for r in rows if r[f"{p}_wall_ms"] is not None and r[f"{p}_status"] == "ok"]
        for p in PLANNERS
    }
    flexsp_walls = [r["flexsp_solve_wall_s"] for r in rows if r["flexsp_solve_wall_s"] is not None]
    per_profile = {}
    for prof in dict.fromkeys(r["profile"] for r in rows):
        mine = [r for r in rows if r["profile"] == prof]
        ratios = [r["dhp_over_flexsp"] for r in mine if r["dhp_over_flexsp"] is not None]
        per_profile[prof] = {
            "cases": len(mine),
            "with_flexsp": len(ratios),
            "dhp_wins_or_ties": sum(1 for x in ratios if x <= 1 + 1e-9),
            "median_dhp_over_flexsp": median_or_none(ratios),
            "worst_dhp_over_flexsp": max(ratios) if ratios else None,
            "median_dhp1s_over_bound": median_or_none(
                [r["dhp1s_over_bound"] for r in mine if r["dhp1s_over_bound"] is not None]
            ),
        }
    return {
        "cases": len(rows),
        "cases_with_flexsp": len(both),
        "dhp_default_at_most_flexsp": len(wins),
        "median_dhp_over_flexsp": median_or_none([r["dhp_over_flexsp"] for r in both]),
        "worst_dhp_over_flexsp": max((r["dhp_over_flexsp"] for r in both), default=None),
        "median_dhp1s_over_bound": median_or_none(to_bound),
        "worst_dhp1s_over_bound": max(to_bound, default=None),
        "bound_from_group_sizes": sum(1 for r in rows if r.get("bound_source") == "group_sizes"),
        "heuristic_gap_cases": len(gap_cases),
        "exact_path_strictly_better": len(improved),
        "exact_path_better_on_every_gap_case": len(improved) == len(gap_cases) if gap_cases else None,
        "wall_ms": {
            p: {"median": median_or_none(v), "max": max(v, default=None)} for p, v in walls.items() if p != FLEXSP
        },
        "flexsp_solve_wall_s": {"median": median_or_none(flexsp_walls), "max": max(flexsp_walls, default=None)},
        "per_profile": per_profile,
        "skipped_flexsp": sorted(
            {
                f"{r['profile']}: {(r.get(f'{FLEXSP}_note') or '').removeprefix('skipped: ')}"
                for r in rows
                if r[f"{FLEXSP}_status"] == "skipped"
            }
        ),
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The per-case table (Markdown; also what the command prints)."""
    head = [
        "profile",
        "workload",
        "ranks",
        "seed",
        "bound s",
        "heuristic s",
        "dhp@200ms s",
        "dhp@1s s",
        "FlexSP s",
        "dhp/FlexSP",
        "dhp@1s/FlexSP",
        "dhp/bound",
        "dhp@1s/bound",
        "dhp wall ms",
        "dhp@1s wall ms",
        "FlexSP wall s",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r["profile"], r["workload"], r["ranks"], r["seed"])):
        flex = fmt(r[f"{FLEXSP}_s"]) if r[f"{FLEXSP}_status"] == "ok" else (r[f"{FLEXSP}_status"] or "n/a")
        cells = [
            r["profile"],
            r["workload"],
            str(r["ranks"]),
            str(r["seed"]),
            fmt(r["lower_bound_s"]),
            fmt(r[f"{HEURISTIC}_s"]),
            fmt(r[f"{DEFAULT}_s"]),
            fmt(r[f"{ONE_S}_s"]),
            flex,
            fmt(r["dhp_over_flexsp"]),
            fmt(r["dhp1s_over_flexsp"]),
            fmt(r["dhp_over_bound"]),
            fmt(r["dhp1s_over_bound"]),
            fmt(r[f"{DEFAULT}_wall_ms"], ".0f"),
            fmt(r[f"{ONE_S}_wall_ms"], ".0f"),
            fmt(r["flexsp_solve_wall_s"], ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary_lines(s: dict[str, Any]) -> list[str]:
    w = s["wall_ms"]
    exact = s["exact_path_better_on_every_gap_case"]
    lines = [
        f"- dhp at 200 ms (default options) at most FlexSP's step time: {s['dhp_default_at_most_flexsp']} of "
        f"{s['cases_with_flexsp']} cases (dhp/FlexSP median {fmt(s['median_dhp_over_flexsp'])}, "
        f"worst {fmt(s['worst_dhp_over_flexsp'])})",
        f"- dhp at 1 s against the lower bound: median {fmt(s['median_dhp1s_over_bound'])}, "
        f"worst {fmt(s['worst_dhp1s_over_bound'])} ({s['cases']} cases; the bound is the group-size LP's on "
        f"{s.get('bound_from_group_sizes', 0)} of them, the engine's on the others)",
        "- exact path (dhp at 1 s) strictly better than the heuristic alone where the heuristic is > "
        f"{100 * (GAP_FOR_EXACT - 1):.0f}% above the bound: {s['exact_path_strictly_better']} of "
        f"{s['heuristic_gap_cases']} cases ({'yes' if exact else 'no' if exact is not None else 'no such case'})",
        f"- plan() wall time: at 200 ms median {fmt(w.get(DEFAULT, {}).get('median'), '.0f')} ms, "
        f"max {fmt(w.get(DEFAULT, {}).get('max'), '.0f')} ms; "
        f"at 1 s median {fmt(w.get(ONE_S, {}).get('median'), '.0f')} ms, "
        f"max {fmt(w.get(ONE_S, {}).get('max'), '.0f')} ms; "
        f"heuristic only median {fmt(w.get(HEURISTIC, {}).get('median'), '.0f')} ms",
        (
            f"- FlexSP solve wall time: median {fmt(s['flexsp_solve_wall_s']['median'], '.1f')} s, "
            f"max {fmt(s['flexsp_solve_wall_s']['max'], '.1f')} s"
        ),
    ]
    for prof, p in s["per_profile"].items():
        lines.append(
            f"- {prof}: {p['cases']} cases, FlexSP on {p['with_flexsp']}; "
            f"dhp at 200 ms at most FlexSP on {p['dhp_wins_or_ties']}; "
            f"dhp/FlexSP median {fmt(p['median_dhp_over_flexsp'])}, worst {fmt(p['worst_dhp_over_flexsp'])}; "
            f"dhp@1s/bound median {fmt(p['median_dhp1s_over_bound'])}"
        )
    for note in s["skipped_flexsp"]:
        lines.append(f"- FlexSP skipped under {note}")
    return lines


def plot(rows: list[dict[str, Any]], out: Path) -> list[str]:
    """One PNG per profile with FlexSP results: dhp's step time (200 ms and 1 s) against FlexSP's, per case."""
    plt = pyplot()
    from matplotlib.ticker import FormatStrFormatter

    paths = []
    for prof in dict.fromkeys(r["profile"] for r in rows):
        mine = [r for r in rows if r["profile"] == prof and r[f"{FLEXSP}_s"] is not None]
        if not mine:
            continue
        fig, ax = plt.subplots(figsize=(6, 5.5))
        for key, label, marker in ((DEFAULT, "dhp @ 200 ms", "o"), (ONE_S, "dhp @ 1 s", "x")):
            pts = [(r[f"{FLEXSP}_s"], r[f"{key}_s"]) for r in mine if r[f"{key}_s"] is not None]
            ax.scatter([x for x, _ in pts], [y for _, y in pts], marker=marker, label=label)
        lo = min(min(r[f"{FLEXSP}_s"], r[f"{DEFAULT}_s"] or r[f"{FLEXSP}_s"]) for r in mine) * 0.9
        hi = max(max(r[f"{FLEXSP}_s"], r[f"{DEFAULT}_s"] or 0.0) for r in mine) * 1.1
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="equal")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(FormatStrFormatter("%g"))
        ax.set_xlabel("FlexSP (real solver) step time, s")
        ax.set_ylabel("dhp step time, s")
        ax.set_title(f"{prof}: dhp against FlexSP, per case\n(below the line: dhp faster)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(save_figure(fig, out / f"versus_{prof}.png"))
    return paths


def bound_plot(rows: list[dict[str, Any]], out: Path) -> list[str]:
    """One PNG: each case's step time over its lower bound, per profile, for dhp at 200 ms and 1 s
    (and FlexSP where it ran); the worst cases of each profile are the points furthest up."""
    plt = pyplot()

    profiles = list(dict.fromkeys(r["profile"] for r in rows if r["lower_bound_s"]))
    if not profiles:
        return []
    series = [
        (DEFAULT, "dhp @ 200 ms", "o", -0.2),
        (ONE_S, "dhp @ 1 s", "x", 0.0),
        (FLEXSP, "FlexSP (real solver)", "^", 0.2),
    ]
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 + 1.5 * len(profiles)), 4.8))
    for key, label, marker, shift in series:
        xs, ys = [], []
        for i, prof in enumerate(profiles):
            for r in rows:
                if r["profile"] == prof and r[f"{key}_s"] is not None and r["lower_bound_s"]:
                    xs.append(i + shift)
                    ys.append(r[f"{key}_s"] / r["lower_bound_s"])
        if ys:
            ax.scatter(xs, ys, marker=marker, label=label, alpha=0.7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(profiles)))
    ax.set_xticklabels(profiles, rotation=20, fontsize=8)
    ax.set_ylabel("step time / lower bound")
    ax.set_title("How far each plan is from its lower bound, per case", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return [save_figure(fig, out / "to_bound.png")]


def write(doc: dict[str, Any], out: Path, command: str, plots: bool = True) -> tuple[dict[str, Any], list[str]]:
    """results.json, report.md and the plots in ``out``; returns the summary and the text printed."""
    out.mkdir(parents=True, exist_ok=True)
    rows = cases(doc)
    s = summarize(doc)
    (out / "results.json").write_text(
        json.dumps({**doc, "cases": rows, "summary": s, "command": command}, indent=1, default=str)
    )
    paths = plot(rows, out) + bound_plot(rows, out) if plots else []
    spec = doc["spec"]
    text = table(rows) + [""] + summary_lines(s)
    md = [
        "# dhp against the real FlexSP solver",
        "",
        f"Command: `{command}`",
        "",
        f"Workloads {', '.join(spec['workloads'])}; ranks {', '.join(map(str, spec['ranks']))}; "
        f"samples {', '.join(map(str, spec['samples']))}; {spec['seeds']} seeds; "
        f"profiles {', '.join(spec['profiles'])}. FlexSP: SCIP limit {spec['flexsp']['time_limit_s']:g} s per MILP, "
        f"at most {spec['flexsp']['workers']} processes, source {spec['flexsp']['src']}"
        + (f"; its answers taken from the earlier run {spec['flexsp']['reuse']}" if spec["flexsp"].get("reuse") else "")
        + f". Ran {doc['elapsed_s']:.0f} s.",
        "",
        "Every step time is the verifier's (`optimizer.verify.verifier.check_assignment`) under the case's profile. "
        "dhp plans with the engine's default options (micro-batches as the defaults allow, "
        "largest group as the default max_degree); the bound and the verification allow groups "
        "up to the whole domain, as FlexSP's plans use. Wall times: dhp's whole plan() call; "
        "FlexSP's solve call (its own process pools).",
        "",
        *text,
        "",
    ]
    md += [f"![{Path(p).stem}]({Path(p).name})" for p in paths]
    (out / "report.md").write_text("\n".join(md) + "\n")
    return s, text
