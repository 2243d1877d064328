"""Engine benchmark: the fast heuristic on 64 ranks (8 nodes x 8 H100) and 512-sample long-tail video batches.

Prints, per seed, the median and p90 wall time of a whole ``plan()`` call (tables, bound, heuristic,
static comparison, verification) after a warm-up, the predicted step time over the lower bound, and
the speedup over the best static power-of-two layout under the same cost model; then the medians.
``--tight-bound`` asks for the group-size LP bound as well (``options.tight_bound``: a tighter bound,
tens of milliseconds more).

    .venv/bin/python -m bench.engine_bench [--seeds 10] [--repeats 15] [--samples 512] [--cluster h100-8x8]
"""

from __future__ import annotations

import argparse
import statistics
import time

from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import WORKLOADS
from planning.planner import plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--cluster", default="h100-8x8")
    ap.add_argument("--model", default="qwen2-vl-7b")
    ap.add_argument("--workload", default="video", choices=sorted(WORKLOADS))
    ap.add_argument("--tight-bound", action="store_true", help="ask for the group-size LP bound too")
    args = ap.parse_args()

    print(
        f"workload {args.workload}, {args.samples} samples, cluster {args.cluster}, model {args.model}, "
        f"backend heuristic{', tight_bound' if args.tight_bound else ''}"
    )
    print(
        f"{'seed':>4} {'median ms':>10} {'p90 ms':>8} {'step s':>8} {'bound s':>8} {'ratio':>7} {'static s':>9} "
        f"{'CP':>3} {'speedup':>8} {'mbs':>4}"
    )
    medians, ratios, speedups = [], [], []
    for seed in range(args.seeds):
        doc = {
            "batch": WORKLOADS[args.workload](args.samples, seed=seed),
            "cluster_preset": args.cluster,
            "model_preset": args.model,
            "options": {"backend": "heuristic", "tight_bound": args.tight_bound},
        }
        problem = problem_from_json(doc)
        plan(problem)  # warm-up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            result = plan(problem)
            times.append((time.perf_counter() - t0) * 1000.0)
        times.sort()
        med = statistics.median(times)
        p90 = times[int(0.9 * (len(times) - 1))]
        sb = result.static_baseline
        speed = result.speedup_over_static or float("nan")
        medians.append(med)
        ratios.append(result.ratio_to_bound)
        speedups.append(speed)
        print(
            f"{seed:>4} {med:>10.2f} {p90:>8.2f} {result.predicted_step_time_s:>8.3f} {result.lower_bound_s:>8.3f} "
            f"{result.ratio_to_bound:>7.4f} {sb.predicted_step_time_s if sb else float('nan'):>9.3f} "
            f"{sb.degree if sb else 0:>3} {speed:>8.3f} {len(result.micro_batches):>4}"
        )
    print(
        f"median over seeds: planning {statistics.median(medians):.2f} ms, "
        f"ratio to bound {statistics.median(ratios):.4f} (max {max(ratios):.4f}), "
        f"speedup over best static {statistics.median(speedups):.3f}x (min {min(speedups):.3f}x)"
    )


if __name__ == "__main__":
    main()
