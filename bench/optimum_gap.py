"""Every planner's distance to the proven optima of ``tests/fixtures/optima.json``, every bound's distance below.

    .venv/bin/python -m bench.optimum_gap
    .venv/bin/python -m bench.optimum_gap --baselines static-best bucket-milp flexsp --out bench-out/gap.json

The fixtures come from ``bench.optimum_fixtures`` (the command that made each is stored with it). Each proven
case is planned, as the problem the optimum was proven for (its micro-batch limit included), by dhp's calls of
:data:`DHP` (the heuristic alone; ``auto`` at 200 ms and 1 s; CP-SAT and HiGHS at 1 s) and by the baselines
of ``bench.planners`` named, and scored as the engine evaluates plans: step time over the optimum, median
and worst, and how often the optimum was reached (within :data:`TOLERANCE`). Each bound of the engine
(:func:`optimizer.bounds.lower_bounds.bound_parts`; the largest is the engine's bound), the group-size LP
(:mod:`solver_models.size_bound`), the length-class LP (:mod:`solver_models.length_class_bound`, offline:
no answer runs it; below the best dhp plan, :data:`CLASS_LIMIT_S` a case), the group-column LP
(:mod:`solver_models.column_bound`, offline likewise) and the bound each dhp answer
carries is scored as its value over the
optimum (1.0: tight). A bound above the optimum or a plan below it is a bug, counted apart. Cases whose
proof did not close are not scored; for each, its best plan over the solver's bound and over the
length-class LP's and the group-column LP's. ``--write-tightness`` writes, for each bound
that was the binding one (the largest of the engine's and the LP's) on some case, how far below the optimum
it lay there: :mod:`optimizer.bounds.tightness` says it beside every plan that names that bound.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from bench.optimum_fixtures import FIXTURES
from bench.output import write_json

BASELINES = ["static-best", "bucket-milp"]
"""Planners of ``bench.planners`` run by default (``--baselines``; ``flexsp`` too when asked for)."""
DHP = {
    "heuristic": ("heuristic", 200.0),
    "auto@200ms": ("auto", 200.0),
    "auto@1s": ("auto", 1000.0),
    "cpsat@1s": ("cpsat", 1000.0),
    "highs@1s": ("highs", 1000.0),
}
"""dhp's calls: backend and budget over the fixture's own options (its micro-batch limit kept)."""
CLASS_LIMIT_S = 60.0
"""Seconds for the length-class LP of :mod:`solver_models.length_class_bound` per case (its rounds stop there)."""
TOLERANCE = 1e-6
"""Relative distance within which a plan counts as the optimum, and a bound or plan as not crossing it."""


def _spread(ratios: list[float], worst: str = "worst") -> str:
    """Median and extreme of ``ratios``: the largest for plans (``worst``), the smallest for bounds (``loosest``)."""
    if not ratios:
        return "no cases"
    extreme = max(ratios) if worst == "worst" else min(ratios)
    return f"median {statistics.median(ratios):.4f}, {worst} {extreme:.4f}"


def score(fixtures: list[dict[str, Any]], baselines: list[str]) -> dict[str, Any]:
    """Ratios of every planner's plan and every bound to the optimum, per case."""
    from bench.planners import planner_for
    from bench.workload_catalog import get_workload
    from optimizer.bounds.lower_bounds import bound_parts
    from optimizer.costs.tables import CostTables
    from optimizer.plan.evaluate import assignment_step_time
    from optimizer.problem.documents import problem_from_json
    from optimizer.verify.verifier import check_assignment
    from planning.planner import plan
    from solver_models.column_bound import column_bound
    from solver_models.length_class_bound import length_class_bound
    from solver_models.size_bound import size_bound

    rows = []
    for k, fx in enumerate(fixtures, 1):
        problem = problem_from_json(fx["request"])
        tables = CostTables.build(problem)
        optimum = fx["optimum_s"]
        row: dict[str, Any] = {"name": fx["name"], "optimum_s": optimum, "plans": {}, "bounds": {}}
        for name in baselines:
            outcome = planner_for(name, request=fx["request"])(problem, get_workload(fx["case"]["workload"]))
            found = outcome.assignment
            ok = found is not None and check_assignment(problem, found).ok
            row["plans"][name] = assignment_step_time(tables, found) / optimum if found is not None and ok else None
        best_step = math.inf
        for name, (backend, budget_ms) in DHP.items():
            answer = plan(problem.with_options(backend=backend, time_budget_ms=budget_ms))
            row["plans"][name] = answer.predicted_step_time_s / optimum
            row["bounds"][f"{name}'s answer"] = answer.lower_bound_s / optimum
            best_step = min(best_step, answer.predicted_step_time_s)
        engine = {part: value / optimum for part, value in bound_parts(tables).items()}
        lp = size_bound(tables)
        if lp is not None:
            engine["group_sizes"] = lp / optimum
        classes = length_class_bound(
            tables, best_step - problem.cost_profile.step_constant, deadline=time.perf_counter() + CLASS_LIMIT_S
        )
        row["bounds"].update(engine)
        if classes is not None:  # offline only: not a bound any answer names
            row["bounds"]["length_classes"] = classes.bound_s / optimum
        columns = column_bound(
            tables, best_step - problem.cost_profile.step_constant, deadline=time.perf_counter() + CLASS_LIMIT_S
        )
        if columns is not None:  # offline too
            row["bounds"]["group_columns"] = columns.bound_s / optimum
        row["binding"] = max(engine, key=engine.__getitem__)  # the bound a plan of this batch names
        rows.append(row)
        print(f"[{k}/{len(fixtures)}] {fx['name']}", file=sys.stderr, flush=True)
    return {"cases": rows}


