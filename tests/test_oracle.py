"""The planner against the brute-force optimum on tiny instances (<= 8 samples, <= 6 ranks)."""

from __future__ import annotations

import math
import random

import pytest
from oracle import brute_force_optimum

from optimizer.errors import InfeasibleError
from optimizer.problem.documents import problem_from_json
from optimizer.verify.verifier import verify
from planning.planner import plan

# The heuristic's worst ratio to the optimum on these 200 instances is about 1.45 (memory-bound
# cases with power-of-two sizes on 3-GPU nodes, where a size-4 group must span nodes); the exact
# backends close such gaps within the budget. The bound leaves a little room; the mean is checked
# tighter (about 1.01 to 1.015 measured, bench/oracle_gap.py).
WORST = 1.5
MEAN = 1.03
SEEDS = 200


def tiny_problem(seed: int, **options):
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    nodes, per_node = rng.choice([(1, 4), (2, 2), (2, 3), (1, 6), (3, 2), (1, 5)])
    samples = [
        {"id": f"s{i}", "text_tokens": rng.choice([rng.randint(100, 3000), rng.randint(3000, 40000)])} for i in range(n)
    ]
    profile = {
        "time": {"quadratic": 2e-10, "linear": 5e-5, "sample_constant": 1e-3, "group_constant": 5e-3},
        "comm": {"scheme": "ring", "bytes_per_token": 1.5e5, "bandwidth_bytes_per_s": {"intra": 3e11, "inter": 2.5e10}},
        "capacity_tokens_per_rank": rng.choice([8000, 16000, 64000]),
    }
    return problem_from_json(
        {
            "batch": {"samples": samples},
            "cluster": {"nodes": nodes, "gpus_per_node": per_node},
            "profile": profile,
            "options": {"backend": "heuristic", "max_micro_batches": 3, **options},
        }
    )


@pytest.mark.parametrize("policy", ["any", "pow2"])
def test_heuristic_close_to_optimum_and_never_worse_than_static(policy):
    ratios = []
    for seed in range(SEEDS):
        problem = tiny_problem(seed, degree_policy=policy)
        optimum = brute_force_optimum(problem)
        if math.isinf(optimum):
            with pytest.raises(InfeasibleError):
                plan(problem)
            continue
        result = plan(problem)
        assert verify(result, problem).ok
        step = result.predicted_step_time_s
        assert step >= optimum * (1 - 1e-9), "no plan beats the optimum: the oracle or the cost model is wrong"
        assert result.lower_bound_s <= optimum * (1 + 1e-9), "the lower bound must hold for the optimum"
        if result.static_baseline is not None:
            assert step <= result.static_baseline.predicted_step_time_s * (1 + 1e-9)
        ratios.append(step / optimum)
        assert step / optimum <= WORST, f"seed {seed}: {step / optimum:.3f} x the optimum"
    assert sum(ratios) / len(ratios) <= MEAN
    assert len(ratios) >= SEEDS * 0.8
