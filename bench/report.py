"""Summaries, the Markdown report and PNG plots of a benchmark result document (see :mod:`bench.grid`)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.grid import percentile
from bench.planners import DEFAULT_RULES, LABELS, rules_of
from bench.plots import pyplot, save_figure

PLANNER = "dhp-heuristic"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def _planners(doc: dict[str, Any]) -> list[str]:
    return list(doc["spec"]["planners"])


def _label(r: dict[str, Any], several_profiles: bool) -> str:
    """The row a record belongs to: its workload, with its profile when the grid ran under several."""
    return f"{r['workload']} [{r.get('profile', 'analytical')}]" if several_profiles else r["workload"]


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    """Medians per workload (and profile) and planner, planning times per cluster size, and the goal checks."""
    several = len(doc["spec"].get("profiles") or ("analytical",)) > 1
    recs = [{**r, "workload": _label(r, several)} for r in doc["records"]]
    planners = _planners(doc)
    batches: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in recs:
        batches[(r["workload"], r["ranks"], r["samples"], r["seed"])][r["planner"]] = r
    speed: dict[tuple[str, str], list[float]] = defaultdict(list)
    speed_dep: dict[tuple[str, str], list[float]] = defaultdict(list)
    ratio: dict[tuple[str, str], list[float]] = defaultdict(list)
    ratio_all: dict[str, list[float]] = defaultdict(list)
    walls: dict[tuple[str, int], list[float]] = defaultdict(list)
    walls_cell: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    peak: dict[tuple[str, int], float] = {}
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    beaten: dict[tuple[str, str], int] = defaultdict(int)
    failures = []
    for (w, ranks, n, _seed), by in batches.items():
        dep = by.get("static-deployed", {})
        for p, r in by.items():
            if r.get("status") != "skipped":
                counts[w, p][1] += 1
            if r.get("status") != "ok":
                if r.get("status") not in ("infeasible", "skipped"):
                    failures.append(
                        {k: r.get(k) for k in ("workload", "ranks", "samples", "seed", "planner", "status", "note")}
                    )
                continue
            counts[w, p][0] += 1
            if "speedup_over_static_best" in r:
                speed[w, p].append(r["speedup_over_static_best"])
            if dep.get("status") == "ok":
                speed_dep[w, p].append(dep["step_time_s"] / r["step_time_s"])
            ratio[w, p].append(r["ratio_to_bound"])
            ratio_all[p].append(r["ratio_to_bound"])
        for p, r in by.items():
            if r.get("wall_ms"):
                walls[p, ranks].extend(r["wall_ms"])
                walls_cell[p, ranks, n].extend(r["wall_ms"])
            if r.get("peak_mb") is not None:
                peak[p, ranks] = max(peak.get((p, ranks), 0.0), r["peak_mb"])
        mine = by.get(PLANNER)
        if mine and mine.get("status") == "ok":
            for p in ("megatron", "bucket-milp", "flexsp", "static-best"):
                other = by.get(p)
                if other and other.get("status") == "ok" and other["step_time_s"] < mine["step_time_s"] * (1 - 1e-9):
                    beaten[w, p] += 1
    workloads = list(dict.fromkeys(r["workload"] for r in recs))
    per_workload = {
        w: {
            p: {
                "speedup_over_static_best": _median(speed[w, p]),
                "speedup_over_static_deployed": _median(speed_dep[w, p]),
                "ratio_to_bound": _median(ratio[w, p]),
                "valid": counts[w, p][0],
                "batches": counts[w, p][1],
                "batches_better_than_heuristic": beaten.get((w, p)),
            }
            for p in planners
        }
        for w in workloads
    }
    rank_list = sorted({r["ranks"] for r in recs})
    timing = {
        p: {
            str(k): {
                "median_ms": _median(walls[p, k]),
                "p99_ms": percentile(walls[p, k], 99) if walls[p, k] else None,
                "peak_mb": peak.get((p, k)),
            }
            for k in rank_list
        }
        for p in planners
    }
    timing_cells = [
        {"planner": p, "ranks": k, "samples": n, "median_ms": _median(v), "p99_ms": percentile(v, 99)}
        for (p, k, n), v in sorted(walls_cell.items())
    ]
    goals = {}
    mine_w = {w: per_workload[w][PLANNER] for w in workloads} if PLANNER in planners else {}
    if "video" in mine_w:
        goals["video_speedup_over_static_best"] = mine_w["video"]["speedup_over_static_best"]
        goals["video_speedup_over_static_deployed"] = mine_w["video"]["speedup_over_static_deployed"]
    if mine_w:
        goals["median_ratio_to_bound"] = _median(ratio_all[PLANNER])
        for p in ("megatron", "bucket-milp", "flexsp"):
            if p in planners:
                goals[f"at_least_{p}_on_every_workload"] = all(
                    (per_workload[w][PLANNER]["speedup_over_static_best"] or 0)
                    >= (per_workload[w][p]["speedup_over_static_best"] or 0) - 1e-9
                    for w in workloads
                )
    return {
        "per_workload": per_workload,
        "timing": timing,
        "timing_cells": timing_cells,
        "goals": goals,
        "failures": failures,
        "ratio_all": {p: _median(v) for p, v in ratio_all.items()},
    }


def _rules_note(doc: dict[str, Any]) -> list[str]:
    """A paragraph naming the planners that ran under a runtime's rules (none: no paragraph)."""
    ruled = [p for p in _planners(doc) if rules_of(p) != DEFAULT_RULES]
    if not ruled:
        return []
    return [
        f"Under Megatron-Core's rules ({'; '.join(LABELS[p] for p in ruled)}): planned, verified and scored "
        "with its aligned process groups, one sub-sample at a time in memory and barrier groups uncapped; ratio "
        "to the bound against the best bound proven under those rules; speedups over static at its best as a "
        "static mesh runs (the grid's rules).",
        "",
    ]


