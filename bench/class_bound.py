"""The length-class LP bound on the batches of a plan-quality grid where dhp is far above the bound.

    .venv/bin/python -m bench.class_bound docs/results-bound/results.json --above 1.05 --ranks 64 --limit-s 120

Reads the ``results.json`` a ``dhp bench --suite flexsp`` run wrote, takes its batches whose best dhp plan is
more than ``--above`` times the grid's best bound (``bench.grid.best_bound``), on ``--ranks`` ranks and under
``--profiles`` (default: all), rebuilds each batch as the grid did, and runs
:func:`solver_models.length_class_bound.length_class_bound` below the best dhp plan for at most
``--limit-s`` seconds (``--bound columns``: :func:`solver_models.column_bound.column_bound`, its Lagrangian
bound where generation has not converged by then). Prints, per batch, the plan over the bound before and with
the class bound, and the medians; ``--out FILE`` keeps the rows as JSON. Both bounds are offline: no answer
runs them.

``--reuse ROWS [ROWS ...]`` takes the bounds of earlier ``--out`` files (of runs side by side, say) for the
batches they hold under the same rules instead of solving again (a bound found below one incumbent holds for
every plan: a slower one is above the incumbent, which is above the bound), so a grid run again after a
planner change is judged against the bounds already paid for. Last, per profile, the median and worst plan
over the bound at 1 s (``dhp-1s``) over every batch of the grid, with the grid's own bounds and with the
raised ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.grid import MAX_MICRO_BATCHES, whole_domain_groups
from bench.output import write_json

PLANNERS = ("dhp-heuristic-default", "dhp-default", "dhp-1s")
"""The grid's dhp planners; the best of their plans is the incumbent below which the LP is solved."""
RULES = ("max_micro_batches", "whole_domain_groups")
"""What a batch is rebuilt under besides its name: an earlier bound is reused only under the same rules."""


def rows_of(
    results: dict[str, Any], above: float, ranks: list[int], profiles: list[str] | None
) -> list[dict[str, Any]]:
    """The grid's batches to try: best dhp plan over the bound above ``above``, on ``ranks``, under ``profiles``;
    each row carries what rebuilding its batch as the grid did needs (the spec's micro-batch limit, and
    whether groups could span the whole domain, as they can when FlexSP was among the planners)."""
    spec = results.get("spec", {})
    rules = {
        "max_micro_batches": int(spec.get("max_micro_batches", MAX_MICRO_BATCHES)),
        "whole_domain_groups": whole_domain_groups(spec.get("planners", ())),
    }
    out = []
    for case in results["cases"]:
        steps = [case.get(f"{p}_s") for p in PLANNERS if case.get(f"{p}_status") == "ok"]
        steps = [s for s in steps if s is not None]
        if not steps or case["ranks"] not in ranks:
            continue
        if profiles is not None and case["profile"] not in profiles:
            continue
        best = min(steps)
        if best / case["lower_bound_s"] > above:
            out.append(
                {
                    **{k: case[k] for k in ("profile", "workload", "ranks", "samples", "seed")},
                    **rules,
                    "plan_s": best,
                    "bound_s": case["lower_bound_s"],
                }
            )
    return out


def key_of(row: dict[str, Any]) -> tuple[Any, ...]:
    """What names one batch of a grid."""
    return tuple(row[k] for k in ("profile", "workload", "ranks", "samples", "seed"))


