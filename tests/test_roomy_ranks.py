"""Mixed GPU types with different capacities: a batch that only the roomier GPUs can hold is planned, never refused;
one that no group can hold is refused with a proof and a message that says why."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.costs.tables import CostTables
from optimizer.costs.zoo import load_profile
from optimizer.errors import InfeasibleError
from optimizer.problem.degrees import group_capacities
from optimizer.problem.documents import problem_from_json
from optimizer.verify.verifier import verify
from planning.planner import plan

MODEL = {
    "name": "gpt-7b-64h",
    "llm": {
        "layers": 32,
        "hidden": 4096,
        "heads": 64,
        "kv_heads": 64,
        "ffn_hidden": 11008,
        "vocab": 32000,
        "parameters": 7.0e9,
    },
    "training": {"zero_stage": 3, "recompute": "full"},
}
# stress-mixed-gpu: H100 ranks hold 6,449 tokens, A100 ranks 4,300 (and run at 0.32 of the speed).


def _problem(h100: int, a100: int, lengths: list[int], backend: str = "heuristic"):
    cluster = {"nodes": [{"count": h100, "gpus": 1, "gpu": "H100-SXM"}, {"count": a100, "gpus": 1, "gpu": "A100-80GB"}]}
    batch = {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(lengths)]}
    return problem_from_json(
        {
            "batch": batch,
            "cluster": cluster,
            "model": MODEL,
            "profile": load_profile("stress-mixed-gpu"),
            "options": {"backend": backend, "time_budget_ms": 300},
        }
    )


def test_group_capacity_is_its_smallest_rank_times_its_size():
    caps = [6449.0, 6449.0, 4300.0, 4300.0]
    assert group_capacities(caps, [1, 2, 4]).tolist() == [6449.0, 12898.0, 17200.0]


@pytest.mark.parametrize("backend", ["heuristic", "auto"])
def test_a_sample_only_the_roomy_ranks_hold_is_planned_on_them(backend):
    # 10,932 tokens need 3 ranks at the smallest capacity (the sizes allowed on 3 ranks are 1 and 2);
    # the 2 H100 ranks hold 12,898.
    problem = _problem(2, 1, [10932], backend)
    result = plan(problem)
    assert verify(result, problem).ok
    (group,) = [g for mb in result.micro_batches for g in mb.groups]
    assert sorted(group.ranks) == [0, 1]  # the two H100 ranks
    assert "roomiest_nodes" in result.solver.details["heuristic"]


def test_the_split_plan_runs_the_short_samples_on_every_rank_and_the_faster_plan_wins():
    # 20,000 tokens: 4 ranks at the smallest capacity hold 17,200 (sizes 1, 2, 4 on 6 ranks), the 4 H100s 25,796.
    from optimizer.heuristic.roomy_ranks import _cut, _mapped, _split_plan, roomy_plan
    from optimizer.heuristic.strategies import heuristic_plan
    from optimizer.plan.evaluate import assignment_step_time
    from optimizer.verify.verifier import check_assignment

    problem = _problem(4, 2, [20000] + [900] * 40)
    tables = CostTables.build(problem)
    sub = _cut(problem, [0, 1, 2, 3])
    ranks = np.arange(4)
    split = _split_plan(tables, sub, ranks, None)
    assert split is not None and check_assignment(problem, split).ok
    assert {r for mb in split.micro_batches for ranks_, _ in mb for r in ranks_} == set(range(6))
    (head,) = split.micro_batches[0]
    assert head == ((0, 1, 2, 3), (0,))  # the long sample alone on the H100s, first
    whole = _mapped(heuristic_plan(CostTables.build(sub)), ranks)
    chosen, _ = roomy_plan(tables, None)
    assert assignment_step_time(tables, chosen) == min(
        assignment_step_time(tables, split), assignment_step_time(tables, whole)
    )


def test_a_sample_no_group_holds_is_refused_with_the_reason():
    # 22,974 tokens: 4 ranks hold 4 x 4,300 = 17,200 (the A100s bind), the 2 H100s 12,898: no allowed group holds it.
    problem = _problem(2, 2, [22974, 500])
    with pytest.raises(InfeasibleError, match="no allowed group holds it") as info:
        CostTables.build(problem)
    assert "17200 tokens" in info.value.message
