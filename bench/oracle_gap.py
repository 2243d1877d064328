r"""Every backend against the brute-force optimum on seeded tiny instances (<= 6 ranks, <= 8 samples).

The instances (``tests/oracle_instances.py``) cover six cost profiles (the analytical default, the
FlexSP 7B and 30B fits with a lowered capacity, a large group constant, slow inter-node links,
attention-dominated), both degree policies, ring and Ulysses, one to three nodes, some mixing H100
and A100. The optimum comes from ``tests/oracle.py``, which shares only the scalar cost formula with
the planner. For each backend it prints the claims the oracle refutes (each must be 0: bounds above
the optimum, false "optimal", false "infeasible", plans below the optimum, unverified plans), the
honest "unknown" answers, how often the optimum was reached, and the mean and worst ratio of step
time to optimum. ``default`` is the default call (backend auto, 200 ms).

    .venv/bin/python -m bench.oracle_gap --instances 300 [--budget-ms 1000] \
        [--backends heuristic,cpsat,highs,cbc,default]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from oracle import brute_force_optimum  # noqa: E402
from oracle_compare import judge, summarise  # noqa: E402
from oracle_instances import PROFILES, instance  # noqa: E402

from optimizer.errors import InfeasibleError  # noqa: E402
from optimizer.problem.documents import problem_from_json  # noqa: E402

CLAIMS = ("bound_above", "false_optimal", "false_optimal_strict", "false_infeasible", "below_optimum", "unverified")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=300)
    ap.add_argument("--first", type=int, default=0, help="first seed")
    ap.add_argument(
        "--budget-ms", type=float, default=1000.0, help="budget of the solver backends (heuristic: the same)"
    )
    ap.add_argument("--backends", default="heuristic,cpsat,highs,cbc,default")
    ap.add_argument("--verbose", action="store_true", help="print every refuted claim")
    args = ap.parse_args()
    backends = args.backends.split(",")
    outcomes: dict[str, list] = {b: [] for b in backends}
    by_profile: dict[str, dict[str, list]] = {p: {b: [] for b in backends} for p in PROFILES}
    start = time.perf_counter()
    n_infeasible = 0
    for seed in range(args.first, args.first + args.instances):
        doc, tags = instance(seed)
        try:
            optimum = brute_force_optimum(problem_from_json(doc))
        except InfeasibleError:
            optimum = math.inf  # the request itself is refused (e.g. a sample above every group's memory)
        n_infeasible += math.isinf(optimum)
        for b in backends:
            name, budget = ("auto", 200.0) if b == "default" else (b, args.budget_ms)
            o = judge(doc, optimum, name, budget)
            outcomes[b].append(o)
            by_profile[tags["profile"]][b].append(o)
            if args.verbose:
                bad = [k for k, v in o.flags().items() if v]
                if bad:
                    print(
                        f"  seed {seed} {tags} {b}: {bad} optimum {optimum:.6g} step {o.step} bound {o.bound} "
                        f"status {o.status} {o.message or ''}"
                    )
    print(
        f"{args.instances} instances (seeds {args.first}..{args.first + args.instances - 1}), "
        f"{args.instances - n_infeasible} feasible, {n_infeasible} infeasible by the oracle; "
        f"solver budget {args.budget_ms:.0f} ms; {time.perf_counter() - start:.0f} s"
    )
    header = (
        f"{'backend':10} {'reached':>13} {'mean':>7} {'worst':>7} {'optimal':>7} "
        + " ".join(f"{c:>20}" for c in CLAIMS)
        + f" {'unknown':>8}"
    )
    print(header)
    for b in backends:
        s = summarise(outcomes[b])
        print(
            (
                f"{b:10} {s['reached']:>4}/{s['feasible']:<4}{100 * s['reached_rate']:3.0f}% {s['mean_ratio']:7.4f} "
                f"{s['worst_ratio']:7.4f} {s['optimal_claims']:>7} "
            )
            + " ".join(f"{s[c]:>20}" for c in CLAIMS)
            + f" {s['unknown']:>8}"
        )
    print("per profile (reached / feasible, mean ratio):")
    for p in PROFILES:
        cells = []
        for b in backends:
            s = summarise(by_profile[p][b])
            cells.append(f"{b} {s['reached']}/{s['feasible']} {s['mean_ratio']:.4f}")
        print(f"  {p:14} " + "; ".join(cells))


if __name__ == "__main__":
    main()
