"""The kernels' Python forms against their compiled forms in fresh processes (:mod:`planning.kernel_choice`).

    .venv/bin/python -m bench.kernel_forms                              # the default grid, video batches
    .venv/bin/python -m bench.kernel_forms --samples 512 4096 --ranks 256 --budgets-ms 200

Each point is planned in a fresh process per form (``DHP_KERNELS=python`` and ``DHP_KERNELS=compiled``),
the budget counted from the process's start, as ``dhp plan`` counts it; a first process per point runs
untimed (it fills numba's disk cache and the fixed work's rates where they are missing). Printed per
point: each form's wall time from the process's start to its plan and the plan's step time, and which
form the rule (``DHP_KERNELS`` unset) picks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.output import write_json

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys, time
start = time.perf_counter()
workload, ranks, n, budget, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
from bench.grid import make_problem
from bench.workload_catalog import get_workload
from planning.deadline import Deadline
from planning.planner import plan
problem = make_problem(get_workload(workload), ranks, n, seed, budget)
result = plan(problem, warm=False, deadline=Deadline.after_ms(budget, start=start))
print(json.dumps({"wall_ms": (time.perf_counter() - start) * 1000.0, "step_s": result.predicted_step_time_s,
                  "kernels": result.solver.details.get("kernels")}))
"""


def run_point(form: str, workload: str, ranks: int, n: int, budget_ms: float, seed: int) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("DHP_KERNELS", None)
    if form != "rule":
        env["DHP_KERNELS"] = form
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, workload, str(ranks), str(n), str(budget_ms), str(seed)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernel_forms", description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="video")
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--samples", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--budgets-ms", type=float, nargs="+", default=[200.0, 1000.0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write every point as JSON here")
    args = ap.parse_args(argv)
    rows = []
    print(
        f"{'budget':>7} {'ranks':>5} {'samples':>7} | {'python ms':>9} {'step s':>9} | "
        f"{'compiled ms':>11} {'step s':>9} | rule"
    )
    for budget in args.budgets_ms:
        for ranks in args.ranks:
            for n in args.samples:
                point = (args.workload, ranks, n, budget, args.seed)
                run_point("compiled", *point)  # untimed: caches
                py, jit, rule = (run_point(f, *point) for f in ("python", "compiled", "rule"))
                rows.append(
                    {"budget_ms": budget, "ranks": ranks, "samples": n, "python": py, "compiled": jit, "rule": rule}
                )
                if "error" in py or "error" in jit:
                    print(f"{budget:>7g} {ranks:>5} {n:>7} | {py.get('error') or jit.get('error')}")
                    continue
                print(
                    f"{budget:>7g} {ranks:>5} {n:>7} | {py['wall_ms']:>9.0f} {py['step_s']:>9.4f} | "
                    f"{jit['wall_ms']:>11.0f} {jit['step_s']:>9.4f} | {rule.get('kernels')}",
                    flush=True,
                )
    if args.out:
        write_json(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