def markdown(doc: dict[str, Any], summary: dict[str, Any], command: str, plots: list[str]) -> str:
    planners = _planners(doc)
    spec = doc["spec"]
    lines = [
        "# dhp bench report",
        "",
        f"Command: `{command}`",
        "",
        f"Grid: workloads {', '.join(spec['workloads'])}; ranks {', '.join(map(str, spec['ranks']))}; "
        f"samples per rank {', '.join(map(str, spec['samples_per_rank']))} (at most {spec['max_samples']} samples); "
        f"{spec['seeds']} seeded batches per cell, {spec['repeats']} timed calls each after a warm-up; "
        f"budget {spec['budget_ms']:.0f} ms for the exact backend and the bucket MILP; exact backends: "
        f"{', '.join(doc['backends']) or 'none'}. Model {doc.get('model', 'qwen2-vl-7b')} (as many heads as ranks "
        "under a Ulysses profile), H100 nodes of 8 GPUs; cost profiles: "
        f"{', '.join(spec.get('profiles') or ['analytical'])}. Ran {doc['elapsed_s']:.0f} s.",
        "",
        (
            "All step times are the cost model's predictions; "
            "every plan was verified by `optimizer.verify.verifier.check_assignment`."
        ),
        "",
        *_rules_note(doc),
        "## Median speedup over static at its best (per batch, then median)",
        "",
        "| workload | " + " | ".join(LABELS[p] for p in planners) + " |",
        "|---|" + "---|" * len(planners),
    ]
    pw = summary["per_workload"]
    for w, by in pw.items():
        lines.append(
            f"| {w} | " + " | ".join(_fmt(by[p]["speedup_over_static_best"], ".2f", "x") for p in planners) + " |"
        )
    lines += [
        "",
        "## Median speedup over static as deployed",
        "",
        "| workload | " + " | ".join(LABELS[p] for p in planners) + " |",
        "|---|" + "---|" * len(planners),
    ]
    for w, by in pw.items():
        lines.append(
            f"| {w} | " + " | ".join(_fmt(by[p]["speedup_over_static_deployed"], ".2f", "x") for p in planners) + " |"
        )
    lines += [
        "",
        "## Median ratio to the lower bound (1.00 = provably optimal)",
        "",
        "| workload | " + " | ".join(LABELS[p] for p in planners) + " |",
        "|---|" + "---|" * len(planners),
    ]
    for w, by in pw.items():
        lines.append(f"| {w} | " + " | ".join(_fmt(by[p]["ratio_to_bound"], ".3f") for p in planners) + " |")
    lines.append("| all | " + " | ".join(_fmt(summary["ratio_all"].get(p), ".3f") for p in planners) + " |")
    lines += [
        "",
        "## Valid plans (verified / batches)",
        "",
        "| workload | " + " | ".join(LABELS[p] for p in planners) + " |",
        "|---|" + "---|" * len(planners),
    ]
    for w, by in pw.items():
        lines.append(f"| {w} | " + " | ".join(f"{by[p]['valid']}/{by[p]['batches']}" for p in planners) + " |")
    lines += [
        "",
        "## Planning wall time, median / p99 in ms (peak traced memory in MiB), by cluster size",
        "",
        "Times cover the whole call from the problem (cost tables included); the dhp planners' calls include the "
        "lower bound, the best static layout as a floor and verification. Memory is the peak of Python allocations "
        "under tracemalloc (the solvers' own C++ memory is not traced).",
        "",
        "| ranks | " + " | ".join(LABELS[p] for p in planners) + " |",
        "|---|" + "---|" * len(planners),
    ]
    ranks = sorted({int(k) for p in planners for k in summary["timing"][p]})
    for k in ranks:
        cells = []
        for p in planners:
            t = summary["timing"][p].get(str(k), {})
            cells.append(
                f"{_fmt(t.get('median_ms'), '.1f')} / {_fmt(t.get('p99_ms'), '.1f')} ({_fmt(t.get('peak_mb'), '.1f')})"
            )
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["", "## Goals (dhp heuristic)", ""]
    g = summary["goals"]
    if g:
        lines.append(
            "- median speedup over static at its best on long-tail video: "
            f"{_fmt(g.get('video_speedup_over_static_best'), '.2f', 'x')} (goal >= 1.30x); "
            f"over static as deployed: {_fmt(g.get('video_speedup_over_static_deployed'), '.2f', 'x')}"
        )
        lines.append(
            f"- median ratio to the lower bound across the grid: {_fmt(g.get('median_ratio_to_bound'), '.3f')} "
            "(goal <= 1.05)"
        )
        for p in ("megatron", "bucket-milp", "flexsp"):
            key = f"at_least_{p}_on_every_workload"
            if key in g:
                lines.append(
                    f"- median speedup at least the {LABELS[p]}'s on every workload: {'yes' if g[key] else 'no'}"
                )
        rivals = ("static-best", "megatron", "bucket-milp", "flexsp")
        worse = {
            w: {
                p: by[p]["batches_better_than_heuristic"]
                for p in rivals
                if p in by and by[p]["batches_better_than_heuristic"]
            }
            for w, by in pw.items()
        }
        worse = {w: v for w, v in worse.items() if v}
        if worse:
            lines.append(
                "- batches where a baseline beat the heuristic: "
                + "; ".join(f"{w}: " + ", ".join(f"{LABELS[p]} {c}" for p, c in v.items()) for w, v in worse.items())
            )
    if summary["failures"]:
        lines += [
            "",
            "## Planners without a valid plan",
            "",
            "| workload | ranks | samples | seed | planner | status | note |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in summary["failures"][:40]:
            note = (f.get("note") or "").replace("|", "/")[:140]
            lines.append(
                f"| {f['workload']} | {f['ranks']} | {f['samples']} | {f['seed']} | {f['planner']} | "
                f"{f['status']} | {note} |"
            )
        if len(summary["failures"]) > 40:
            lines.append(f"| ... | | | | | | {len(summary['failures']) - 40} more in results.json |")
    if doc.get("skipped"):
        skipped = ", ".join(f"{s['workload']} {s['ranks']}x{s['samples']}" for s in doc["skipped"])
        lines += ["", f"Skipped cells (above max_samples): {skipped}."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], summary: dict[str, Any], out: Path) -> list[str]:
    """speedup.png, ratio_to_bound.png and planning_time.png in ``out``; returns their paths."""
    plt = pyplot()

    planners = _planners(doc)
    pw = summary["per_workload"]
    workloads = list(pw)
    paths = []
    width = 0.8 / max(1, len(planners))
    for key, name, title, ylabel, ref in (
        ("speedup_over_static_best", "speedup.png", "Median speedup over static at its best", "speedup (x)", 1.0),
        ("ratio_to_bound", "ratio_to_bound.png", "Median step time / lower bound", "ratio (1 = optimal)", 1.0),
    ):
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for j, p in enumerate(planners):
            ys = [pw[w][p][key] or 0.0 for w in workloads]
            ax.bar(
                [i + (j - (len(planners) - 1) / 2) * width for i in range(len(workloads))], ys, width, label=LABELS[p]
            )
        ax.axhline(ref, color="black", linewidth=0.8)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if key == "ratio_to_bound":
            top = max((pw[w][p][key] or 1.0) for w in workloads for p in planners)
            ax.set_ylim(0.9, min(top * 1.05, 3.0))
        ax.legend(fontsize=8, ncol=3)
        paths.append(save_figure(fig, out / name))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in planners:
        pts = sorted((int(k), v["median_ms"]) for k, v in summary["timing"][p].items() if v["median_ms"])
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=LABELS[p])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks")
    ax.set_ylabel("planning wall time, median (ms)")
    ax.set_title("Planning time against cluster size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(save_figure(fig, out / "planning_time.png"))
    return paths


def write_report(doc: dict[str, Any], out: Path, command: str, plots: bool = True) -> dict[str, Any]:
    """results.json, report.md and the plots in ``out``; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(doc)
    (out / "results.json").write_text(
        json.dumps({**doc, "summary": summary, "command": command}, indent=1, default=str)
    )
    paths = plot(doc, summary, out) if plots else []
    (out / "report.md").write_text(markdown(doc, summary, command, paths))
    return summary
