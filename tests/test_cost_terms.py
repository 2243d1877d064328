"""The profile's optional terms that describe a ring trainer: per-sample ring steps, the group's
messages per micro-batch, padded bytes and a per-step constant (see optimizer.costs.profile)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from oracle import brute_force_optimum

from optimizer.costs.tables import CostTables, sample_time
from optimizer.errors import ProblemError
from optimizer.heuristic.local_search import LocalSearch
from optimizer.plan.evaluate import assignment_step_time, build_plan
from optimizer.plan.records import Assignment, SolverStats
from optimizer.problem.documents import problem_from_json, profile_from_json
from optimizer.problem.problem import Problem
from optimizer.verify.verifier import check_assignment, group_time, verify
from planning.planner import plan
from solver_models import available_backends

BASE: dict[str, Any] = {
    "time": {"quadratic": 1e-9, "linear": 1e-5, "sample_constant": 1e-3, "group_constant": 2e-3},
    "comm": {"scheme": "ring", "bytes_per_token": 1000.0, "bandwidth_bytes_per_s": {"intra": 1e9, "inter": 2e8}},
    "capacity_tokens_per_rank": 4096,
}
TRAINER: dict[str, Any] = {
    "time": {**BASE["time"], "sample_step": 4e-4, "step_constant": 0.05},
    "comm": {
        **BASE["comm"],
        "latency_s": {"intra": 1e-4, "inter": 1e-3},
        "group_messages": {"per_step": 6, "fixed": 2},
        "padded_bytes": True,
    },
    "capacity_tokens_per_rank": 4096,
}


@pytest.fixture(scope="module")
def have():
    names = available_backends()
    return lambda name: name in names


def _problem(profile: dict, lengths: list[int], nodes: int = 1, per_node: int = 4, **options: Any) -> Problem:
    return problem_from_json(
        {
            "batch": {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(lengths)]},
            "cluster": {"nodes": nodes, "gpus_per_node": per_node},
            "profile": profile,
            "options": options,
        }
    )


def test_terms_by_hand():
    p = profile_from_json(TRAINER)
    L, d = 100, 3
    # A group of 3 pads a ring sample to a multiple of 2 x 3 = 6 tokens: 102 tokens are sent.
    compute = (1e-9 * L * L + 1e-5 * L) / d + 1e-3 + 4e-4 * (d - 1)
    assert sample_time(p, L, 0.0, d, True) == pytest.approx(compute + 1000.0 * 102 * (2 / 3) / 1e9, rel=1e-12)
    assert sample_time(p, L, 0.0, 1, True) == pytest.approx(
        1e-9 * L * L + 1e-5 * L + 1e-3, rel=1e-12
    )  # no ring on one rank
    # The group's messages: (6 (d-1) + 2) per micro-batch at the span's latency, whatever its samples.
    assert p.group_exchange_time(3, True) == pytest.approx(14 * 1e-4)
    assert p.group_exchange_time(3, False) == pytest.approx(14 * 1e-3)
    assert p.group_exchange_time(1, False) == 0.0
    problem = _problem(TRAINER, [100, 40, 7, 500], nodes=2, per_node=2)
    tables = CostTables.build(problem)
    intra2 = 2e-3 + 8 * 1e-4 + sum(sample_time(p, n, 0.0, 2, True) for n in (100, 40))
    inter2 = 2e-3 + 8 * 1e-3 + sum(sample_time(p, n, 0.0, 2, False) for n in (100, 40))
    assert tables.group_time([0, 1], (0, 1)) == pytest.approx(intra2, rel=1e-12)
    assert tables.group_time([0, 1], (1, 2)) == pytest.approx(inter2, rel=1e-12)
    assert group_time(problem, (1, 2), (0, 1))[0] == pytest.approx(
        inter2, rel=1e-12
    )  # the verifier's own recomputation
    assert tables.group_time([2], (3,)) == pytest.approx(2e-3 + sample_time(p, 7, 0.0, 1, True), rel=1e-12)


def test_absent_terms_leave_the_base_form():
    p = profile_from_json(BASE)
    assert (p.sample_step, p.step_constant, p.group_messages_per_step, p.group_messages_fixed, p.padded_bytes) == (
        0.0,
        0.0,
        0.0,
        0.0,
        False,
    )
    assert p.to_json()["time"].keys() == BASE["time"].keys() and "group_messages" not in p.to_json()["comm"]
    tables = CostTables.build(_problem(BASE, [100, 4000]))
    assert not tables.varying_group_constant
    assert set(tables.group_constants(True).tolist()) == set(tables.best_group_constants.tolist()) == {2e-3}


def test_profile_round_trips_and_bad_terms_name_their_field():
    p = profile_from_json(TRAINER)
    assert profile_from_json(p.to_json()) == p
    bad = [
        (
            {**TRAINER, "comm": {**TRAINER["comm"], "group_messages": {"per_step": -1}}},
            "profile.comm.group_messages.per_step",
        ),
        (
            {**TRAINER, "comm": {**TRAINER["comm"], "group_messages": {"per_ring_step": 3}}},
            "profile.comm.group_messages",
        ),
        ({**TRAINER, "comm": {**TRAINER["comm"], "padded_bytes": "yes"}}, "profile.comm.padded_bytes"),
        ({**TRAINER, "time": {**TRAINER["time"], "step_constant": math.inf}}, "profile.time.step_constant"),
        ({**TRAINER, "time": {**TRAINER["time"], "sample_step": -2e-4}}, "profile.time.sample_step"),
    ]
    for doc, where in bad:
        with pytest.raises(ProblemError) as info:
            profile_from_json(doc)
        assert info.value.field.startswith(where), (info.value.field, where)


def test_step_constant_adds_to_the_step_the_bound_and_the_static_layout():
    lengths = [3000, 900, 120, 80, 60, 40, 33, 20]
    without = plan(
        _problem(dict(TRAINER, time={**TRAINER["time"], "step_constant": 0.0}), lengths, backend="heuristic")
    )
    problem = _problem(TRAINER, lengths, backend="heuristic")
    with_it = plan(problem)
    assert [[g.ranks for g in mb.groups] for mb in with_it.micro_batches] == [
        [g.ranks for g in mb.groups] for mb in without.micro_batches
    ]
    assert with_it.predicted_step_time_s == pytest.approx(without.predicted_step_time_s + 0.05, rel=1e-12)
    assert with_it.lower_bound_s == pytest.approx(without.lower_bound_s + 0.05, rel=1e-12)
    assert with_it.static_baseline.predicted_step_time_s == pytest.approx(
        without.static_baseline.predicted_step_time_s + 0.05, rel=1e-12
    )
    assert with_it.predicted_step_time_s == pytest.approx(
        sum(mb.predicted_time_s for mb in with_it.micro_batches) + 0.05, rel=1e-12
    )
    assert verify(with_it, problem).ok
    # A plan that leaves the constant out is caught.
    short = replace(with_it, predicted_step_time_s=with_it.predicted_step_time_s - 0.05, lower_bound_s=0.0)
    assert any("predicted step time" in v for v in verify(short, problem).violations)
    tables = CostTables.build(problem)
    assignment = Assignment.of(
        [[(g.ranks, [problem.batch.index[s] for s in g.samples]) for g in mb.groups] for mb in with_it.micro_batches]
    )
    report = check_assignment(problem, assignment)
    assert report.step_time_s == pytest.approx(
        report.micro_batches_s + 0.05
    ) and report.micro_batches_s == pytest.approx(assignment_step_time(tables, assignment))


def test_group_messages_make_the_planner_spare_wide_groups():
    """One long and three short samples on four ranks: spread over a group of four the long one
    finishes four times sooner, unless each of the group's 20 messages per micro-batch costs 2 ms."""
    lengths = [2000, 100, 100, 100]
    cheap = {**TRAINER, "comm": {**TRAINER["comm"], "latency_s": {"intra": 1e-7, "inter": 1e-7}}}
    costly = {**TRAINER, "comm": {**TRAINER["comm"], "latency_s": {"intra": 2e-3, "inter": 2e-3}}}

    def widest(profile: dict) -> int:
        result = plan(_problem(profile, lengths, backend="heuristic"))
        return max(len(g.ranks) for mb in result.micro_batches for g in mb.groups)

    assert widest(cheap) > 1
    assert widest(costly) == 1
    # The local search sees the same group times as the evaluation.
    tables = CostTables.build(_problem(costly, [24] * 16))
    wide = Assignment.of([[((0, 1, 2, 3), list(range(16)))]])
    search = LocalSearch(tables, wide)
    assert search.step_time() == pytest.approx(assignment_step_time(tables, wide), rel=1e-12)


