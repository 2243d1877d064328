"""Benchmark of the exact backends inside the planner's time budget.

For each cluster size, workload and seed it plans the same batch with the heuristic alone and with
the heuristic followed by each exact backend at each budget, and prints, per (instance, planner,
budget): the step time over the best bound known for that instance (the largest lower bound any
run proved; median and max over the seeds) and the wall time of the whole ``plan()`` call against
the budget (median and max, and the worst overrun). Libraries are loaded and warmed before timing,
as in a running service.

Usage::

    .venv/bin/python -m bench.solver_bench                 # the full table (a few minutes)
    .venv/bin/python -m bench.solver_bench --quick         # one seed, 64 ranks, 200 ms only
    .venv/bin/python -m bench.solver_bench --sizes 64 --workloads video --budgets 1000 --policy pow2
    .venv/bin/python -m bench.solver_bench --lp-check --seeds 1   # level LP bound vs area bound
    .venv/bin/python -m bench.solver_bench --excess --sizes 64 --policy pow2   # where the heuristic loses
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import WORKLOADS
from planning.planner import plan

SIZES = {64: ("h100-8x8", 512), 256: ("h100-32x8", 2048)}


def warm_up(backends: list[str]) -> None:
    """Load the solver libraries (as the service does at start-up) and run each backend once on a small batch."""
    from solver_models import available_backends

    available_backends()  # imports OR-Tools, PuLP and HiGHS
    problem = problem_from_json(
        {"batch": WORKLOADS["video"](32, seed=99), "cluster_preset": "h100-1x8", "model_preset": "qwen2-vl-7b"}
    )
    for name in backends:
        plan(replace(problem, options=replace(problem.options, backend=name, time_budget_ms=100.0)))


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    for size in args.sizes:
        cluster, n = SIZES[size]
        for workload in args.workloads:
            for seed in range(args.seeds):
                doc = {
                    "batch": WORKLOADS[workload](n, seed=seed),
                    "cluster_preset": cluster,
                    "model_preset": args.model,
                    "options": {"degree_policy": args.policy, "solver_workers": args.workers},
                }
                base = problem_from_json(doc)
                runs = []
                for backend in ["heuristic", *args.backends]:
                    for budget in args.budgets:
                        problem = replace(
                            base, options=replace(base.options, backend=backend, time_budget_ms=float(budget))
                        )
                        t0 = time.perf_counter()
                        result = plan(problem)
                        wall = (time.perf_counter() - t0) * 1000.0
                        runs.append(
                            {
                                "size": size,
                                "workload": workload,
                                "seed": seed,
                                "backend": backend,
                                "budget": budget,
                                "step": result.predicted_step_time_s,
                                "bound": result.lower_bound_s,
                                "wall": wall,
                                "status": result.solver.status,
                                "improved": result.solver.fallback_reason is None and backend != "heuristic",
                            }
                        )
                best_bound = max(r["bound"] for r in runs)
                for r in runs:
                    r["ratio"] = r["step"] / best_bound
                rows.extend(runs)
    return rows


def table(rows: list[dict]) -> str:
    keys = sorted(
        {(r["size"], r["workload"], r["backend"], r["budget"]) for r in rows},
        key=lambda k: (k[0], k[1], ["heuristic", "cpsat", "highs", "cbc"].index(k[2]), k[3]),
    )
    head = (
        f"{'ranks':>5} {'workload':<10} {'planner':<14} {'budget ms':>9} {'ratio med':>9} {'ratio max':>9} "
        f"{'wall med':>9} {'wall max':>9} {'over max':>9} {'improved':>8}"
    )
    lines = [head, "-" * len(head)]
    for size, workload, backend, budget in keys:
        sel = [
            r
            for r in rows
            if (r["size"], r["workload"], r["backend"], r["budget"]) == (size, workload, backend, budget)
        ]
        ratios = [r["ratio"] for r in sel]
        walls = [r["wall"] for r in sel]
        over = max(w - budget for w in walls)
        name = "heuristic" if backend == "heuristic" else f"heur+{backend}"
        improved = sum(r["improved"] for r in sel)
        lines.append(
            f"{size:>5} {workload:<10} {name:<14} {budget:>9} {statistics.median(ratios):>9.4f} {max(ratios):>9.4f} "
            f"{statistics.median(walls):>9.1f} {max(walls):>9.1f} {over:>+9.1f} {improved:>5}/{len(sel)}"
        )
    return "\n".join(lines)


def instances(args: argparse.Namespace):
    """(ranks, workload, seed, cost tables) of every instance the selected sizes, workloads and seeds give."""
    from optimizer.costs.tables import CostTables

    for size in args.sizes:
        cluster, n = SIZES[size]
        for workload in args.workloads:
            for seed in range(args.seeds):
                problem = problem_from_json(
                    {
                        "batch": WORKLOADS[workload](n, seed=seed),
                        "cluster_preset": cluster,
                        "model_preset": args.model,
                        "options": {"degree_policy": args.policy},
                    }
                )
                yield size, workload, seed, CostTables.build(problem)


def lp_check(args: argparse.Namespace) -> None:
    """Print the level LP of :mod:`solver_models.lp_bound` against the area bound, per instance."""
    from optimizer.bounds.lower_bounds import lower_bound
    from optimizer.heuristic.strategies import heuristic_plan
    from optimizer.plan.evaluate import assignment_step_time
    from solver_models.lp_bound import level_bound

    print(f"{'ranks':>5} {'workload':<10} {'seed':>4} {'LP / area':>10} {'LP ms':>7}  LP size")
    for size, workload, seed, tables in instances(args):
        area = lower_bound(tables)
        upper = assignment_step_time(tables, heuristic_plan(tables))
        t0 = time.perf_counter()
        got = level_bound(tables, upper)
        ms = (time.perf_counter() - t0) * 1000.0
        if got is None:
            print(f"{size:>5} {workload:<10} {seed:>4} {'n/a':>10}")
            continue
        print(f"{size:>5} {workload:<10} {seed:>4} {got[0] / area:>10.5f} {ms:>7.0f}  {got[1]}")


def excess_check(args: argparse.Namespace) -> None:
    """Where the heuristic's plan spends rank-seconds beyond the area bound's minimum.

    For each sample, d t(d) on its group minus e_i(S) (the least area it could take finishing
    within the bound S), summed by group size and span; plus the idle rank-seconds (ranks waiting
    for their micro-batch's slowest group). All in rank-seconds; the step time times N is their sum
    plus the group constants.
    """
    import numpy as np

    from optimizer.bounds.lower_bounds import lower_bound
    from optimizer.heuristic.strategies import heuristic_plan
    from optimizer.plan.evaluate import assignment_step_time

    for size, workload, seed, tables in instances(args):
        plan_ = heuristic_plan(tables)
        bound = lower_bound(tables)
        b, t, deg = tables.group_constant, tables.best_time, tables.degrees
        valid = np.arange(t.shape[1])[None, :] >= tables.min_degree_index[:, None]
        least = np.where(valid & (b + t <= bound), t * deg[None, :], np.inf).min(axis=1)
        excess: dict[str, float] = {}
        idle = 0.0
        for mb in plan_.micro_batches:
            times = [tables.group_time(list(s), r) for r, s in mb]
            idle += tables.n_ranks * max(times) - sum(len(r) * x for (r, _), x in zip(mb, times, strict=True))
            for r, s in mb:
                intra, speed, _ = tables.group_span(r)
                col = tables.time_matrix(intra, speed)[:, tables.degree_index[len(r)]]
                key = f"{len(r)}{'' if intra else '*'}"
                excess[key] = excess.get(key, 0.0) + float((len(r) * col[list(s)] - least[list(s)]).sum())
        step = assignment_step_time(tables, plan_)
        top = sorted(excess.items(), key=lambda kv: -kv[1])[:5]
        print(
            f"{size:>4} ranks {workload:<10} seed {seed} policy {args.policy}: step/bound {step / bound:.4f}; "
            f"N x (step - bound) {tables.n_ranks * (step - bound):.1f} rank-s = idle {idle:.1f} + excess area by "
            "group size (* spans nodes) " + ", ".join(f"{k}: {v:.1f}" for k, v in top)
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[64, 256],
        choices=sorted(SIZES),
        help="ranks (64: h100-8x8 x 512 samples, 256: h100-32x8 x 2048)",
    )
    ap.add_argument("--workloads", nargs="+", default=["video", "image-sft"], choices=sorted(WORKLOADS))
    ap.add_argument("--budgets", type=int, nargs="+", default=[50, 200, 1000], help="time budgets in ms")
    ap.add_argument("--backends", nargs="+", default=["cpsat", "highs"], choices=["cpsat", "highs", "cbc"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--policy", default="any", choices=["any", "pow2"])
    ap.add_argument("--model", default="qwen2-vl-7b")
    ap.add_argument("--workers", type=int, default=1, help="solver threads")
    ap.add_argument("--quick", action="store_true", help="one seed, 64 ranks, 200 ms")
    ap.add_argument("--lp-check", action="store_true", help="compare the level LP bound with the area bound instead")
    ap.add_argument(
        "--excess", action="store_true", help="where the heuristic's plan spends rank-seconds beyond the bound, instead"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.sizes, args.budgets = 1, [64], [200]
    if args.lp_check:
        lp_check(args)
        return
    if args.excess:
        excess_check(args)
        return
    warm_up(args.backends)
    t0 = time.perf_counter()
    rows = run(args)
    print(table(rows))
    print(
        "\nratio: step time / best bound proved for the instance (max over all its runs); wall: whole plan() call, "
        f"ms; {args.seeds} seed(s), policy {args.policy}, {args.workers} solver thread(s); "
        f"{time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
