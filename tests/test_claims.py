"""What the planner claims holds: "optimal" only with the plan at a proven bound, bounds below the
brute-force optimum, "infeasible" only when proven, solver errors reported as errors, and the
default call not loading a library its budget cannot pay for."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from oracle import brute_force_optimum
from oracle_compare import judge, summarise
from oracle_instances import instance

from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError, PlannerError
from optimizer.heuristic.strategies import heuristic_plan
from optimizer.plan.records import SolverStats
from optimizer.problem.documents import problem_from_json
from planning.planner import OPTIMAL_GAP, honest_status, plan
from solver_models import available_backends
from solver_models.formulation import full_model

ROOT = Path(__file__).resolve().parents[1]


def _tiny(nodes: int, per_node: int, lengths: list[int], **options):
    profile = {
        "time": {"quadratic": 2e-10, "linear": 5e-5, "sample_constant": 1e-3, "group_constant": 5e-3},
        "comm": {"scheme": "ring", "bytes_per_token": 1.5e5, "bandwidth_bytes_per_s": {"intra": 3e11, "inter": 2.5e10}},
        "capacity_tokens_per_rank": 4000,
    }
    return problem_from_json(
        {
            "batch": {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(lengths)]},
            "cluster": {"nodes": nodes, "gpus_per_node": per_node},
            "profile": profile,
            "options": options,
        }
    )


@pytest.fixture(scope="module")
def solvers():
    names = available_backends()
    if not {"cpsat", "highs", "cbc"} <= set(names):
        pytest.skip(f"solver libraries missing: {names}")
    return names


def test_a_spanning_slot_is_decoded_onto_two_nodes():
    """The model charged a spanning slot the inter-node time: its ranks must span nodes."""
    problem = _tiny(2, 3, [6000, 500, 400])
    tables = CostTables.build(problem)
    model = full_model(tables, None, 1e9)
    spanning = [c for c in model.classes if c.pool < 0 and c.d == 2 and c.m == 0]
    assert spanning
    s = spanning[0].slots[0]
    x = {(q, s): model.item_count(q) for q in range(len(model.items)) if (q, s) in {(a, b) for a, b, _ in model.arcs}}
    groups = model.decode(x)
    ((ranks, _),) = groups[0]
    assert len({int(tables.rank_node[r]) for r in ranks}) == 2, ranks


def test_optimal_only_when_the_plan_meets_the_bound():
    stats = SolverStats(backend="cpsat", status="optimal", wall_ms=1.0)
    assert honest_status(stats, 1.0, 1.0).status == "optimal"
    assert honest_status(stats, 1.0 + OPTIMAL_GAP / 2, 1.0).status == "optimal"
    demoted = honest_status(stats, 1.0027, 1.0)
    assert demoted.status == "feasible" and "reported optimal" in demoted.details["solver_claim"]


def test_pulp_models_have_moderate_coefficients(solvers):
    """Times of seconds in 0.1 us units made coefficients of 1e7 to 1e8, past the MILP tolerances."""
    from solver_models.pulp_milp import build_problem

    problem = _tiny(2, 3, [20000, 15000, 9000, 4000, 900, 300], max_micro_batches=3)
    tables = CostTables.build(replace(problem, options=replace(problem.options, time_budget_ms=5000.0)))
    hint = heuristic_plan(tables)
    from optimizer.plan.evaluate import assignment_step_time

    assert assignment_step_time(tables, hint) > 0.1  # 1e6 units of 0.1 us
    model = full_model(tables, hint, assignment_step_time(tables, hint))
    prob, *_ = build_problem(model)
    with warnings.catch_warnings():  # PuLP 3.3 deprecates reading constraints as a mapping
        warnings.simplefilter("ignore", DeprecationWarning)
        rows = list(prob.constraints.values())
    largest = max(abs(c) for con in rows for c in con.values())
    assert largest <= 1e5, largest


def test_highs_keeps_working_after_a_run_with_another_thread_count(solvers):
    """highspy sets its scheduler up once per process; a second thread count used to fail every solve."""
    code = r"""
import sys, time
sys.path.insert(0, "tests")
from dataclasses import replace
from test_solvers import tiny_problem
from optimizer.costs.tables import CostTables
from optimizer.heuristic.strategies import heuristic_plan
from solver_models.pulp_milp import PulpBackend
p = tiny_problem(1, 2, 3, 5, 3)
t = CostTables.build(p)
h = heuristic_plan(t)
solve = PulpBackend("highs").solve
print([solve(t, replace(p.options, solver_workers=w), h, time.perf_counter() + 5).status for w in (1, 2, 1)])
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "['optimal', 'optimal', 'optimal']"


