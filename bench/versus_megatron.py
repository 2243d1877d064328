"""dhp against Megatron-Core's own hybrid context-parallel scheduler (``dhp bench --suite megatron``).

Per batch (profile, workload, ranks, samples, seed), all planned, verified and scored under
Megatron-Core's rules (:data:`trainer.megatron.MEGATRON_RULES`) and the batch's profile:

- ``megatron``: Megatron-Core's ``BalancedCPScheduler`` (:mod:`bench.baselines.megatron_real`);
- ``dhp-megatron``: :class:`trainer.megatron.PlannedCPScheduler` at its 200 ms budget, the schedule
  Megatron would run from it;
- ``static-best-megatron``: static at its best under the same rules (one CP size for the batch, the
  samples balanced over its groups): the floor a dynamic schedule has to beat under Megatron's rules.
  It takes milliseconds, and tells whether Megatron's scheduler gains anything over one fixed size;
- the best lower bound proven under those rules, and the wall time of each scheduler's
  ``get_groups_and_subsamples`` call (the conversion to an assignment excluded).

Summary per profile: the batches where dhp's step time is below Megatron's, the speedup (Megatron's
step time over dhp's: median, min, max), both schedulers' median ratio to the bound and their wall
times (median, max). The table lists every batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.plots import pyplot, save_figure
from bench.versus import fmt, median_or_none, records_by_batch

MEGATRON, DHP, STATIC = "megatron", "dhp-megatron", "static-best-megatron"
PLANNERS = (MEGATRON, DHP, STATIC)
SCHEDULERS = (MEGATRON, DHP)

FULL: dict[str, Any] = {
    "workloads": ("video", "long-text", "mixed", "image-sft", "anyres"),
    "ranks": (64, 256),
    "samples": (512,),
    "seeds": 3,
    "profiles": ("flexsp-gpt7b", "stress-slow-inter", "stress-group-constant"),
    "planners": PLANNERS,
    "repeats": 1,
    "memory": False,
    "max_samples": 512,
}
"""The grid: 5 workloads x 3 seeds x 64 and 256 ranks x 512 samples x 3 profiles."""

QUICK: dict[str, Any] = {
    **FULL,
    "workloads": ("video",),
    "ranks": (16,),
    "samples": (64,),
    "seeds": 1,
    "profiles": ("flexsp-gpt7b",),
}
"""A small variant (CI): one video batch of 64 samples on 16 ranks under FlexSP's gpt-7b profile."""

LABEL = {MEGATRON: "Megatron", DHP: "dhp", STATIC: "static"}
SPEEDUPS = ("median_speedup", "min_speedup", "max_speedup")


