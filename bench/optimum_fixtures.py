"""Proven optima of mid-size batches, solved offline and kept as fixtures (``tests/fixtures/optima.json``).

    .venv/bin/python -m bench.optimum_fixtures                       # every case of CASES, 120 s each
    .venv/bin/python -m bench.optimum_fixtures --limit-s 600 --only video-analytical-8x16-s0

Each case is a batch of the bench grid (``bench.grid.make_request``: a workload, a seed, a rank count, a
sample count, a profile of the zoo, a micro-batch limit) planned as one whole slot model
(:func:`solver_models.formulation.full_model`, exact on one GPU type up to the rounding of times to model
units), whatever its size (the planner itself keeps the whole model to small batches). CP-SAT solves it
from the heuristic's plan with ``--workers`` threads for up to ``--limit-s`` seconds. A case whose search
ends ``optimal`` is written with its request, the optimum (the plan's step time as the engine evaluates
it), the solver's proven bound, the plan's groups, the solver's wall time and the command that made it;
a case whose proof did not close is written with ``"proven": false`` and its best plan and bound, so the
report can still say how far apart they are. The file is rewritten case by case, so an interrupted run
keeps what it proved. ``bench.optimum_gap`` reports every planner's distance to these optima and every
bound's distance below them; ``tests/test_optimum_fixtures.py`` checks each stored plan and that no plan
or bound crosses a proven optimum.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.grid import make_request, resolve_profile
from bench.workload_catalog import get_workload

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "optima.json"


@dataclass(frozen=True)
class Case:
    workload: str
    profile: str
    ranks: int
    samples: int
    micro_batches: int
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.workload}-{self.profile}-{self.ranks}x{self.samples}-s{self.seed}"

    def request(self) -> dict[str, Any]:
        """The case's request document; its micro-batch limit ``micro_batches``, or the fewest memory allows
        where that is more."""
        from optimizer.bounds.lower_bounds import fewest_micro_batches
        from optimizer.costs.tables import CostTables
        from optimizer.problem.documents import problem_from_json

        doc = make_request(
            get_workload(self.workload),
            self.ranks,
            self.samples,
            self.seed,
            1000.0,
            resolve_profile(self.profile),
            self.micro_batches,
        )
        doc["options"].pop("solver_workers", None)
        fewest = fewest_micro_batches(CostTables.build(problem_from_json(doc)))
        doc["options"]["max_micro_batches"] = max(self.micro_batches, fewest)
        return doc


CASES = [
    Case(workload, profile, ranks, samples, mbs)
    for workload in ("video", "long-text", "mixed")
    for profile in ("analytical", "flexsp-gpt7b", "stress-slow-inter", "stress-group-constant")
    for ranks, samples, mbs in ((8, 16, 2), (16, 32, 2), (32, 32, 2))
]
"""The cases: 3 workloads x 4 profiles x (8 ranks, 16 samples), (16 ranks on two nodes, 32 samples) and
(32 ranks on four nodes, 32 samples), at most 2 micro-batches or the fewest memory allows where that is
more (the proof's search grows fast with the limit)."""


def solve_case(case: Case, limit_s: float, workers: int) -> dict[str, Any]:
    """One case solved by CP-SAT's whole model (see the module docstring); its fixture record."""
    from optimizer.costs.tables import CostTables
    from optimizer.errors import InfeasibleError
    from optimizer.heuristic.strategies import heuristic_plan
    from optimizer.plan.evaluate import assignment_step_time
    from optimizer.plan.records import Assignment
    from optimizer.problem.documents import problem_from_json
    from optimizer.verify.verifier import check_assignment
    from solver_models.cpsat import solve_model
    from solver_models.lns import solve_whole

    doc = case.request()
    problem = problem_from_json(doc)
    problem = replace(problem, options=replace(problem.options, solver_workers=workers, deterministic=False))
    tables = CostTables.build(problem)
    record: dict[str, Any] = {"name": case.name, "case": asdict(case), "request": doc}
    if not tables.homogeneous:
        return {**record, "proven": False, "skipped": "GPUs of several types: the whole model is not exact there"}
    try:
        hint: Assignment | None = heuristic_plan(tables)
    except InfeasibleError:  # the heuristic's packing found none: the model starts without a plan
        hint = None
    start = time.perf_counter()
    result = solve_whole(tables, problem.options, hint, start + limit_s, solve_model)
    wall_s = time.perf_counter() - start
    best = result.assignment if result.assignment is not None else hint
    if best is None:
        return {**record, "proven": False, "skipped": f"no plan found in {limit_s:g} s ({result.status})"}
    check = check_assignment(problem, best)
    if not check.ok:
        raise SystemExit(f"{case.name}: the solver's plan does not verify: {check.violations[0]}")
    step = assignment_step_time(tables, best)
    return {
        **record,
        "proven": result.status == "optimal",
        "optimum_s" if result.status == "optimal" else "best_s": step,
        "bound_s": result.bound_s,
        "heuristic_s": None if hint is None else assignment_step_time(tables, hint),
        "groups": [[[list(ranks), list(samples)] for ranks, samples in mb] for mb in best.micro_batches],
        "solver": {"backend": "cpsat", "workers": workers, "limit_s": limit_s, "wall_s": round(wall_s, 2)},
        "command": f"python -m bench.optimum_fixtures --only {case.name} --limit-s {limit_s:g} --workers {workers}",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.optimum_fixtures", description=__doc__.splitlines()[0])
    ap.add_argument("--limit-s", type=float, default=120.0, help="CP-SAT's time limit per case (default 120)")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT's threads (default 2)")
    ap.add_argument("--only", nargs="+", default=None, help="case names (default: every case)")
    ap.add_argument("--out", type=Path, default=FIXTURES)
    args = ap.parse_args(argv)
    cases = [c for c in CASES if args.only is None or c.name in args.only]
    unknown = sorted(set(args.only or ()) - {c.name for c in cases})
    if unknown:
        ap.error(f"unknown case(s) {unknown}; the cases are {[c.name for c in CASES]}")
    from planning.planner import warm_up

    warm_up()
    kept: dict[str, Any] = {}
    if args.out.exists():
        kept = {f["name"]: f for f in json.loads(args.out.read_text())["fixtures"]}
    for k, case in enumerate(cases, 1):
        record = solve_case(case, args.limit_s, args.workers)
        kept[case.name] = record
        doc = {"fixtures": [kept[c.name] for c in CASES if c.name in kept]}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        value = record.get("optimum_s", record.get("best_s"))
        line = f"[{k}/{len(cases)}] {case.name}: " + (
            record["skipped"]
            if "skipped" in record
            else f"{'optimal' if record['proven'] else 'not proven'} {value:.6f} s, bound {record['bound_s']}, "
            f"heuristic {record['heuristic_s']} s, {record['solver']['wall_s']} s"
        )
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
