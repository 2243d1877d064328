"""The group-column LP bound (solver_models.column_bound) on proven optima of tests/fixtures/optima.json.

Its validity against the brute-force optimum is checked in tests/test_bound_oracle.py; here: it converges,
stays below the proven optimum, is at least the length-class LP on the same classes (above it where whole
groups matter), gives the same bound when a plan's groups seed it, and answers with the Lagrangian bound
when its deadline stops it early.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from optimizer.costs.tables import CostTables
from optimizer.problem.documents import problem_from_json

pytest.importorskip("highspy")
from solver_models import column_bound as cb  # noqa: E402
from solver_models import length_class_bound as lc  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "optima.json"


def _fixture(name: str) -> tuple[CostTables, float, list[list[tuple[int, list[int]]]]]:
    fixture = next(f for f in json.loads(FIXTURES.read_text())["fixtures"] if f["name"] == name)
    problem = problem_from_json(fixture["request"])
    assert problem.cost_profile.step_constant == 0.0  # the optimum is the micro-batches' alone
    micro_batches = [[(len(ranks), samples) for ranks, samples in mb] for mb in fixture["groups"]]
    return CostTables.build(problem), float(fixture["optimum_s"]), micro_batches


@pytest.mark.parametrize(
    "name",
    [
        "video-analytical-8x16-s0",
        "long-text-analytical-8x16-s0",
        "long-text-stress-group-constant-8x16-s0",
        "mixed-flexsp-gpt7b-8x16-s0",
    ],
)
def test_converges_below_the_optimum_and_at_least_the_class_lp(name):
    tables, optimum, _ = _fixture(name)
    found = cb.column_bound(tables, optimum * 1.02)
    classes = lc.length_class_bound(tables, optimum * 1.02, rounds=1)  # the same first classes
    assert found is not None and classes is not None
    assert found.converged and found.rounds == 1
    assert found.bound_s <= optimum * (1 + 1e-9)
    assert found.bound_s >= classes.bound_s * (1 - cb.CLOSE)  # generation stops within CLOSE of the LP


def test_whole_groups_raise_it_above_the_class_lp():
    # 8 ranks, 16 long-text samples: 0.9948 of the optimum against the class LP's 0.9941 when measured.
    tables, optimum, _ = _fixture("long-text-analytical-8x16-s0")
    found = cb.column_bound(tables, optimum * 1.02)
    classes = lc.length_class_bound(tables, optimum * 1.02, rounds=1)
    assert found is not None and classes is not None
    assert found.bound_s > classes.bound_s * 1.0004


def test_a_plans_groups_seed_the_same_bound():
    tables, optimum, micro_batches = _fixture("video-analytical-8x16-s0")
    alone = cb.column_bound(tables, optimum * 1.02)
    seeded = cb.column_bound(tables, optimum * 1.02, micro_batches=micro_batches)
    assert alone is not None and seeded is not None and seeded.converged
    assert seeded.bound_s == pytest.approx(alone.bound_s, rel=cb.CLOSE)  # both within CLOSE of the LP


def test_stopped_early_it_answers_the_lagrangian_bound():
    tables, optimum, _ = _fixture("video-analytical-8x16-s0")
    ticks = iter(range(10**6))
    found = cb.column_bound(tables, optimum * 1.02, deadline=3.0, clock=lambda: float(next(ticks)))
    assert found is not None and not found.converged
    assert found.bound_s <= optimum * (1 + 1e-9)


def test_answers_nothing_past_its_deadline_or_without_an_incumbent():
    tables, optimum, _ = _fixture("video-analytical-8x16-s0")
    assert cb.column_bound(tables, optimum * 1.02, deadline=0.0, clock=lambda: 1.0) is None
    assert cb.column_bound(tables, math.inf) is None


def test_the_knapsack_forms_agree_with_brute_force():
    import itertools

    from optimizer import jit
    from solver_models import knapsack_kernels

    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(1, 11))
        profit = rng.random(n) + 0.01
        a = rng.integers(0, 9, n)
        m = rng.integers(0, 5, n)
        forms = [knapsack_kernels.fill.python, knapsack_kernels.fill.py_func]
        if jit.HAVE_NUMBA:
            forms.append(knapsack_kernels.fill.dispatcher)
        tables = []
        for form in forms:
            value, taken = np.zeros((9, 5)), np.zeros((n, 9, 5), dtype=np.bool_)
            form(profit, a, m, value, taken)
            tables.append((value, taken))
        for value, taken in tables[1:]:
            assert np.array_equal(value, tables[0][0]) and np.array_equal(taken, tables[0][1])
        best = max(
            sum(profit[list(s)])
            for r in range(n + 1)
            for s in itertools.combinations(range(n), r)
            if a[list(s)].sum() <= 8 and m[list(s)].sum() <= 4
        )
        assert tables[0][0][8, 4] == pytest.approx(best)


def test_pricing_reads_back_a_set_within_the_rooms():
    rng = np.random.default_rng(3)
    profit, time_w, mem_w = rng.random(30), rng.random(30), rng.random(30)
    best, chosen = cb._knapsack(profit, time_w, mem_w, 2.0, 1.5)
    assert chosen.size > 0
    assert profit[chosen].sum() == pytest.approx(best)
    # the grid rounds weights down: the set may overrun by less than a cell per item
    assert time_w[chosen].sum() <= 2.0 * (1 + chosen.size / cb.TIME_CELLS)
    assert mem_w[chosen].sum() <= 1.5 * (1 + chosen.size / cb.MEMORY_CELLS)
