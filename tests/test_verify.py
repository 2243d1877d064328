"""The verifier catches every kind of invalid plan, and recomputes group times with the scalar cost formula."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from optimizer import jit
from optimizer.costs.tables import sample_time, vision_work
from optimizer.plan.records import Assignment
from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import WORKLOADS
from optimizer.verify import verifier as verify_module
from optimizer.verify import verify_kernels
from optimizer.verify.verifier import _Facts, _ints, _violations, check_assignment, group_time, verify
from planning.planner import plan

PROFILE = {
    "time": {"quadratic": 1e-9, "linear": 1e-5, "sample_constant": 1e-3, "group_constant": 2e-3},
    "comm": {"scheme": "ring", "bytes_per_token": 1000.0, "bandwidth_bytes_per_s": {"intra": 1e9, "inter": 5e8}},
    "capacity_tokens_per_rank": 10000,
}


@pytest.fixture
def problem():
    samples = [{"id": f"s{i}", "text_tokens": t} for i, t in enumerate([500, 1200, 9000, 15000, 300])]
    return problem_from_json(
        {
            "batch": {"samples": samples},
            "cluster": {"nodes": 2, "gpus_per_node": 2},
            "profile": PROFILE,
            "options": {"backend": "heuristic", "degree_policy": "pow2", "max_micro_batches": 2},
        }
    )


def violations(problem, mbs):
    return check_assignment(problem, Assignment.of(mbs)).violations


def _flat_of(a: Assignment) -> verify_module._Flat:
    pairs = [pair for mb in a.micro_batches for pair in mb]
    samples, start = _ints([s for _, s in pairs])
    return verify_module._Flat.build(a.micro_batches, [r for r, _ in pairs], samples, start)


def test_valid_assignment_passes(problem):
    assert violations(problem, [[((0, 1), [3]), ((2,), [0, 1]), ((3,), [2, 4])]]) == []


@pytest.mark.parametrize(
    ("mbs", "needle"),
    [
        ([[((0, 1), [3]), ((2,), [0, 1]), ((3,), [2])]], "not planned"),
        ([[((0, 1), [3, 4]), ((2,), [0, 1, 4]), ((3,), [2])]], "more than once"),
        ([[((0, 1), [3]), ((1,), [0, 1]), ((3,), [2, 4])]], "already used"),
        ([[((0, 1, 2), [3]), ((3,), [0, 1, 2, 4])]], "not a power of two"),
        ([[((0, 9), [3]), ((2,), [0, 1]), ((3,), [2, 4])]], "outside"),
        ([[((0,), [3]), ((2,), [0, 1]), ((3,), [2, 4])]], "exceed the capacity"),
        ([[((0, 1), [3])], [((0,), [0])], [((1,), [1, 2, 4])]], "max_micro_batches"),
    ],
)
def test_violations_are_caught(problem, mbs, needle):
    found = violations(problem, mbs)
    assert any(needle in v for v in found), found


def test_plan_level_checks(problem):
    result = plan(problem)
    assert verify(result, problem).ok
    wrong_step = replace(result, predicted_step_time_s=result.predicted_step_time_s * 1.01)
    assert any("predicted step time" in v for v in verify(wrong_step, problem).violations)
    too_high = replace(result, lower_bound_s=result.predicted_step_time_s * 2)
    assert any("lower bound" in v for v in verify(too_high, problem).violations)
    mb = result.micro_batches[0]
    g = mb.groups[0]
    tampered = replace(
        result,
        micro_batches=(replace(mb, groups=(replace(g, predicted_time_s=g.predicted_time_s / 2),) + mb.groups[1:]),)
        + result.micro_batches[1:],
    )
    assert any("recomputed" in v for v in verify(tampered, problem).violations)


def test_the_plans_own_sample_indices_are_checked_before_they_are_read(problem):
    """verify reads Plan.sample_indices only when they name the ids the groups list: stale or wrong
    indices send it to the id-by-id look-up, which judges the groups as they are."""
    result = plan(problem)
    assert result.sample_indices is not None
    assert sorted(result.sample_indices) == list(range(len(problem.batch.samples)))
    assert verify(result, problem).ok
    assert verify(replace(result, sample_indices=tuple(reversed(result.sample_indices))), problem).ok
    assert verify(replace(result, sample_indices=(99,) * len(result.sample_indices)), problem).ok
    assert verify(replace(result, sample_indices=None), problem).ok
    # A sample listed twice, its indices left as they were: caught either way.
    groups = [g for mb in result.micro_batches for g in mb.groups]
    first = groups[0]
    doubled = replace(first, samples=first.samples + (groups[-1].samples[0],), lengths=first.lengths + (1,))
    mb = result.micro_batches[0]
    tampered = replace(
        result, micro_batches=(replace(mb, groups=(doubled,) + mb.groups[1:]),) + result.micro_batches[1:]
    )
    assert any("more than once" in v for v in verify(tampered, problem).violations)


# -- every message, word for word --------------------------------------------------------------


def test_every_assignment_violation_is_named_in_order(problem):
    a = Assignment(
        (
            (((), (0,)), ((0, 9), (1,)), ((1, 1), (2,)), ((1, 2, 3), (3, 7)), ((0, 3), (3, -1))),
            (((0,), (4, 4)),),
            (((2, 1, 0, 3, 3), (2,)), ((3,), (3,))),
        )
    )
    assert check_assignment(problem, a).violations == [
        "3 micro-batches exceed options.max_micro_batches 2",
        "micro-batch 0 group 0: has no ranks",
        "micro-batch 0 group 1: ranks [9] outside 0..3",
        "micro-batch 0 group 2: repeats a rank",
        "micro-batch 0 group 3: ranks [1] already used in this micro-batch",
        "micro-batch 0 group 3: size 3 is not a power of two",
        "micro-batch 0 group 3: unknown sample index 7",
        "micro-batch 0 group 4: ranks [3] already used in this micro-batch",
        "micro-batch 0 group 4: unknown sample index -1",
        "micro-batch 2 group 0: repeats a rank",
        "micro-batch 2 group 0: size 5 exceeds the domain of 4 ranks",
        "micro-batch 2 group 1: ranks [3] already used in this micro-batch",
        "micro-batch 2 group 1: 15000 tokens per rank exceed the capacity of 10000",
        "samples not planned: ['s0', 's1']",
        "samples planned more than once: ['s2', 's3', 's4']",
    ]


def test_degree_rules_of_ulysses_and_max_degree_are_named():
    problem = problem_from_json(
        {
            "batch": WORKLOADS["video"](20, seed=1),
            "cluster_preset": "h100-8x8",
            "model_preset": "qwen2-vl-7b",
            "options": {"cp_scheme": "ulysses", "degree_policy": "any", "max_degree": 8},
        }
    )
    heads = problem.model.llm.heads // problem.cluster.tensor_parallel
    a = Assignment((((tuple(range(3)), tuple(range(5))), (tuple(range(3, 12)), tuple(range(5, 20)))),))
    found = check_assignment(problem, a).violations
    assert found[:2] == [
        f"micro-batch 0 group 0: size 3 does not divide the {heads} attention heads per rank (Ulysses; the hybrid "
        "scheme takes any size)",
        "micro-batch 0 group 1: size 9 exceeds options.max_degree 8",
    ]


def test_every_plan_violation_is_named(problem):
    result = plan(problem)
    mbs = list(result.micro_batches)
    groups = list(mbs[0].groups)
    g0 = groups[0]
    groups[0] = replace(
        g0, samples=g0.samples + ("nobody",), predicted_time_s=g0.predicted_time_s * 2, intra_node=not g0.intra_node
    )
    mbs[0] = replace(mbs[0], groups=tuple(groups))
    tampered = replace(result, micro_batches=tuple(mbs), lower_bound_s=result.predicted_step_time_s * 3)
    t, _, intra = group_time(problem, g0.ranks, tuple(problem.batch.index[s] for s in g0.samples))
    found = verify(tampered, problem).violations
    assert found == [
        "micro-batch 0 group 0: unknown samples ['nobody']",
        f"micro-batch 0 group 0: predicted {g0.predicted_time_s * 2:.6g} s, recomputed {t:.6g} s",
        f"micro-batch 0 group 0: intra_node says {not g0.intra_node}, ranks say {intra}",
        (
            f"lower bound {result.predicted_step_time_s * 3:.6g} s exceeds the step time "
            f"{result.predicted_step_time_s:.6g} s"
        ),
    ]


def test_the_array_checks_and_the_named_checks_agree(problem):
    """Random edits of a valid assignment: the arrays find a violation exactly when the per-group pass names one."""
    rng = random.Random(3)
    n_ranks, n_samples = problem.cluster.domain_size, len(problem.batch.samples)
    base = [[([0, 1], [3]), ([2], [0, 1]), ([3], [2, 4])]]
    for _ in range(300):
        mbs = [[(list(r), list(s)) for r, s in mb] for mb in base]
        for _ in range(rng.randint(0, 2)):
            r, s = rng.choice(rng.choice(mbs))
            edit = rng.randrange(7)
            if edit == 0:
                r.append(rng.choice([n_ranks, -1, rng.randrange(n_ranks)]))
            elif edit == 1:
                r.clear()
            elif edit == 2 and s:
                s.pop()
            elif edit == 3:
                s.append(rng.choice([n_samples, -2, rng.randrange(n_samples)]))
            elif edit == 4:
                mbs.append([([rng.randrange(n_ranks)], [rng.randrange(n_samples)])])
            elif edit == 5:
                r[1:] = []
            else:
                s.append(3)
        a = Assignment(tuple(tuple((tuple(r), tuple(s)) for r, s in mb) for mb in mbs))
        report = check_assignment(problem, a)
        named = _violations(problem, a.micro_batches, _Facts(problem).recompute(_flat_of(a)))
        assert report.violations == named


# -- the recomputed times are the scalar formula's ---------------------------------------------

RING = dict(
    PROFILE,
    comm={
        **PROFILE["comm"],
        "latency_s": {"intra": 3e-6, "inter": 2e-5},
        "messages_per_step": 7,
        "overlap_with_attention": True,
        "bandwidth_bytes_per_s": {"intra": {"2": 2e9, "8": 1.5e9}, "inter": 5e8},
    },
    time={**PROFILE["time"], "vision_linear": 1e-6, "vision_quadratic": 1e-10},
    speed_by_gpu={"A100-80GB": 0.4},
    capacity_tokens_per_rank={"default": 10000, "A100-80GB": 6000},
)
ULYSSES = dict(
    PROFILE, comm={"scheme": "ulysses", "bytes_per_token": 700.0, "bandwidth_bytes_per_s": {"intra": 3e9, "inter": 4e8}}
)
CASES = [
    {"batch": WORKLOADS["mixed"](60, seed=2), "cluster_preset": "mixed-h100-a100", "model_preset": "qwen2-vl-7b"},
    {"batch": WORKLOADS["dynamic-res"](50, seed=4), "cluster_preset": "mixed-h100-a100", "profile": RING},
    {"batch": WORKLOADS["dynamic-res"](50, seed=5), "cluster_preset": "mixed-h100-a100", "profile": ULYSSES},
    {
        "batch": WORKLOADS["image-sft"](40, seed=3),
        "cluster_preset": "ascend910b-8x8",
        "model_preset": "internvl2-8b",
        "options": {"cp_scheme": "ulysses"},
    },
]


def _random_assignment(problem, rng: random.Random) -> Assignment:
    """Three micro-batches of random groups (1 to 16 ranks, within a node or across nodes) sharing
    the samples at random."""
    n_ranks, n_samples = problem.cluster.domain_size, len(problem.batch.samples)
    mbs: list[list[tuple[list[int], list[int]]]] = []
    for _ in range(3):
        ranks = list(range(n_ranks))
        if rng.random() < 0.5:
            rng.shuffle(ranks)
        groups = []
        while ranks:
            d = rng.randint(1, 16)
            groups.append((ranks[:d], []))
            ranks = ranks[d:]
        mbs.append(groups)
    for i in range(n_samples):
        rng.choice(rng.choice(mbs))[1].append(i)
    return Assignment(tuple(tuple((tuple(r), tuple(s)) for r, s in mb) for mb in mbs))


def _scalar_group_time(problem, ranks, samples) -> float:
    if not samples:
        return 0.0
    profile, cluster = problem.cost_profile, problem.cluster
    intra = len({cluster.rank_node[r] for r in ranks}) == 1
    speed = min(profile.speed_for(cluster.rank_gpu(r).name) for r in ranks)
    total = profile.group_constant
    for i in samples:
        s = problem.batch.samples[i]
        total += sample_time(profile, s.length, vision_work(profile, s), len(ranks), intra, speed)
    return total


@pytest.mark.parametrize("case", range(len(CASES)))
def test_recomputed_times_equal_the_scalar_formula(case):
    problem = problem_from_json(CASES[case])
    rng = random.Random(case)
    for _ in range(5):
        a = _random_assignment(problem, rng)
        times: list[list[float]] = []
        report = check_assignment(problem, a, times=times)
        want = [[_scalar_group_time(problem, r, s) for r, s in mb] for mb in a.micro_batches]
        assert len(times) == len(want)
        for got_mb, want_mb in zip(times, want, strict=True):
            assert got_mb == pytest.approx(want_mb, rel=1e-12, abs=0.0)
        assert report.step_time_s == pytest.approx(sum(max(mb, default=0.0) for mb in want), rel=1e-12)
        r, s = a.micro_batches[0][0]
        assert group_time(problem, r, s)[0] == pytest.approx(want[0][0], rel=1e-12)


@pytest.mark.skipif(not jit.HAVE_NUMBA, reason="numba is off: only the plain-Python form exists")
def test_plain_python_kernels_give_the_compiled_results(monkeypatch):
    assert jit.load()  # the compiled forms first, whatever this process ran before
    problem = problem_from_json(CASES[1])
    a = _random_assignment(problem, random.Random(9))
    compiled_times: list[list[float]] = []
    compiled = check_assignment(problem, a, times=compiled_times)
    for name in ("recompute_groups", "vision_seconds", "sample_seconds"):
        monkeypatch.setattr(verify_kernels, name, getattr(verify_kernels, name).py_func)
    monkeypatch.setattr(verify_module, "recompute_groups", verify_kernels.recompute_groups)
    monkeypatch.setattr(verify_module, "vision_seconds", verify_kernels.vision_seconds)
    plain_times: list[list[float]] = []
    plain = check_assignment(problem, a, times=plain_times)
    assert plain.violations == compiled.violations
    assert plain.step_time_s == pytest.approx(compiled.step_time_s, rel=1e-12)
    assert np.allclose(np.concatenate(plain_times), np.concatenate(compiled_times), rtol=1e-12, atol=0.0)