def unproven_gaps(fixtures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each case whose proof did not close: its best plan over the solver's bound, and over the length-class
    LP's below that plan (:data:`CLASS_LIMIT_S` a case), so that what is left of the gap is known to be at most
    the plan's share."""
    from optimizer.costs.tables import CostTables
    from optimizer.problem.documents import problem_from_json
    from solver_models.column_bound import column_bound
    from solver_models.length_class_bound import length_class_bound

    rows = []
    for k, fx in enumerate(fixtures, 1):
        problem = problem_from_json(fx["request"])
        tables = CostTables.build(problem)
        best = float(fx["best_s"])
        step_constant = problem.cost_profile.step_constant
        started = time.perf_counter()
        classes = length_class_bound(tables, best - step_constant, deadline=started + CLASS_LIMIT_S)
        class_s = time.perf_counter() - started
        columns = column_bound(tables, best - step_constant, deadline=time.perf_counter() + CLASS_LIMIT_S)
        bound = fx.get("bound_s")
        rows.append(
            {
                "name": fx["name"],
                "best_s": best,
                "solver_wall_s": fx["solver"]["wall_s"],
                "over_solver_bound": best / bound if bound else None,
                "over_class_bound": best / (classes.bound_s + step_constant) if classes else None,
                "class_lp_s": class_s,
                "over_column_bound": best / (columns.bound_s + step_constant) if columns else None,
                "column_lp_s": columns.seconds if columns else None,
            }
        )
        print(f"[{k}/{len(fixtures)}] {fx['name']} (not proven)", file=sys.stderr, flush=True)
    return rows


def report(result: dict[str, Any], unproven: list[dict[str, Any]]) -> None:
    rows = result["cases"]
    names = list(dict.fromkeys(n for r in rows for n in r["plans"]))
    print(f"{len(rows)} proven optima")
    print("plans, step time over the optimum:")
    for name in names:
        ratios = [r["plans"][name] for r in rows if r["plans"].get(name) is not None]
        reached = sum(x <= 1 + TOLERANCE for x in ratios)
        crossed = sum(x < 1 - TOLERANCE for x in ratios)
        missing = sum(r["plans"].get(name) is None for r in rows)
        print(
            f"  {name:<16} {_spread(ratios)}; optimum reached {reached}/{len(ratios)}"
            + (f"; below the optimum (a bug) {crossed}" if crossed else "")
            + (f"; no verified plan {missing}" if missing else "")
        )
    print("bounds, value over the optimum (1.0: tight):")
    for part in dict.fromkeys(b for r in rows for b in r["bounds"]):
        ratios = [r["bounds"][part] for r in rows if part in r["bounds"]]
        crossed = sum(x > 1 + TOLERANCE for x in ratios)
        print(
            f"  {part:<24} {_spread(ratios, 'loosest')} over {len(ratios)}"
            + (f"; above the optimum (a bug) {crossed}" if crossed else "")
        )
    if unproven:
        print("not proven: best plan over the solver's bound, over the length-class LP's and the group-column LP's")
        for row in unproven:
            solver = f"{row['over_solver_bound']:.4f}" if row["over_solver_bound"] else "no bound"
            classes = row["over_class_bound"]
            print(
                f"  {row['name']}: {solver} after {row['solver_wall_s']} s; "
                + (f"{classes:.4f} in {row['class_lp_s']:.1f} s" if classes else "no class bound")
                + (
                    f"; {row['over_column_bound']:.4f} in {row['column_lp_s']:.1f} s"
                    if row.get("over_column_bound")
                    else "; no column bound"
                )
            )


def tightness(result: dict[str, Any]) -> dict[str, Any]:
    """The record :mod:`optimizer.bounds.tightness` reads: per bound, the cases it was binding on and its value
    over the optimum there."""
    rows = result["cases"]
    bounds: dict[str, Any] = {}
    for name in sorted({r["binding"] for r in rows}):
        ratios = [r["bounds"][name] for r in rows if r["binding"] == name]
        bounds[name] = {"binding": len(ratios), "median": statistics.median(ratios), "loosest": min(ratios)}
    return {
        "measured": date.today().isoformat(),
        "source": "python -m bench.optimum_gap --write-tightness",
        "cases": len(rows),
        "bounds": bounds,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.optimum_gap", description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    ap.add_argument(
        "--baselines", nargs="+", default=BASELINES, help="planners of bench.planners (default: %(default)s)"
    )
    ap.add_argument("--out", help="write every ratio as JSON here")
    ap.add_argument(
        "--write-tightness",
        action="store_true",
        help="write what the optima say of each binding bound to optimizer/presets/bound_tightness.json",
    )
    args = ap.parse_args(argv)
    fixtures = json.loads(args.fixtures.read_text())["fixtures"]
    proven = [f for f in fixtures if f.get("proven")]
    unproven = [f for f in fixtures if not f.get("proven") and "best_s" in f]
    from planning.planner import warm_up

    warm_up()
    result = score(proven, args.baselines)
    result["unproven"] = unproven_gaps(unproven)
    report(result, result["unproven"])
    if args.out:
        write_json(args.out, result)
    if args.write_tightness:
        from optimizer.bounds.tightness import FILE

        FILE.write_text(json.dumps(tightness(result), indent=1) + "\n")
        print(f"wrote {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
