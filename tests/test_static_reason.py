"""A plan without a static baseline says why: the rule that ruled out every static power-of-two layout
(``static_baseline_reason`` in the plan's JSON, ``static layout: none (...)`` in the summary)."""

from __future__ import annotations

from optimizer.costs.tables import CostTables
from optimizer.heuristic.static_layout import best_static, no_static_reason
from optimizer.plan.summary import summary_text
from optimizer.problem.documents import problem_from_json
from planning.planner import plan

LONG = 100_000
"""More tokens than 4 H100 ranks hold under qwen2-vl-7b (18,325 each), fewer than 7 hold."""


def ulysses_problem():
    """Ulysses with 28 heads: the powers of two it allows are 1, 2 and 4, too small for the long sample."""
    samples = [{"id": "long", "text_tokens": LONG}] + [{"id": f"s{k}", "text_tokens": 3000} for k in range(40)]
    return problem_from_json(
        {
            "batch": {"samples": samples},
            "cluster_preset": "h100-8x8",
            "model_preset": "qwen2-vl-7b",
            "options": {"cp_scheme": "ulysses", "backend": "heuristic", "deterministic": True},
        }
    )


RULES = (
    "no static power-of-two layout fits: each of sizes 1, 2, 4 cannot hold the longest sample (100,000 tokens; "
    "18,325 tokens per rank on the smallest GPU); each of sizes 8, 16, 32, 64 does not divide the 28 attention "
    "heads per rank"
)


def test_every_power_of_two_is_ruled_out_by_a_named_rule():
    problem = ulysses_problem()
    ruled_out: dict[int, str] = {}
    assert best_static(CostTables.build(problem), ruled_out) is None
    assert sorted(ruled_out) == [1, 2, 4, 8, 16, 32, 64]
    assert no_static_reason(ruled_out).startswith(RULES)


def test_the_plan_and_its_summary_carry_the_reason():
    problem = ulysses_problem()
    result = plan(problem)
    doc = result.to_json(shards=False)
    assert "static_baseline" not in doc
    assert doc["static_baseline_reason"].startswith(RULES)
    assert result.solver.details["skipped"]["static_baseline"] == doc["static_baseline_reason"]
    assert f"static layout: none ({doc['static_baseline_reason']})" in summary_text(result, problem).splitlines()


def test_a_plan_with_a_static_baseline_has_no_reason(make_problem):
    result = plan(make_problem(backend="heuristic", deterministic=True))
    doc = result.to_json(shards=False)
    assert doc["static_baseline"] and "static_baseline_reason" not in doc


def test_sizes_ruled_out_by_the_same_rule_are_named_together():
    assert no_static_reason({1: "cannot hold it", 4: "needs more", 2: "cannot hold it"}) == (
        "no static power-of-two layout fits: each of sizes 1, 2 cannot hold it; size 4 needs more"
    )