def cases(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per batch: each planner's status, step time, ratio to the bound and wall time; the speedups."""
    rows = []
    for (profile, w, ranks, n, seed), recs in records_by_batch(doc).items():
        row: dict[str, Any] = {"profile": profile, "workload": w, "ranks": ranks, "samples": n, "seed": seed}
        for key in ("lower_bound_s", "bound_source"):
            row[key] = next((r[key] for r in recs.values() if r.get(key) is not None), None)
        for p in PLANNERS:
            r = recs.get(p, {})
            ok = r.get("status") == "ok"
            row[f"{p}_status"] = r.get("status")
            row[f"{p}_s"] = r.get("step_time_s") if ok else None
            row[f"{p}_ratio"] = r.get("ratio_to_bound") if ok else None
            row[f"{p}_wall_ms"] = median_or_none(r.get("wall_ms") or [])
            if r.get("status") not in (None, "ok"):
                row[f"{p}_note"] = r.get("note")
        m, d, s = row[f"{MEGATRON}_s"], row[f"{DHP}_s"], row[f"{STATIC}_s"]
        row["speedup"] = m / d if m and d else None
        row["megatron_over_static"] = m / s if m and s else None
        rows.append(row)
    return rows


def _profile_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    both = [r for r in rows if r["speedup"] is not None]
    speedups = [r["speedup"] for r in both]
    to_static = [r["megatron_over_static"] for r in rows if r["megatron_over_static"] is not None]
    out: dict[str, Any] = {
        "batches": len(rows),
        "with_both": len(both),
        "dhp_faster": sum(1 for r in both if r[f"{DHP}_s"] < r[f"{MEGATRON}_s"] * (1 - 1e-9)),
        "median_speedup": median_or_none(speedups),
        "min_speedup": min(speedups, default=None),
        "max_speedup": max(speedups, default=None),
        "megatron_slower_than_static": sum(1 for x in to_static if x > 1 + 1e-9),
        "with_static": len(to_static),
    }
    for p in PLANNERS:
        out[f"{p}_median_ratio"] = median_or_none([r[f"{p}_ratio"] for r in rows if r[f"{p}_ratio"] is not None])
    for p in SCHEDULERS:
        walls = [r[f"{p}_wall_ms"] for r in rows if r[f"{p}_wall_ms"] is not None and r[f"{p}_status"] == "ok"]
        out[f"{p}_wall_ms"] = {"median": median_or_none(walls), "max": max(walls, default=None)}
    return out


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    """The summary of every batch together (``all``) and per profile, and the reasons planners had no plan."""
    rows = cases(doc)
    profiles = dict.fromkeys(r["profile"] for r in rows)
    per_profile = {prof: _profile_summary([r for r in rows if r["profile"] == prof]) for prof in profiles}
    notes = sorted(
        {
            f"{r['profile']} {r['workload']} {r['ranks']}x{r['samples']} seed {r['seed']}: "
            f"{p} {r[f'{p}_status']}: {r.get(f'{p}_note')}"
            for r in rows
            for p in PLANNERS
            if r[f"{p}_status"] not in (None, "ok")
        }
    )
    return {"all": _profile_summary(rows), "per_profile": per_profile, "without_plan": notes}


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The per-batch table (Markdown)."""
    head = [
        "profile",
        "workload",
        "ranks",
        "seed",
        "bound s",
        "Megatron s",
        "dhp s",
        "static s",
        "speedup",
        "Megatron/bound",
        "dhp/bound",
        "Megatron ms",
        "dhp ms",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r["profile"], r["workload"], r["ranks"], r["seed"])):
        steps = [fmt(r[f"{p}_s"]) if r[f"{p}_status"] == "ok" else (r[f"{p}_status"] or "n/a") for p in PLANNERS]
        cells = [
            r["profile"],
            r["workload"],
            str(r["ranks"]),
            str(r["seed"]),
            fmt(r["lower_bound_s"]),
            *steps,
            fmt(r["speedup"], ".2f"),
            fmt(r[f"{MEGATRON}_ratio"]),
            fmt(r[f"{DHP}_ratio"]),
            fmt(r[f"{MEGATRON}_wall_ms"], ".1f"),
            fmt(r[f"{DHP}_wall_ms"], ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary_table(s: dict[str, Any]) -> list[str]:
    """Per profile (and all batches): dhp faster on X of Y, the speedups, the medians to the bound and the wall
    times (Markdown)."""
    head = [
        "profile",
        "dhp faster",
        "speedup median",
        "min",
        "max",
        "Megatron/bound",
        "dhp/bound",
        "static/bound",
        "Megatron ms median (max)",
        "dhp ms median (max)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, p in [*s["per_profile"].items(), ("all", s["all"])]:
        mw, dw = p[f"{MEGATRON}_wall_ms"], p[f"{DHP}_wall_ms"]
        cells = [
            name,
            f"{p['dhp_faster']} of {p['with_both']}",
            *(fmt(p[k], ".2f") + "x" for k in SPEEDUPS),
            fmt(p[f"{MEGATRON}_median_ratio"]),
            fmt(p[f"{DHP}_median_ratio"]),
            fmt(p[f"{STATIC}_median_ratio"]),
            f"{fmt(mw['median'], '.1f')} ({fmt(mw['max'], '.1f')})",
            f"{fmt(dw['median'], '.1f')} ({fmt(dw['max'], '.1f')})",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary_lines(s: dict[str, Any]) -> list[str]:
    lines = []
    for name, p in [("all", s["all"]), *s["per_profile"].items()]:
        mw, dw = p[f"{MEGATRON}_wall_ms"], p[f"{DHP}_wall_ms"]
        lines.append(
            f"- {name}: dhp faster on {p['dhp_faster']} of {p['with_both']} batches ({p['batches']} in all); "
            f"speedup (Megatron / dhp step time) median {fmt(p['median_speedup'], '.2f')}x, "
            f"min {fmt(p['min_speedup'], '.2f')}x, max {fmt(p['max_speedup'], '.2f')}x; "
            f"median ratio to bound: Megatron {fmt(p[f'{MEGATRON}_median_ratio'])}, "
            f"dhp {fmt(p[f'{DHP}_median_ratio'])}, "
            f"static {fmt(p[f'{STATIC}_median_ratio'])}; "
            f"Megatron slower than static on {p['megatron_slower_than_static']} of {p['with_static']}; "
            f"wall ms median (max): Megatron {fmt(mw['median'], '.1f')} ({fmt(mw['max'], '.1f')}), "
            f"dhp {fmt(dw['median'], '.1f')} ({fmt(dw['max'], '.1f')})"
        )
    lines += [f"- no plan: {note}" for note in s["without_plan"]]
    return lines


def plot(rows: list[dict[str, Any]], out: Path) -> list[str]:
    """megatron.png: per profile, each batch's speedup (Megatron's step time over dhp's) and both schedulers'
    wall times."""
    plt = pyplot()

    profiles = list(dict.fromkeys(r["profile"] for r in rows))
    if not any(r["speedup"] is not None for r in rows):
        return []
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(9.0, 3.0 + 2.4 * len(profiles)), 4.8))
    for ranks, marker in zip(sorted({r["ranks"] for r in rows}), "osD^v", strict=False):
        xs, ys = [], []
        for i, prof in enumerate(profiles):
            mine = [
                r["speedup"] for r in rows if r["profile"] == prof and r["ranks"] == ranks and r["speedup"] is not None
            ]
            xs += [i + (k - (len(mine) - 1) / 2) * 0.02 for k in range(len(mine))]
            ys += mine
        left.scatter(xs, ys, marker=marker, alpha=0.7, label=f"{ranks} ranks")
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_ylabel("Megatron step time / dhp step time")
    left.set_title("Speedup of dhp over Megatron's scheduler, per batch\n(above 1: dhp faster)", fontsize=10)
    for key, shift, marker in ((MEGATRON, -0.12, "x"), (DHP, 0.12, "o")):
        xs, ys = [], []
        for i, prof in enumerate(profiles):
            walls = [
                r[f"{key}_wall_ms"]
                for r in rows
                if r["profile"] == prof and r[f"{key}_wall_ms"] is not None and r[f"{key}_status"] == "ok"
            ]
            xs += [i + shift] * len(walls)
            ys += walls
        right.scatter(xs, ys, marker=marker, alpha=0.7, label=LABEL[key])
    right.set_yscale("log")
    right.set_ylabel("get_groups_and_subsamples wall time, ms")
    right.set_title("Planning wall time, per batch", fontsize=10)
    for ax in (left, right):
        ax.set_xlim(-0.5, len(profiles) - 0.5)
        ax.set_xticks(range(len(profiles)))
        ax.set_xticklabels(profiles, rotation=15, fontsize=8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return [save_figure(fig, out / "megatron.png")]


def write(doc: dict[str, Any], out: Path, command: str, plots: bool = True) -> tuple[dict[str, Any], list[str]]:
    """results.json, report.md and the plot in ``out``; returns the summary and the text printed."""
    out.mkdir(parents=True, exist_ok=True)
    rows = cases(doc)
    s = summarize(doc)
    full = {**doc, "cases": rows, "summary": s, "command": command}
    (out / "results.json").write_text(json.dumps(full, indent=1, default=str))
    paths = plot(rows, out) if plots else []
    spec = doc["spec"]
    text = summary_lines(s)
    md = [
        "# dhp against Megatron-Core's hybrid context-parallel scheduler",
        "",
        f"Command: `{command}`",
        "",
        f"Workloads {', '.join(spec['workloads'])}; ranks {', '.join(map(str, spec['ranks']))}; "
        f"samples {', '.join(map(str, spec['samples']))}; {spec['seeds']} seeds; "
        f"profiles {', '.join(spec['profiles'])}. "
        f"Ran {doc['elapsed_s']:.0f} s.",
        "",
        "Megatron: megatron-core's `BalancedCPScheduler`; dhp: `trainer.megatron.PlannedCPScheduler` "
        "(200 ms budget); static: static at its best under the same rules. All are verified and scored by "
        "`optimizer.verify.verifier.check_assignment` under the batch's profile and Megatron-Core's rules (aligned "
        "process groups, one sub-sample at a time in memory, barrier groups uncapped); the bound is the best proven "
        "under those rules. Wall times: each scheduler's `get_groups_and_subsamples` call.",
        "",
        "## Summary",
        "",
        "Speedup: Megatron's step time over dhp's, per batch.",
        "",
        *summary_table(s),
        "",
        *text,
        "",
        "## Per batch",
        "",
        *table(rows),
        "",
    ]
    md += [f"![{Path(p).stem}]({Path(p).name})" for p in paths]
    (out / "report.md").write_text("\n".join(md) + "\n")
    return s, text
