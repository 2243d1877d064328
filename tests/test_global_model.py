"""The global bucket model: its arrays, its solvers, its decoding and its place in the search."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from optimizer.costs import CostTables
from optimizer.documents import problem_from_json
from optimizer.evaluate import assignment_step_time
from optimizer.options import PlanOptions
from optimizer.strategies import heuristic_plan
from optimizer.verify import check_assignment
from optimizer.workloads import long_tail_video, mixed
from solver_models.global_model import UNIT, bucket_samples, build, decode
from solver_models.global_search import global_step
from solver_models.level_milp import SOLVERS, Milp

pytest.importorskip("ortools")
pytest.importorskip("highspy")

PROFILE = Path(__file__).resolve().parents[1] / "optimizer" / "presets" / "profiles" / "flexsp-gpt7b.json"
MODEL64 = {"name": "gpt-7b-64h", "llm": {"layers": 32, "hidden": 4096, "heads": 64, "kv_heads": 64, "ffn_hidden": 11008, "vocab": 32000, "parameters": 7.0e9},
           "training": {"zero_stage": 3, "recompute": "full"}}


def _tables(batch: dict, nodes: int = 4, **options) -> CostTables:
    doc = {"batch": batch, "cluster": {"nodes": nodes, "gpus_per_node": 8, "gpu": "H100-SXM"}, "model": MODEL64,
           "profile": json.loads(PROFILE.read_text()), "options": {"max_micro_batches": 64, **options}}
    return CostTables.build(problem_from_json(doc))


@pytest.fixture(scope="module")
def video() -> CostTables:
    return _tables(long_tail_video(160, seed=3))


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_solvers_agree_on_a_small_program(name):
    # min 3a + 2b + 4c  s.t.  a + b + c = 5,  2a + b <= 6,  b - c <= 1,  0 <= a, b, c <= 5; the optimum by enumeration.
    milp = Milp()
    a, b, c = (milp.add_var(0, 5, w) for w in (3, 2, 4))
    milp.add_row([a, b, c], [1, 1, 1], 5, 5)
    milp.add_row([a, b], [2, 1], -np.inf, 6)
    milp.add_row([b, c], [1, -1], -np.inf, 1)
    best = min(milp.objective([x, y, z]) for x in range(6) for y in range(6) for z in range(6) if milp.feasible([x, y, z]))
    res = SOLVERS[name](milp, time.perf_counter() + 5.0)
    assert res.status == "optimal"
    assert milp.feasible(res.x) and res.objective == best


def test_buckets_stay_within_the_count_and_never_mix_fitting_sizes():
    rng = np.random.default_rng(0)
    lengths = np.sort(rng.integers(100, 100_000, size=300))[::-1].copy()
    first = np.searchsorted(np.array([6449, 12898, 25796, 51592, 103184]), lengths)
    bucket = bucket_samples(lengths, first, 12)
    assert bucket.max() + 1 <= 12
    for q in range(bucket.max() + 1):
        assert len(set(first[bucket == q].tolist())) == 1


def test_start_is_the_hint_and_decodes_to_a_valid_plan(video):
    # With a bucket per distinct length, rounding loses no tokens: the starting plan satisfies every row.
    hint = heuristic_plan(video, deadline=time.perf_counter() + 0.2)
    model = build(video, hint, max_buckets=video.n_samples)
    assert model.info["start_feasible"], model.info
    # Bucket times are the members' largest and levels round up: the model never promises less than the real plan.
    assert model.milp.objective(model.milp.start) * UNIT >= assignment_step_time(video, hint) * (1 - 1e-9)
    plan = decode(model, model.milp.start)
    assert plan is not None
    report = check_assignment(video.problem, plan)
    assert report.ok, report.violations[:3]
    assert sorted(i for mb in plan.micro_batches for _, s in mb for i in s) == list(range(video.n_samples))


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_solutions_decode_to_valid_plans_with_real_times_within_the_model(name, video):
    hint = heuristic_plan(video, deadline=time.perf_counter() + 0.2)
    model = build(video, hint)
    res = SOLVERS[name](model.milp, time.perf_counter() + 1.0)
    assert res.x is not None and model.milp.feasible(res.x)
    plan = decode(model, res.x)
    assert plan is not None
    assert check_assignment(video.problem, plan).ok
    # The micro-batch count is the model's (the decoder adds one only for samples no group can hold).
    assert len(plan.micro_batches) <= sum(res.x[v] for v in model.m_var) + 1


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_global_step_never_returns_a_slower_plan(name):
    tables = _tables(mixed(200, seed=5))
    hint = heuristic_plan(tables, deadline=time.perf_counter() + 0.2)
    h_time = assignment_step_time(tables, hint)
    start = time.perf_counter()
    found, t, details = global_step(tables, tables.problem.options, hint, h_time, start + 0.6, name)
    assert time.perf_counter() - start < 0.6 + 0.1
    if found is None:
        assert t == h_time
    else:
        assert check_assignment(tables.problem, found).ok
        assert t == pytest.approx(assignment_step_time(tables, found)) and t < h_time
    assert details  # it ran or said why not


def test_global_step_is_skipped_where_it_cannot_pay(video):
    hint = heuristic_plan(video, deadline=time.perf_counter() + 0.2)
    h_time = assignment_step_time(video, hint)
    opts = video.problem.options
    assert global_step(video, opts, hint, h_time, time.perf_counter() + 0.01, "cpsat")[2]["skipped"].endswith("ms left")
    assert global_step(video, opts, hint, h_time, time.perf_counter() + 1.0, "cbc") == (None, h_time, {})
    det = PlanOptions(deterministic=True, max_micro_batches=64)
    assert global_step(video, det, hint, h_time, time.perf_counter() + 1.0, "cpsat") == (None, h_time, {})


def test_backend_reports_the_global_step_and_keeps_the_best(video):
    from solver_models import get_backend

    hint = heuristic_plan(video, deadline=time.perf_counter() + 0.2)
    h_time = assignment_step_time(video, hint)
    res = get_backend("cpsat").solve(video, video.problem.options, hint, time.perf_counter() + 1.0)
    assert res.assignment is not None and check_assignment(video.problem, res.assignment).ok
    assert res.objective_s <= h_time * (1 + 1e-9)
    assert res.objective_s == pytest.approx(assignment_step_time(video, res.assignment))
