"""The hybrid context-parallel scheme: Ulysses over u ranks inside ring over d / u."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import numpy as np
import pytest

from optimizer.costs.cp_schemes import ulysses_width
from optimizer.costs.tables import CostTables, sample_time
from optimizer.costs.zoo import load_profile
from optimizer.errors import InfeasibleError, ProblemError
from optimizer.plan.sharding import padded_length, token_ranges
from optimizer.problem.documents import problem_from_json
from optimizer.verify.plan_document import check_plan_document
from planning.planner import plan

HEADS_28 = "qwen2-vl-7b"


def _batch(longest: int, n: int = 24, seed: int = 3) -> dict[str, Any]:
    rng = random.Random(seed)
    samples = [{"id": "long", "text_tokens": longest}]
    samples += [{"id": f"s{i}", "text_tokens": rng.randint(500, 12000)} for i in range(n)]
    return {"samples": samples}


def _request(**over: Any) -> dict[str, Any]:
    doc = {
        "batch": _batch(230_000),
        "cluster_preset": "h100-8x8",
        "model_preset": HEADS_28,
        "profile": load_profile("stress-group-constant"),
        "options": {"backend": "heuristic", "time_budget_ms": 2000, "deterministic": True},
    }
    doc.update(over)
    return doc


@pytest.mark.parametrize(("length", "d", "u"), [(40, 4, 2), (37, 6, 2), (1000, 12, 4), (5, 8, 4), (99, 8, 8)])
def test_the_hybrid_split_covers_every_token_once_and_balances_the_ring(length, d, u):
    ranges = token_ranges(length, d, "hybrid", u)
    held = sorted(t for rs in ranges for a, b in rs for t in range(a, b))
    assert held == list(range(length))
    padded = padded_length(length, d, "hybrid")
    assert padded % (2 * d) == 0
    full = token_ranges(padded, d, "hybrid", u)
    assert {sum(b - a for a, b in rs) for rs in full} == {padded // d}
    r, chunk = d // u, padded // (2 * (d // u))
    for p, rs in enumerate(full):
        i = p // u
        assert rs[0][0] // chunk == i and rs[1][0] // chunk == 2 * r - 1 - i  # zig-zag chunks of ring position i


def test_hybrid_with_one_ulysses_rank_is_the_ring_split():
    for length, d in ((40, 4), (37, 6), (1, 3)):
        assert token_ranges(length, d, "hybrid", 1) == token_ranges(length, d, "ring")


def test_a_width_that_does_not_divide_the_group_is_refused():
    with pytest.raises(ValueError, match="must divide the group size"):
        token_ranges(40, 6, "hybrid", 4)


def test_the_ulysses_width_divides_heads_and_size_and_stays_within_a_node():
    problem = problem_from_json(_request(options={"cp_scheme": "hybrid"}))
    for d in range(1, 65):
        u = ulysses_width(problem, d)
        assert d % u == 0 and 28 % u == 0 and u <= 8


def test_without_overlap_or_latency_the_width_sends_the_fewest_bytes():
    profile = load_profile("stress-group-constant")  # Ulysses, no overlap, no latency
    problem = problem_from_json(_request(profile=profile, options={"cp_scheme": "hybrid"}))
    p = problem.cost_profile
    for d in range(2, 65):
        options = [v for v in range(1, 9) if d % v == 0 and 28 % v == 0]
        sent = {v: p.bytes_per_token * (d // v - 1) + (p.ulysses_bytes_per_token if v > 1 else 0.0) for v in options}
        best = min(sent.values())
        assert ulysses_width(problem, d) == max(v for v in options if sent[v] <= best * (1 + 1e-12))


def test_hybrid_never_costs_the_batch_more_than_the_ring_at_any_size():
    for profile in (None, load_profile("analytical-llama3-8b-h100-8x8")):
        hybrid = CostTables.build(problem_from_json(_request(profile=profile, options={"cp_scheme": "hybrid"})))
        ring = CostTables.build(problem_from_json(_request(profile=profile, options={"cp_scheme": "ring"})))
        inside = hybrid.degrees <= hybrid.node_size  # the width is chosen for the span a size is placed on
        for intra, sizes in ((True, inside), (False, ~inside)):
            h, r = hybrid.time_matrix(intra).sum(axis=0), ring.time_matrix(intra).sum(axis=0)
            assert np.all(h[sizes] <= r[sizes] * (1 + 1e-9))


def test_a_ulysses_profile_plans_a_sample_beyond_the_heads_as_hybrid_and_says_why():
    problem = problem_from_json(_request())
    assert problem.profile is not None and problem.profile.scheme == "ulysses"
    assert problem.scheme == "hybrid"
    assert "28 attention heads" in (problem.scheme_reason or "")
    result = plan(problem)
    doc = result.to_json()
    assert doc["scheme"] == "hybrid" and "Ulysses inside ring" in doc["scheme_reason"]
    long_group = next(g for mb in doc["micro_batches"] for g in mb["groups"] if "long" in g["samples"])
    assert long_group["degree"] >= 36
    assert long_group["ulysses_size"] == ulysses_width(problem, long_group["degree"])
    assert check_plan_document(problem, doc).ok


def test_the_same_batch_asked_as_ulysses_is_refused_with_a_fix_that_works():
    request = _request(options={"backend": "heuristic", "cp_scheme": "ulysses"})
    with pytest.raises(InfeasibleError) as err:
        plan(problem_from_json(request))
    assert "must divide the 28 attention heads" in str(err.value)
    assert "options.cp_scheme to 'hybrid'" in (err.value.hint or "")
    fixed = copy.deepcopy(request)
    fixed["options"]["cp_scheme"] = "hybrid"
    assert plan(problem_from_json(fixed)).scheme == "hybrid"


def test_a_batch_too_long_for_the_domain_names_the_domain_not_max_degree():
    with pytest.raises(InfeasibleError) as err:
        plan(problem_from_json(_request(cluster_preset="h100-1x8", options={"max_degree": 64})))
    assert "the domain has 8 ranks" in str(err.value)
    assert "max_degree" not in (err.value.hint or "") and "at least 36 ranks" in (err.value.hint or "")


def test_a_sample_ulysses_holds_keeps_the_profile_scheme():
    problem = problem_from_json(_request(batch=_batch(20_000)))
    assert problem.scheme == "ulysses" and problem.scheme_reason is None


def test_hybrid_times_agree_across_tables_scalar_formula_and_verifier():
    for profile in ("stress-group-constant", "flexsp-gpt7b"):
        request = _request(profile=load_profile(profile), options={"backend": "heuristic", "cp_scheme": "hybrid"})
        problem = problem_from_json(request)
        tables = CostTables.build(problem)
        widths = tables.ulysses_widths.tolist()
        assert any(u > 1 for u in widths) and any(u == 1 for u in widths[1:])
        p = tables.profile
        for intra in (True, False):
            m = tables.time_matrix(intra)
            for j, d in enumerate(tables.degrees.tolist()):
                for i in (0, 3, 7):
                    placed = intra and d <= tables.node_size  # wider sizes span nodes in both matrices
                    want = sample_time(p, int(tables.lengths[i]), 0.0, d, placed, 1.0, widths[j])
                    assert m[i, j] == want
        result = plan(problem)
        assert check_plan_document(problem, result.to_json()).ok


def test_hybrid_with_u_one_costs_what_the_ring_costs():
    ring = problem_from_json(_request(profile=None, options={"cp_scheme": "ring"}))
    hybrid = problem_from_json(_request(profile=None, options={"cp_scheme": "hybrid"}))
    assert hybrid.cost_profile.bytes_per_token == ring.cost_profile.bytes_per_token
    rt, ht = CostTables.build(ring), CostTables.build(hybrid)
    ones = np.flatnonzero(ht.ulysses_widths == 1)
    assert len(ones) > 10
    for intra in (True, False):
        assert np.array_equal(rt.time_matrix(intra)[:, ones], ht.time_matrix(intra)[:, ones])


def test_hybrid_sends_less_than_the_ring_where_it_runs_ulysses():
    request = _request(options={"backend": "heuristic", "cp_scheme": "hybrid"})
    hybrid = CostTables.build(problem_from_json(request))
    j = int(np.flatnonzero(hybrid.ulysses_widths == 7)[0])  # 28 heads, 8 GPUs per node
    d = int(hybrid.degrees[j])
    p = hybrid.profile
    ring_only = p.bytes_per_token * (d - 1) / d
    assert p.bytes_per_token * (d // 7 - 1) / d + p.ulysses_bytes_per_token / d < ring_only


def test_a_ring_profile_asked_as_hybrid_keeps_its_measured_volume():
    ring_profile = load_profile("analytical-llama3-8b-h100-8x8")
    problem = problem_from_json(_request(profile=ring_profile, options={"cp_scheme": "hybrid"}))
    p = problem.cost_profile
    assert p.scheme == "hybrid" and p.bytes_per_token == ring_profile["comm"]["bytes_per_token"]
    assert p.ulysses_bytes_per_token > p.bytes_per_token  # the all-to-all moves q, k, v and o
    assert "as hybrid" in p.source


def test_a_hybrid_profile_needs_the_all_to_all_volume():
    profile = load_profile("stress-group-constant")
    profile["comm"]["scheme"] = "hybrid"
    with pytest.raises(ProblemError) as err:
        problem_from_json(_request(profile=profile))
    assert err.value.field == "profile.comm.ulysses_bytes_per_token"
    profile["comm"]["ulysses_bytes_per_token"] = 3.0e6
    assert problem_from_json(_request(profile=profile)).cost_profile.ulysses_bytes_per_token == 3.0e6


def test_the_plan_document_check_finds_a_wrong_ulysses_size_and_a_wrong_split():
    problem = problem_from_json(_request())
    doc = json.loads(json.dumps(plan(problem).to_json()))
    group = next(g for mb in doc["micro_batches"] for g in mb["groups"] if g["ulysses_size"] > 1)
    group["ulysses_size"] = 1
    found = check_plan_document(problem, doc).violations
    assert any("ulysses_size" in v and "runs Ulysses over" in v for v in found)
