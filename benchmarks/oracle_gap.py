"""The heuristic against the brute-force optimum on tiny instances (<= 8 samples, <= 6 ranks).

Prints, per degree policy, how many instances were feasible, the mean and worst ratio of the
heuristic's step time to the optimum, how often it was optimal, and the same for the best static
power-of-two layout. The instances are the seeded ones of ``tests/test_oracle.py``.

    .venv/bin/python benchmarks/oracle_gap.py [--seeds 200]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from oracle import brute_force_optimum  # noqa: E402
from test_oracle import tiny_problem  # noqa: E402

from optimizer.errors import InfeasibleError  # noqa: E402
from optimizer.planner import plan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    args = ap.parse_args()
    for policy in ("any", "pow2"):
        ratios, static_ratios, infeasible, wrong = [], [], 0, 0
        for seed in range(args.seeds):
            problem = tiny_problem(seed, degree_policy=policy)
            optimum = brute_force_optimum(problem)
            try:
                result = plan(problem)
            except InfeasibleError:
                infeasible += 1
                wrong += not math.isinf(optimum)
                continue
            ratios.append(result.predicted_step_time_s / optimum)
            if result.static_baseline is not None:
                static_ratios.append(result.static_baseline.predicted_step_time_s / optimum)
        optimal = sum(r <= 1 + 1e-9 for r in ratios)
        print(f"policy {policy}: {len(ratios)} feasible instances, {infeasible} infeasible ({wrong} of them wrongly)")
        print(f"  heuristic / optimum: mean {sum(ratios) / len(ratios):.4f}, worst {max(ratios):.4f}, optimal on {optimal} ({100 * optimal / len(ratios):.0f}%)")
        if static_ratios:
            print(f"  best static layout / optimum: mean {sum(static_ratios) / len(static_ratios):.4f}, worst {max(static_ratios):.4f} ({len(static_ratios)} with a static layout)")


if __name__ == "__main__":
    main()