def _trainer_instance(seed: int, backend: str) -> Problem:
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    nodes, per_node = rng.choice([(1, 4), (2, 2), (2, 3), (1, 6), (3, 2), (1, 5)])
    lengths = [rng.choice([rng.randint(10, 300), rng.randint(300, 3000), rng.randint(3000, 20000)]) for _ in range(n)]
    profile = {
        "time": {
            "quadratic": 2e-10,
            "linear": 5e-5,
            "sample_constant": 1e-3,
            "group_constant": 5e-3,
            "sample_step": rng.choice([0.0, 2e-4, 2e-3]),
            "step_constant": rng.choice([0.0, 0.01]),
        },
        "comm": {
            "scheme": rng.choice(["ring", "ulysses"]),
            "bytes_per_token": 1.5e5,
            "bandwidth_bytes_per_s": {"intra": 3e11, "inter": 2.5e10},
            "latency_s": {"intra": rng.choice([1e-4, 1e-3]), "inter": rng.choice([1e-3, 5e-3])},
            "group_messages": {"per_step": rng.choice([0, 6, 60]), "fixed": rng.choice([0, 2, 20])},
            "padded_bytes": rng.random() < 0.5,
        },
        "capacity_tokens_per_rank": rng.choice([8000, 16000, 64000]),
    }
    return _problem(profile, lengths, nodes, per_node, backend=backend, max_micro_batches=3, time_budget_ms=2000)


