"""Megatron-Core's execution rules as planner options: aligned rank sets and memory per sample.

``degree_policy = "aligned"`` allows only the process groups Megatron-Core creates for hybrid
context parallelism, and ``memory = "sample"`` holds one sample at a time on a rank. The verifier
checks both; the planner plans under both; the brute-force oracle (tests/oracle.py) enumerates
only aligned blocks and checks memory per sample, so bounds and plans are checked against the true
optimum of the rules.
"""

from __future__ import annotations

import math

import pytest
from oracle import brute_force_optimum
from oracle_instances import instance, with_options

from bench.grid import make_problem, resolve_profile
from bench.workload_catalog import get_workload
from optimizer.bounds.lower_bounds import bound_parts
from optimizer.costs.tables import UNFIT_S, CostTables
from optimizer.errors import PlannerError
from optimizer.plan.records import Assignment
from optimizer.problem.degrees import aligned_sizes, allowed_degrees
from optimizer.problem.documents import problem_from_json
from optimizer.verify.verifier import check_assignment, verify
from planning.planner import plan

RULES = {"degree_policy": "aligned", "memory": "sample"}


def _request(lengths: list[int], nodes: int = 1, gpus: int = 8, capacity: int = 1000, **options: object) -> dict:
    return {
        "cluster": {"nodes": nodes, "gpus_per_node": gpus},
        "model_preset": "llama3-8b",
        "batch": {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(lengths)]},
        "profile": {
            "time": {"quadratic": 1e-9, "linear": 1e-5, "sample_constant": 1e-3, "group_constant": 2e-3},
            "comm": {"scheme": "ring", "bytes_per_token": 1e5, "bandwidth_bytes_per_s": {"intra": 1e11, "inter": 1e10}},
            "capacity_tokens_per_rank": capacity,
        },
        "options": options,
    }


@pytest.mark.parametrize("n", [2, 4, 6, 8, 10, 12, 16, 24, 48, 64, 256])
def test_aligned_blocks_are_the_groups_megatron_creates(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    monkeypatch.setattr(parallel_state, "create_group", lambda ranks, **kw: tuple(ranks))
    created: set[tuple[int, ...]] = set()
    for rank in range(n):
        created.update(parallel_state.create_hybrid_dp_cp_groups(rank, list(range(n)), None).values())
    created.add(tuple(range(n)))  # get_hybrid_data_context_parallel_groups gives the whole group for size n
    ours = {tuple(range(a, a + d)) for d in aligned_sizes(n) if d > 1 for a in range(0, n - d + 1, d)}
    # Megatron also makes a short last block when d does not divide n (ranks [i, n)); it is never a group of size d.
    assert ours == {g for g in created if len(g) in aligned_sizes(n) and (len(g) == n or g[0] % len(g) == 0)}
    problem = problem_from_json(_request([100], nodes=1, gpus=n, degree_policy="aligned"))
    assert allowed_degrees(problem) == aligned_sizes(n)


def test_verifier_checks_aligned_blocks_and_memory_per_sample() -> None:
    # Two samples of 0.8 of a rank's memory: together they exceed one rank, alone each fits.
    doc = _request([800, 800, 3000], capacity=1000, **RULES)
    problem = problem_from_json(doc)
    ok = Assignment.of([[((0,), (0, 1)), ((4, 5, 6, 7), (2,))]])
    assert check_assignment(problem, ok).ok
    packed = problem_from_json({**doc, "options": {"degree_policy": "aligned"}})
    report = check_assignment(packed, ok)
    assert any("1600 tokens per rank exceed the capacity of 1000" in v for v in report.violations)
    shifted = Assignment.of([[((0,), (0, 1)), ((2, 3, 4, 5), (2,))]])
    report = check_assignment(problem, shifted)
    assert any("ranks 2..5 are not an aligned block of 4" in v for v in report.violations)
    too_small = Assignment.of([[((0,), (0, 1)), ((4, 5), (2,))]])
    report = check_assignment(problem, too_small)
    assert any("its longest sample's 1500 tokens per rank exceed the capacity of 1000" in v for v in report.violations)
    three = Assignment.of([[((0, 1, 2), (0, 1, 2))]])
    assert any(
        "not an aligned block size of the 8-rank domain" in v for v in check_assignment(problem, three).violations
    )


def test_memory_per_sample_needs_fewer_micro_batches() -> None:
    # 16 samples of a whole rank's memory on 8 ranks: two micro-batches packed, one sample at a time fits one.
    lengths = [1000] * 16
    packed = plan(problem_from_json(_request(lengths, capacity=1000, backend="heuristic", deterministic=True)))
    alone = plan(problem_from_json(_request(lengths, capacity=1000, backend="heuristic", deterministic=True, **RULES)))
    assert len(packed.micro_batches) == 2
    assert len(alone.micro_batches) == 1
    assert alone.predicted_step_time_s < packed.predicted_step_time_s


def _tiny_cases():
    for seed in range(120):
        doc, tags = instance(seed)
        doc = with_options(doc, **RULES)
        try:
            problem = problem_from_json(doc)
            CostTables.build(problem)
        except PlannerError:
            continue
        yield seed, doc, tags


@pytest.mark.parametrize("seed,doc,tags", list(_tiny_cases()), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_bounds_and_plans_against_the_brute_force_optimum(seed: int, doc: dict, tags: dict) -> None:
    problem = problem_from_json(with_options(doc, backend="cpsat", time_budget_ms=2000, deterministic=True))
    optimum = brute_force_optimum(problem)
    if not math.isfinite(optimum):
        pytest.skip("no plan exists under the micro-batch cap")
    tables = CostTables.build(problem)
    for name, value in bound_parts(tables).items():
        assert value + problem.cost_profile.step_constant <= optimum * (1 + 1e-9), (
            f"bound part {name} {value} above the optimum {optimum} ({tags})"
        )
    result = plan(problem)
    assert verify(result, problem).ok
    assert result.lower_bound_s <= optimum * (1 + 1e-9)
    assert result.predicted_step_time_s >= optimum * (1 - 1e-9)
    assert max(g.predicted_time_s for mb in result.micro_batches for g in mb.groups) < UNFIT_S


@pytest.mark.parametrize("profile", ["flexsp-gpt7b", "stress-slow-inter"])
@pytest.mark.parametrize("workload", ["video", "long-text"])
def test_bench_batches_plan_under_megatron_rules(profile: str, workload: str) -> None:
    problem = make_problem(get_workload(workload), 64, 512, 0, 200, resolve_profile(profile), 1 << 20)
    problem = problem.with_options(**RULES, max_micro_batches=None, backend="heuristic", deterministic=True)
    result = plan(problem)
    report = verify(result, problem)
    assert report.ok, report.violations[:3]
    for mb in result.micro_batches:
        for g in mb.groups:
            d = len(g.ranks)
            assert d in aligned_sizes(64)
            assert d in (1, 64) or (min(g.ranks) % d == 0 and max(g.ranks) - min(g.ranks) == d - 1)
    assert result.lower_bound_s <= result.predicted_step_time_s