def reused(row: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """``row`` with the class bound of an earlier run's row of the same batch."""
    classes = earlier["class_bound_s"]
    best = max(row["bound_s"], classes or 0.0)
    keep = ("class_bound_s", "classes", "converged", "rounds", "seconds")
    return {
        **row,
        **{k: earlier.get(k) for k in keep},
        "before": row["plan_s"] / row["bound_s"],
        "after": row["plan_s"] / best,
    }


def profile_summary(results: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Per profile, the median and worst plan at 1 s over the grid's bound and over the raised one, every batch."""
    raised = {key_of(r): r["class_bound_s"] for r in rows if r.get("class_bound_s") is not None}
    per: dict[str, tuple[list[float], list[float]]] = {}
    for case in results["cases"]:
        step = case.get("dhp-1s_s") if case.get("dhp-1s_status") == "ok" else None
        if step is None:
            continue
        before, after = per.setdefault(case["profile"], ([], []))
        before.append(step / case["lower_bound_s"])
        after.append(step / max(case["lower_bound_s"], raised.get(key_of(case), 0.0)))
    lines = [
        "| profile | batches | 1 s over the grid's bound (median / worst) | over the raised bound |",
        "|---|---|---|---|",
    ]
    for profile, (before, after) in per.items():
        lines.append(
            f"| {profile} | {len(before)} | {statistics.median(before):.4f} / {max(before):.4f} | "
            f"{statistics.median(after):.4f} / {max(after):.4f} |"
        )
    return lines


def run(row: dict[str, Any], limit_s: float, bound: str = "classes") -> dict[str, Any]:
    """The class bound (``bound="columns"``: the group-column LP's) of one batch below its best dhp plan."""
    from bench.grid import make_problem, resolve_profile
    from bench.workload_catalog import get_workload
    from optimizer.costs.tables import CostTables
    from solver_models.column_bound import ColumnBound, column_bound
    from solver_models.length_class_bound import ClassBound, length_class_bound

    problem = make_problem(
        get_workload(row["workload"]),
        row["ranks"],
        row["samples"],
        row["seed"],
        1000.0,
        resolve_profile(row["profile"]),
        row.get("max_micro_batches", MAX_MICRO_BATCHES),
        row.get("whole_domain_groups", False),
    )
    tables = CostTables.build(problem)
    step_constant = problem.cost_profile.step_constant
    start = time.perf_counter()
    found: ColumnBound | ClassBound | None
    if bound == "columns":
        found = column_bound(tables, row["plan_s"] - step_constant, deadline=start + limit_s)
    else:
        found = length_class_bound(tables, row["plan_s"] - step_constant, deadline=start + limit_s)
    seconds = time.perf_counter() - start
    classes = None if found is None else found.bound_s + step_constant
    best = max(row["bound_s"], classes or 0.0)
    return {
        **row,
        "class_bound_s": classes,
        "classes": None if found is None else getattr(found, "classes", None),
        "converged": None if found is None else getattr(found, "converged", None),
        "rounds": None if found is None else found.rounds,
        "seconds": seconds,
        "before": row["plan_s"] / row["bound_s"],
        "after": row["plan_s"] / best,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.class_bound", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a results.json of dhp bench --suite flexsp")
    parser.add_argument("--above", type=float, default=1.05, help="plan over the bound above which a batch is tried")
    parser.add_argument("--ranks", default="64", help="comma-separated rank counts to try (default 64)")
    parser.add_argument("--profiles", default=None, help="comma-separated profiles (default: all)")
    parser.add_argument("--limit-s", type=float, default=120.0, help="seconds per batch (default 120)")
    parser.add_argument(
        "--bound",
        choices=("classes", "columns"),
        default="classes",
        help="the length-class LP (default) or the group-column LP of solver_models.column_bound",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument(
        "--reuse", type=Path, nargs="+", default=[], help="earlier --out files whose bounds are taken as they are"
    )
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        ranks = [int(r) for r in args.ranks.split(",")]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}; give a results.json of dhp bench and --ranks like 64,256", file=sys.stderr)
        return 2
    earlier: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path in args.reuse:
        try:
            earlier.update({key_of(r): r for r in json.loads(path.read_text())["rows"]})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: --reuse {path}: {exc}; give files an earlier --out wrote", file=sys.stderr)
            return 2
    if args.limit_s <= 0:
        print("error: --limit-s must be above 0", file=sys.stderr)
        return 2
    profiles = args.profiles.split(",") if args.profiles else None
    try:
        chosen = rows_of(results, args.above, ranks, profiles)
    except (KeyError, TypeError, AttributeError) as exc:
        print(
            f"error: {args.results} is not a results.json of dhp bench --suite flexsp (missing {exc}); "
            "give the one its --out folder holds",
            file=sys.stderr,
        )
        return 2
    if not chosen:
        print(f"no batch above {args.above} on {args.ranks} ranks", file=sys.stderr)
        return 0
    print(f"{len(chosen)} batches, at most {args.limit_s:.0f} s each", file=sys.stderr)
    rows = []
    print(
        "| profile | workload | ranks | seed | bound s | class bound s | plan over the bound | with the class bound "
        "| LP s | classes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in chosen:
        match = earlier.get(key_of(row))
        if match is not None and all(match.get(k) == row[k] for k in RULES):
            done = reused(row, match)
        else:
            done = run(row, args.limit_s, args.bound)
        rows.append(done)
        classes = done["class_bound_s"]
        print(
            f"| {done['profile']} | {done['workload']} | {done['ranks']} | {done['seed']} | {done['bound_s']:.3f} | "
            f"{'-' if classes is None else f'{classes:.3f}'} | {done['before']:.4f} | "
            f"{done['after']:.4f} | {done['seconds']:.0f} | {done['classes'] or '-'} |",
            flush=True,
        )
    before = statistics.median(r["before"] for r in rows)
    after = statistics.median(r["after"] for r in rows)
    print(
        f"median {before:.4f} -> {after:.4f}; "
        f"worst {max(r['before'] for r in rows):.4f} -> {max(r['after'] for r in rows):.4f}; "
        f"raised on {sum(r['after'] < r['before'] * (1 - 1e-9) for r in rows)} of {len(rows)}"
    )
    print("\n".join(profile_summary(results, rows)))
    if args.out is not None:
        write_json(
            args.out, {"command": " ".join(["python -m bench.class_bound", *(argv or sys.argv[1:])]), "rows": rows}
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
