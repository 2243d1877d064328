"""The lower bound's compiled search against the straightforward numpy form of the same bound."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import brute_force_optimum

from bench.grid import make_problem
from bench.workload_catalog import WORKLOADS
from optimizer.bounds.few_micro_batches import few_micro_batch_bound
from optimizer.bounds.long_sample import long_sample_bound
from optimizer.bounds.lower_bounds import (
    _extremes,
    area_bound,
    fewest_micro_batches,
    lower_bound,
    micro_batch_bound,
    single_sample_bound,
)
from optimizer.bounds.speed_bound import speed_weighted_bound
from optimizer.costs.tables import CostTables
from optimizer.heuristic.strategies import heuristic_plan
from optimizer.plan.evaluate import assignment_step_time
from optimizer.problem.documents import problem_from_json


def reference_single(tables: CostTables) -> float:
    t = tables.best_time
    valid = np.arange(t.shape[1])[None, :] >= tables.min_degree_index[:, None]
    return float(tables.group_constant + np.where(valid, t, np.inf).min(axis=1).max())


def reference_area(tables: CostTables, floor: float = 0.0, rel_tol: float = 1e-5) -> float:
    """The area bound with masks over the whole [n, D] table at every bisection step."""
    t = tables.best_time
    b = tables.group_constant
    d = tables.degrees.astype(np.float64)[None, :]
    valid = np.arange(t.shape[1])[None, :] >= tables.min_degree_index[:, None]
    area = np.where(valid, t * d, np.inf)
    memory_ranks = float(tables.lengths.sum()) / float(tables.rank_capacity.max())
    lo = max(floor, reference_single(tables))
    best_j = area.argmin(axis=1)
    best_area = area[np.arange(area.shape[0]), best_j]
    fixed = b + t[np.arange(t.shape[0]), best_j] <= lo
    base = float(best_area[fixed].sum())
    t_act, area_act = t[~fixed], area[~fixed]

    def excess(s: float) -> float:
        e = np.where(b + t_act <= s, area_act, np.inf).min(axis=1) if t_act.shape[0] else np.zeros(0)
        if not np.all(np.isfinite(e)):
            return np.inf
        return base + float(e.sum()) + b * memory_ranks - tables.n_ranks * s

    if excess(lo) <= 0:
        return lo
    hi = lo * 2
    while excess(hi) > 0:
        hi *= 2
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return lo


def _cases():
    for workload, ranks, n in [
        ("video", 16, 64),
        ("video", 64, 512),
        ("long-text", 32, 200),
        ("mixed", 16, 300),
        ("anyres", 8, 100),
        ("dynamic-res", 128, 700),
    ]:
        for seed in range(3):
            yield CostTables.build(make_problem(WORKLOADS[workload], ranks, n, seed, 300.0))
    for preset in ("mixed-h100-a100", "a100-8x8", "h100-1x8"):
        for seed in range(2):
            batch = WORKLOADS["video"].batch(96, seed)
            for options in ({}, {"degree_policy": "any"}, {"max_micro_batches": 64}):
                yield CostTables.build(
                    problem_from_json(
                        {"batch": batch, "cluster_preset": preset, "model_preset": "qwen2-vl-7b", "options": options}
                    )
                )


def test_bound_equals_the_numpy_reference():
    checked = 0
    for tables in _cases():
        assert single_sample_bound(tables) == reference_single(tables)
        got = area_bound(tables)
        assert got == pytest.approx(reference_area(tables), rel=1e-12, abs=0.0)
        speed = speed_weighted_bound(tables, fewest_micro_batches(tables))
        assert (speed is None) == bool(np.all(tables.rank_speed == tables.rank_speed[0]))
        fastest, least, _ = _extremes(tables)
        longest = long_sample_bound(tables, fewest_micro_batches(tables), fastest, least)
        split = few_micro_batch_bound(tables, fewest_micro_batches(tables), fastest, least)
        assert lower_bound(tables) == max(got, micro_batch_bound(tables), longest or 0.0, split or 0.0, speed or 0.0)
        floor = got * 1.3
        assert area_bound(tables, floor=floor) == pytest.approx(reference_area(tables, floor=floor), rel=1e-12, abs=0.0)
        checked += 1
    assert checked > 30


def test_micro_batch_bound_is_the_stronger_when_the_per_micro_batch_constant_dominates():
    """Bound 3 against a hand computation: two ranks, three samples that each fill one rank's memory, b large."""
    profile = {
        "time": {"quadratic": 0.0, "linear": 1e-3, "sample_constant": 0.0, "group_constant": 5.0},
        "comm": {"scheme": "ring", "bytes_per_token": 1.0, "bandwidth_bytes_per_s": {"intra": 1e11, "inter": 1e10}},
        "capacity_tokens_per_rank": 100,
    }
    batch = {"samples": [{"id": f"s{i}", "text_tokens": 100} for i in range(3)]}
    tables = CostTables.build(
        problem_from_json(
            {
                "batch": batch,
                "cluster": {"nodes": 1, "gpus_per_node": 2},
                "model_preset": "llama3-8b",
                "profile": profile,
            }
        )
    )
    # At least 2 micro-batches (300 tokens, 200 per micro-batch): 5 s + S', 2 S' >= 2 x 5 s + 0.3 s of work.
    # The area bound only charges b per 100 tokens of memory: 2 S >= 15 s + 0.3 s.
    assert micro_batch_bound(tables) == pytest.approx(10.15, rel=1e-4)
    assert area_bound(tables) == pytest.approx(7.65, rel=1e-4)
    # The long-sample part is the same sum here (no rank waits: any sample fills its rank's memory).
    assert lower_bound(tables) == pytest.approx(micro_batch_bound(tables), rel=1e-4)
    # A plan: two samples side by side (5.1 s), then one on both ranks (5.05 s and a negligible transfer).
    plan_time = assignment_step_time(tables, heuristic_plan(tables))
    assert lower_bound(tables) <= plan_time <= 10.2 + 1e-9