def test_highs_is_given_the_hint_as_a_starting_solution(solvers, monkeypatch):
    import pulp.apis.highs_api as highs_api

    from solver_models.pulp_milp import PulpBackend

    calls: list[int] = []
    real = highs_api.highspy.Highs

    class Spy(real):  # type: ignore[misc, valid-type]
        def setSolution(self, *args):  # noqa: N802 - highspy's name
            calls.append(int(args[0]) if len(args) == 3 else -1)
            return super().setSolution(*args)

    monkeypatch.setattr(highs_api.highspy, "Highs", Spy)
    problem = _tiny(2, 3, [6000, 3000, 2500, 900, 500, 400], max_micro_batches=2)
    tables = CostTables.build(problem)
    hint = heuristic_plan(tables)
    result = PulpBackend("highs").solve(tables, problem.options, hint, time.perf_counter() + 5.0)
    assert result.assignment is not None
    assert calls and calls[0] > 0, "HiGHS got no starting solution"


def test_the_default_call_does_not_load_or_tools_in_a_short_budget(solvers):
    """A fresh process, the 200 ms default: finding which solvers are installed must not load OR-Tools."""
    code = r"""
import json, sys, time
sys.path.insert(0, "tests")
from optimizer.problem.documents import problem_from_json
from planning.planner import plan
from planning.planner import warm_up
from test_solvers import tiny_problem
warm_up()
p = tiny_problem(0, 2, 3, 6, 2)
from dataclasses import replace
p = replace(p, options=replace(p.options, backend="auto", time_budget_ms=200.0))
t = time.perf_counter()
r = plan(p)
wall_ms = (time.perf_counter() - t) * 1000.0
loaded = "ortools.sat.python.cp_model" in sys.modules
print(json.dumps({"wall_ms": wall_ms, "ortools": loaded, "backend": r.solver.backend}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert not report["ortools"], report
    assert report["backend"] in ("highs", "cbc", "heuristic"), report
    assert report["wall_ms"] < 200.0 + 150.0, (
        report
    )  # generous for a shared machine; loading OR-Tools alone took 357 to 661 ms


# Instances where the heuristic finds no packing though plans exist (found with bench/oracle_gap.py;
# 361 mixes GPUs, where counting memory at the smallest GPU's capacity is no proof).
NO_PACKING = (46, 87, 361)


@pytest.mark.parametrize("seed", NO_PACKING)
def test_no_infeasible_claim_when_a_plan_exists(seed, solvers):
    doc, _ = instance(seed)
    optimum = brute_force_optimum(problem_from_json(doc))
    assert math.isfinite(optimum)
    for backend, budget in (("heuristic", 1000.0), ("auto", 200.0), ("cpsat", 1000.0)):
        outcome = judge(doc, optimum, backend, budget)
        assert outcome.kind != "infeasible", (backend, outcome.message)


def test_an_unproven_failure_is_not_called_infeasible():
    """No exact backend can run: the planner says it found no plan, not that none exists."""
    doc, _ = instance(NO_PACKING[-1])  # feasible, but no strategy of the heuristic packs it (46 and 87 they now do)
    problem = problem_from_json({**doc, "options": {**doc["options"], "backend": "heuristic"}})
    with pytest.raises(PlannerError) as err:
        plan(problem, backends={})
    assert not isinstance(err.value, InfeasibleError)
    assert "not proven" in err.value.message


ORACLE_SEEDS = range(0, 36)


def test_no_refuted_claim_on_tiny_instances(solvers):
    """A fast subset of bench/oracle_gap.py: every claim the brute force can check holds."""
    outcomes: dict[str, list] = {"heuristic": [], "cpsat": [], "highs": [], "default": []}
    for seed in ORACLE_SEEDS:
        doc, _ = instance(seed)
        try:
            optimum = brute_force_optimum(problem_from_json(doc))
        except InfeasibleError:
            optimum = math.inf
        for name in outcomes:
            backend, budget = ("auto", 200.0) if name == "default" else (name, 400.0)
            outcomes[name].append(judge(doc, optimum, backend, budget))
    for name, got in outcomes.items():
        s = summarise(got)
        for claim in ("bound_above", "false_optimal", "false_infeasible", "below_optimum", "unverified"):
            assert s[claim] == 0, (
                name,
                claim,
                [(o.optimum, o.step, o.bound, o.status, o.message) for o in got if o.flags()[claim]],
            )
    assert summarise(outcomes["cpsat"])["reached_rate"] >= 0.9
