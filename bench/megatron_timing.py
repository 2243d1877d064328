"""Planning time of both hybrid context-parallel schedulers for Megatron-Core: ``python -m bench.megatron_timing``.

For each point (ranks x samples) both schedulers are made once, Megatron-Core's ``BalancedCPScheduler``
(:mod:`bench.baselines.megatron_real`) and dhp's :class:`trainer.megatron.PlannedCPScheduler` (its
planning budget ``--budget-ms``, in process), and the time of making each is printed apart. Each then
plans one warm-up batch (seed 0) and ``--batches`` timed batches (seeds 1, 2, ...) of the workload; the
time is that of ``get_groups_and_subsamples`` alone, fed the batch's (index, length) list. Printed per
point and scheduler: construction, warm-up, and the median and max of the timed calls.

The default profile is the analytical one of the bench's model (ring attention): under a Ulysses profile
the bench's model has as many attention heads as ranks, and at 1,024 ranks its hidden size (3,584) is
not a multiple of the heads. Any zoo profile or profile file can be given with ``--profile`` where the
ranks allow it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.baselines.megatron_real import capacity
from bench.grid import ANALYTICAL, make_request, resolve_profile
from bench.workload_catalog import get_workload
from optimizer.problem.documents import problem_from_json

DEFAULT_POINTS = ((64, 512), (1024, 8192))


def _points(text: str) -> tuple[tuple[int, int], ...]:
    try:
        points = tuple((int(r), int(n)) for r, n in (p.lower().split("x") for p in text.split(",") if p.strip()))
    except ValueError:
        message = f"{text!r} is not a list of RANKSxSAMPLES points (e.g. 64x512,1024x8192)"
        raise argparse.ArgumentTypeError(message) from None
    if not points or min(min(p) for p in points) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive RANKSxSAMPLES points, e.g. 64x512,1024x8192")
    return points


def _timed_calls(scheduler: Any, batches: list[list[tuple[int, int]]]) -> tuple[float, list[float]]:
    """Milliseconds of ``get_groups_and_subsamples`` on the warm-up batch (the first) and on each of the others."""
    times = []
    for pairs in batches:
        start = time.perf_counter()
        scheduler.get_groups_and_subsamples(pairs, None)
        times.append((time.perf_counter() - start) * 1000.0)
    return times[0], times[1:]


def time_point(
    ranks: int, samples: int, batches: int, workload: str = "video", profile: str = ANALYTICAL, budget_ms: float = 200.0
) -> list[dict[str, Any]]:
    """Construction, warm-up and timed-call milliseconds of both schedulers at one point (see the module docstring)."""
    from trainer.megatron import DomainGroup, PlannedCPScheduler, balanced_scheduler_class

    w = get_workload(workload)
    profile_doc = resolve_profile(profile)
    requests = [make_request(w, ranks, samples, seed, budget_ms, profile_doc) for seed in range(batches + 1)]
    problems = [problem_from_json(r) for r in requests]
    lists = [[(i, int(length)) for i, length in enumerate(p.batch.lengths)] for p in problems]
    cap = capacity(problems[0])
    request = requests[0]
    balanced = balanced_scheduler_class()  # imported here, outside the construction's time
    made: list[tuple[str, Callable[[], Any]]] = [
        ("megatron", lambda: balanced(cap, DomainGroup(ranks))),
        (
            "dhp",
            lambda: PlannedCPScheduler(
                cap,
                DomainGroup(ranks),
                profile=request.get("profile"),
                cluster=request["cluster"],
                budget_ms=budget_ms,
                model=request.get("model") or request.get("model_preset"),
            ),
        ),
    ]
    rows = []
    for name, make in made:
        start = time.perf_counter()
        scheduler = make()
        construct = (time.perf_counter() - start) * 1000.0
        warm, times = _timed_calls(scheduler, lists)
        rows.append(
            {
                "ranks": ranks,
                "samples": samples,
                "scheduler": name,
                "profile": profile,
                "max_seq_len_per_rank": cap,
                "construct_ms": construct,
                "warm_up_ms": warm,
                "wall_ms": times,
                "median_ms": statistics.median(times),
                "max_ms": max(times),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.megatron_timing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--points", type=_points, default=DEFAULT_POINTS, help="RANKSxSAMPLES points (default 64x512,1024x8192)"
    )
    parser.add_argument("--batches", type=int, default=5, help="timed batches per point after the warm-up (default 5)")
    parser.add_argument("--workload", default="video", help="workload of the batches (default video)")
    parser.add_argument(
        "--profile", default=ANALYTICAL, help="cost profile: analytical (default), a zoo name or a profile file"
    )
    parser.add_argument("--budget-ms", type=float, default=200.0, help="dhp's planning budget per batch (default 200)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.batches < 1:
        parser.error("--batches must be >= 1")
    rows = []
    print("| ranks | samples | scheduler | construct ms | warm-up ms | median ms | max ms |")
    print("|---|---|---|---|---|---|---|")
    for ranks, samples in args.points:
        for r in time_point(ranks, samples, args.batches, args.workload, args.profile, args.budget_ms):
            rows.append(r)
            print(
                f"| {ranks} | {samples} | {r['scheduler']} | {r['construct_ms']:.1f} | {r['warm_up_ms']:.1f} | "
                f"{r['median_ms']:.1f} | {r['max_ms']:.1f} |",
                flush=True,
            )
    print(
        f"{args.batches} timed batches per point after one warm-up; workload {args.workload}, "
        f"profile {args.profile}, "
        f"dhp budget {args.budget_ms:g} ms",
        file=sys.stderr,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
