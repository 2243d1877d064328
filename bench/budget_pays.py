"""Does the exact path pay at every budget? Each backend against the heuristic alone at the same budget.

    .venv/bin/python -m bench.budget_pays                      # 5 workloads x 2 seeds, 64 ranks, 2 profiles
    .venv/bin/python -m bench.budget_pays --profiles flexsp-gpt7b stress-slow-inter analytical \\
        --ranks 64 256 --seeds 3 --budgets-ms 200 1000 --deterministic --out bench-out/pays.json
    .venv/bin/python -m bench.budget_pays --samples 512 ...     # 512 samples per batch, as dhp bench's grid

Every batch of the grid (``bench.grid.make_problem``: a workload, a seed, a rank count, 8 samples per rank
or ``--samples`` in all, a profile) is planned at each budget by the heuristic alone and by each backend
named, in this process after the warm-up. Printed per profile and budget: each backend's plan time over
the heuristic's alone (median, worst, and how many batches it made slower; ``heuristic-again``, the
heuristic alone planned a second time, is the noise floor outside deterministic mode), and budget
monotonicity: how many batches a backend planned slower at the larger budget than at the smaller one, and
by how much at worst. With ``--deterministic`` the plans are clock-free and both counts should be 0. A batch
that some planner refuses at some budget (no packing within ``--max-micro-batches``) is left out of the
figures and listed as skipped, with the error.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from typing import Any

from bench.grid import MAX_MICRO_BATCHES, make_problem, resolve_profile
from bench.output import write_json
from bench.workload_catalog import get_workload
from optimizer.errors import PlannerError

WORKLOADS = ["video", "long-text", "mixed", "image-sft", "anyres"]


def plan_time(problem: Any, backend: str, budget_ms: float, deterministic: bool) -> float:
    from planning.planner import plan

    options = replace(problem.options, backend=backend, time_budget_ms=budget_ms, deterministic=deterministic)
    return float(plan(replace(problem, options=options)).predicted_step_time_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.budget_pays", description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", nargs="+", default=["flexsp-gpt7b", "stress-slow-inter"])
    ap.add_argument("--workloads", nargs="+", default=WORKLOADS)
    ap.add_argument("--ranks", type=int, nargs="+", default=[64])
    ap.add_argument("--samples-per-rank", type=int, default=8)
    ap.add_argument(
        "--samples", type=int, default=None, help="samples per batch whatever the ranks (as dhp bench --samples)"
    )
    ap.add_argument(
        "--max-micro-batches",
        type=int,
        default=MAX_MICRO_BATCHES,
        help=f"options.max_micro_batches of every batch (default {MAX_MICRO_BATCHES}; dhp bench --suite flexsp: 512)",
    )
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--budgets-ms", type=float, nargs="+", default=[200.0, 1000.0])
    ap.add_argument("--backends", nargs="+", default=["cpsat", "highs", "auto"])
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument(
        "--no-noise",
        dest="noise",
        action="store_false",
        help="skip planning each batch a second time with the heuristic alone (the noise floor)",
    )
    ap.add_argument("--out", help="write every plan's time as JSON here")
    args = ap.parse_args(argv)
    from planning.planner import warm_up

    warm_up()
    budgets = sorted(args.budgets_ms)
    compared = [*args.backends, *(["heuristic-again"] if args.noise else [])]  # each against the heuristic alone
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for prof in args.profiles:
        profile = resolve_profile(prof)
        for wl in args.workloads:
            for ranks in args.ranks:
                for seed in range(args.seeds):
                    samples = args.samples or ranks * args.samples_per_rank
                    problem = make_problem(
                        get_workload(wl), ranks, samples, seed, budgets[0], profile, args.max_micro_batches
                    )
                    case = {"profile": prof, "workload": wl, "ranks": ranks, "samples": samples, "seed": seed}
                    try:
                        planned = [
                            {
                                **case,
                                "budget_ms": budget,
                                "backend": backend,
                                "step_s": plan_time(
                                    problem, backend.removesuffix("-again"), budget, args.deterministic
                                ),
                            }
                            for budget in budgets
                            for backend in ["heuristic", *compared]
                        ]
                    except PlannerError as exc:  # a batch no planner answers at a budget is left out, and said so
                        skipped.append({**case, "error": str(exc)})
                        print(f"{prof} {wl} {ranks} ranks seed {seed}: skipped ({exc})", file=sys.stderr, flush=True)
                        continue
                    rows += planned
                    print(f"{prof} {wl} {ranks} ranks seed {seed}: done", file=sys.stderr, flush=True)
    mode = "deterministic" if args.deterministic else "normal"
    print(f"mode: {mode}; {len(args.workloads)} workloads x {args.seeds} seeds x ranks {args.ranks}")
    for case in skipped:
        print(
            f"skipped {case['profile']} {case['workload']} {case['ranks']} ranks seed {case['seed']}: {case['error']}"
        )
    fields = ("profile", "workload", "ranks", "seed", "budget_ms", "backend")
    key = {tuple(r[f] for f in fields): r["step_s"] for r in rows}
    cases = sorted({k[:4] for k in key})
    for prof in args.profiles:
        mine = [c for c in cases if c[0] == prof]
        if not mine:
            continue
        for budget in budgets:
            for backend in compared:
                ratios = [key[(*c, budget, backend)] / key[(*c, budget, "heuristic")] for c in mine]
                slower = sum(r > 1 + 1e-9 for r in ratios)
                print(
                    f"{prof:>20} {budget:>6g} ms {backend:>6}: over the heuristic alone median "
                    f"{statistics.median(ratios):.4f}, worst {max(ratios):.4f}, slower on {slower} of {len(ratios)}"
                )
        for lo, hi in zip(budgets, budgets[1:], strict=False):
            for backend in ["heuristic", *args.backends]:
                ratios = [key[(*c, hi, backend)] / key[(*c, lo, backend)] for c in mine]
                worse = [r for r in ratios if r > 1 + 1e-9]
                print(
                    f"{prof:>20} {backend:>9} {hi:g} ms against {lo:g} ms: slower on {len(worse)} of {len(ratios)}"
                    + (f", by up to {100 * (max(worse) - 1):.2f}%" if worse else "")
                )
    if args.out:
        write_json(args.out, {"rows": rows, "skipped": skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())