@pytest.mark.parametrize("backend", ["heuristic", "cpsat", "highs"])
def test_plans_and_bounds_against_the_optimum_with_trainer_terms(backend, have):
    if backend != "heuristic" and not have(backend):
        pytest.skip(f"{backend} is not installed")
    seeds = range(24) if backend == "heuristic" else range(8)
    ratios = []
    for seed in seeds:
        problem = _trainer_instance(seed, backend)
        optimum = brute_force_optimum(problem)
        if math.isinf(optimum):
            continue
        result = plan(problem)
        assert verify(result, problem).ok
        assert result.predicted_step_time_s >= optimum * (1 - 1e-9), f"seed {seed}: a plan beats the optimum"
        assert result.lower_bound_s <= optimum * (1 + 1e-9), f"seed {seed}: the bound exceeds the optimum"
        ratios.append(result.predicted_step_time_s / optimum)
    assert len(ratios) >= len(seeds) // 2
    assert max(ratios) <= (1.1 if backend == "heuristic" else 1.0 + 1e-6)


def test_level_bound_stays_below_the_optimum_with_group_messages(have):
    if not have("highs"):
        pytest.skip("HiGHS is not installed")
    from solver_models.lp_bound import level_bound

    for seed in range(12):
        problem = _trainer_instance(seed, "heuristic")
        optimum = brute_force_optimum(problem)
        if math.isinf(optimum):
            continue
        tables = CostTables.build(problem)
        result = plan(problem)
        upper = assignment_step_time(tables, build_plan_assignment(result, problem))
        found = level_bound(tables, upper)
        if found is not None:
            assert found[0] + problem.cost_profile.step_constant <= optimum * (1 + 1e-9)


def build_plan_assignment(result, problem) -> Assignment:
    return Assignment.of(
        [[(g.ranks, [problem.batch.index[s] for s in g.samples]) for g in mb.groups] for mb in result.micro_batches]
    )


def test_build_plan_charges_each_group_its_own_constant():
    problem = _problem(TRAINER, [300, 200, 50, 40], nodes=2, per_node=2)
    tables = CostTables.build(problem)
    assignment = Assignment.of([[((0, 2), [0, 1]), ((1,), [2]), ((3,), [3])]])
    result = build_plan(tables, assignment, SolverStats("hand", "given", 0.0), 0.0)
    spanning = result.micro_batches[0].groups[0]
    assert not spanning.intra_node
    assert spanning.predicted_time_s == pytest.approx(tables.group_time([0, 1], (0, 2)), rel=1e-12)
    assert verify(result, problem).ok


def test_fixed_messages_per_sample():
    """``comm.messages_fixed``: each sample on a group of two or more ranks exchanges that many messages more."""
    doc = {**TRAINER, "comm": {**TRAINER["comm"], "messages_fixed": 3}}
    p, q = profile_from_json(doc), profile_from_json(TRAINER)
    for d, intra, latency in ((2, True, 1e-4), (3, False, 1e-3)):
        assert sample_time(p, 100, 0.0, d, intra) - sample_time(q, 100, 0.0, d, intra) == pytest.approx(
            3 * latency, rel=1e-9
        )
    assert sample_time(p, 100, 0.0, 1, True) == sample_time(q, 100, 0.0, 1, True)  # no ring on one rank
    assert profile_from_json(p.to_json()) == p and p.to_json()["comm"]["messages_fixed"] == 3
    problem = _problem(doc, [100, 40, 7, 500], nodes=2, per_node=2)
    tables = CostTables.build(problem)
    assert group_time(problem, (1, 2), (0, 1))[0] == pytest.approx(
        tables.group_time([0, 1], (1, 2)), rel=1e-12
    )  # the verifier agrees
    with pytest.raises(ProblemError) as info:
        profile_from_json({**TRAINER, "comm": {**TRAINER["comm"], "messages_fixed": -1}})
    assert info.value.field == "profile.comm.messages_fixed"