def _two_ranks(lengths: list[int]):
    """Samples of these token counts on two ranks of 100 tokens each, b = 1 s, attention only (2e-4 s per
    token squared on one rank; on both, half of it plus 6 bytes a token over 1 kB/s of ring transfer)."""
    profile = {
        "time": {"quadratic": 2e-4, "linear": 0.0, "sample_constant": 0.0, "group_constant": 1.0},
        "comm": {"scheme": "ring", "bytes_per_token": 6.0, "bandwidth_bytes_per_s": {"intra": 1e3, "inter": 1e3}},
        "capacity_tokens_per_rank": 100,
    }
    samples = [{"id": f"s{i}", "text_tokens": x} for i, x in enumerate(lengths)]
    return problem_from_json(
        {
            "batch": {"samples": samples},
            "cluster": {"nodes": 1, "gpus_per_node": 2},
            "model_preset": "llama3-8b",
            "profile": profile,
            "options": {"max_micro_batches": 4},
        }
    )


def test_long_sample_bound_by_hand():
    """Bound 5 against a hand computation: two ranks of 100 tokens, b = 1 s, attention only; one slow
    sample that fills a rank (2 s alone, 1 s + 0.3 s of transfer on both ranks), three of 50 tokens
    (0.5 s alone) and four of 25 (0.125 s alone)."""
    problem = _two_ranks([100, 50, 50, 50, 25, 25, 25, 25])
    tables = CostTables.build(problem)
    fastest, least, _ = _extremes(tables)
    # Two micro-batches at least (350 tokens, 200 per micro-batch) and 4 rank-seconds of least area:
    # 1 s + S', 2 S' >= 2 x 1 s + 4 s, and the slow sample still finishes alone on one rank at S' = 3 s.
    assert micro_batch_bound(tables) == pytest.approx(4.0, rel=1e-4)
    # Alone on a rank the slow sample keeps the other rank 2 s, and the 100 tokens left there carry at
    # most 1 s of work (two samples of 50): 1 s waited, 2 + (2 + 2 + 1) / 2 = 4.5 s. On both ranks it
    # takes 2.6 rank-seconds: 2 + (2 + 2.6) / 2 = 4.3 s, the lesser.
    assert long_sample_bound(tables, fewest_micro_batches(tables), fastest, least) == pytest.approx(4.3, rel=1e-12)
    assert lower_bound(tables) == pytest.approx(4.3, rel=1e-12)
    # The optimum (brute force) is 4.45 s: 1.11 times the micro-batch bound, 1.035 times this one.
    assert brute_force_optimum(problem) == pytest.approx(4.45, rel=1e-9)


def test_few_micro_batch_bound_by_hand():
    """Bound 6 against a hand computation: two ranks of 100 tokens, b = 1 s, attention only; a sample of
    150 tokens (both ranks, 2.7 s), one of 100 (2 s alone, 1.3 s on both ranks) and two of 50 (0.5 s
    alone)."""
    problem = _two_ranks([150, 100, 50, 50])
    tables = CostTables.build(problem)
    fastest, least, _ = _extremes(tables)
    # Two micro-batches at least (350 tokens, 200 per micro-batch) and 8.4 rank-seconds of least area:
    # 1 s + S', 2 S' >= 2 x 1 s + 8.4 s.
    assert fewest_micro_batches(tables) == 2
    assert micro_batch_bound(tables) == pytest.approx(6.2, rel=1e-4)
    # The two long samples cannot share a micro-batch (250 tokens): the 150's lasts 2.7 s, its ranks
    # full. The other holds the 100 and both 50s (1 rank-second): the 100 alone on a rank keeps that
    # micro-batch 2 s; on both ranks it takes 2.6 rank-seconds, and (2.6 + 1) / 2 = 1.8 s. 2 + 2.7 + 1.8.
    # Three micro-batches take 3 + 8.4 / 2 = 7.2 s at least.
    assert few_micro_batch_bound(tables, 2, fastest, least) == pytest.approx(6.5, rel=1e-12)
    assert lower_bound(tables) == pytest.approx(6.5, rel=1e-12)
    # The optimum (brute force) is 6.7 s: the 100 alone on one rank, both 50s on the other.
    assert brute_force_optimum(problem) == pytest.approx(6.7, rel=1e-9)


def test_speed_weighted_bound_holds_for_plans_on_mixed_gpus():
    """On clusters of two GPU types the speed-weighted bound rises above the area bounds and stays
    below every verified plan (the heuristic's and CP-SAT's)."""
    from planning.planner import plan

    rose = 0
    for seed in range(4):
        batch = WORKLOADS["video"].batch(48, seed)
        problem = problem_from_json(
            {
                "batch": batch,
                "cluster_preset": "mixed-h100-a100",
                "model_preset": "qwen2-vl-7b",
                "options": {"deterministic": True, "time_budget_ms": 300},
            }
        )
        tables = CostTables.build(problem)
        speed = speed_weighted_bound(tables, fewest_micro_batches(tables))
        assert speed is not None
        rose += speed > max(area_bound(tables), micro_batch_bound(tables))
        for backend in ("heuristic", "cpsat"):
            result = plan(problem.with_options(backend=backend))
            assert result.predicted_step_time_s >= speed * (1 - 1e-9)
    assert rose >= 3
