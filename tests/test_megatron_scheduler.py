"""trainer.megatron: dhp as Megatron-Core's hybrid context-parallel scheduler.

The schedule keeps the contract of megatron-core's ``BalancedCPScheduler`` (checked against the real
scheduler's output shape on the same batch), stands for a plan the verifier accepts under Megatron's
rules, leaves no rank without a sub-sample in the last barrier group, is the same on every rank of a
real process group (broadcast or deterministic), and runs through Megatron-Core's own wrapper and
forward-backward loop on CPU.
"""

from __future__ import annotations

import random

import pytest

from optimizer.errors import ProblemError
from optimizer.plan.records import Assignment
from optimizer.problem.documents import problem_from_json
from optimizer.verify.verifier import check_assignment
from trainer.megatron import MEGATRON_RULES, PlannedCPScheduler, assignment_of, busy_last, install, schedule_of

PROFILE = {
    "time": {"quadratic": 2e-9, "linear": 2e-5, "sample_constant": 2e-3, "group_constant": 5e-3},
    "comm": {"scheme": "ring", "bytes_per_token": 3000, "bandwidth_bytes_per_s": {"intra": 5e8, "inter": 1e8}},
    "capacity_tokens_per_rank": 1000,
}


class Group:
    """A stand-in for the DP x CP process group: Megatron's scheduler reads only its size."""

    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n


def _batch(n: int, seed: int, longest: int = 6000) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(100 + i, int(32 * (longest / 32) ** rng.random())) for i in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_schedule_keeps_megatrons_contract_and_the_rules(seed: int) -> None:
    n_ranks = 16
    batch = _batch(48, seed)
    scheduler = PlannedCPScheduler(1000, Group(n_ranks), profile=PROFILE, gpus_per_node=8, budget_ms=300)
    groups, sample_id_groups = scheduler.get_groups_and_subsamples(batch, None)
    length = dict(batch)
    assert len(groups) == len(sample_id_groups) >= 1
    seen: list[int] = []
    for per_rank_lengths, per_rank_ids in zip(groups, sample_id_groups, strict=True):
        assert len(per_rank_ids) == len(per_rank_lengths) == n_ranks
        for lengths, ids in zip(per_rank_lengths, per_rank_ids, strict=True):
            assert lengths == [length[i] for i in ids]
        listing: dict[int, list[int]] = {}
        for r, ids in enumerate(per_rank_ids):
            for i in ids:
                listing.setdefault(i, []).append(r)
        for i, ranks in listing.items():
            d = len(ranks)  # the sample's CP size: the ranks that list it, an aligned block Megatron created
            assert ranks == list(range(ranks[0], ranks[0] + d)) and (d in (1, n_ranks) or ranks[0] % d == 0)
            assert length[i] <= 1000 * d  # memory per sample
            assert all(
                per_rank_ids[r] == per_rank_ids[ranks[0]] for r in ranks
            )  # the same sub-samples, in the same order
        seen.extend(listing)
    assert sorted(seen) == sorted(i for i, _ in batch)
    assert all(ids for ids in sample_id_groups[-1])  # every rank runs a last sub-sample
    problem = scheduler.problem(batch)
    index = {i: k for k, (i, _) in enumerate(batch)}
    report = check_assignment(problem, assignment_of(sample_id_groups, index))
    assert report.ok, report.violations[:3]
    assert report.step_time_s == pytest.approx(scheduler.last["predicted_step_time_s"], rel=1e-9)
    assert problem.options.degree_policy == "aligned" and problem.options.memory == "sample"


def test_real_megatron_schedule_has_the_same_shape_and_is_slower() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler

    batch = _batch(64, 7)
    ours = PlannedCPScheduler(1000, Group(16), profile=PROFILE, gpus_per_node=8, budget_ms=300)
    mine = ours.get_groups_and_subsamples(batch, None)
    theirs = BalancedCPScheduler(1000, Group(16)).get_groups_and_subsamples(batch, None)
    for schedule in (mine, theirs):
        assert [len(g) for g in schedule[0]] == [16] * len(schedule[0])
        assert all(isinstance(i, int) for k in schedule[1] for r in k for i in r)
    problem = ours.problem(batch)
    index = {i: k for k, (i, _) in enumerate(batch)}
    megatron = check_assignment(problem, assignment_of(theirs[1], index))
    assert megatron.ok, megatron.violations[:3]  # Megatron's own schedule obeys the rules the planner plans under
    assert ours.last["predicted_step_time_s"] <= megatron.step_time_s


def test_busy_last_gives_every_rank_a_last_sub_sample() -> None:
    scheduler = PlannedCPScheduler(1000, Group(8), profile=PROFILE, gpus_per_node=8)
    batch = [(0, 3500), (1, 900), (2, 800), (3, 700), (4, 600), (5, 500)]
    problem = scheduler.problem(batch)
    # Micro-batch 0: the long sample on ranks 0-3, ranks 4-7 idle; micro-batch 1: five short ones, three ranks idle.
    assignment = Assignment.of([[((0, 1, 2, 3), (0,))], [((0,), (1, 2)), ((1,), (3,)), ((2,), (4,)), ((3,), (5,))]])
    fixed = busy_last(problem, assignment)
    last = fixed.micro_batches[-1]
    assert sorted(r for ranks, _ in last for r in ranks) == list(range(8))
    report = check_assignment(problem, fixed)
    assert report.ok, report.violations
    # A barrier group where every rank is busy already goes last, unchanged.
    busy = [((r,), (r + 1,)) for r in range(4)] + [((4, 5, 6, 7), (0,))]
    reordered = busy_last(problem, Assignment.of([busy, [((0, 1), (5,))]]))
    assert reordered.micro_batches == Assignment.of([[((0, 1), (5,))], busy]).micro_batches


def test_schedule_round_trip() -> None:
    assignment = Assignment.of([[((0, 1), (2,)), ((2,), (0, 1)), ((3,), (3,))], [((0, 1, 2, 3), (4,))]])
    ids = ["a", "b", "c", "d", "e"]
    groups, sample_ids = schedule_of(assignment, ids, [10, 20, 30, 40, 50], 4)
    assert sample_ids[0] == [["c"], ["c"], ["a", "b"], ["d"]]
    assert groups[0] == [[30], [30], [10, 20], [40]]
    back = assignment_of(sample_ids, {s: k for k, s in enumerate(ids)})
    assert {tuple(sorted(g)) for mb in back.micro_batches for g in mb} == {
        tuple(sorted(g)) for mb in assignment.micro_batches for g in mb
    }


def test_plan_ahead_and_install() -> None:
    scheduler = PlannedCPScheduler(1000, Group(8), profile=PROFILE, gpus_per_node=8, budget_ms=300)
    batch = _batch(24, 3)
    scheduler.plan_ahead(batch)
    schedule = scheduler.get_groups_and_subsamples(batch, None)
    assert scheduler.last["source"] == "ahead"
    assert {i for k in schedule[1] for r in k for i in r} == {i for i, _ in batch}
    scheduler.get_groups_and_subsamples(batch, None)
    assert scheduler.last["source"] == "now"  # a plan made ahead serves its batch once
    scheduler.close()

    class Wrapper:  # the attributes of HybridCPDataLoaderWrapper that install() reads and writes
        config = type("Config", (), {"max_seqlen_per_dp_cp_rank": 1000})()
        dp_cp_group = Group(8)
        cp_balancing_scheduler = None

    wrapper = Wrapper()
    installed = install(wrapper, profile=PROFILE)
    assert wrapper.cp_balancing_scheduler is installed and installed.total_hdp_gpus == 8


def test_bad_input_is_named() -> None:
    with pytest.raises(ProblemError, match="needs the model"):
        PlannedCPScheduler(1000, Group(8))
    scheduler = PlannedCPScheduler(1000, Group(8), profile=PROFILE)
    with pytest.raises(ProblemError, match="has length 0"):
        scheduler.get_groups_and_subsamples([(0, 100), (1, 0)], None)
    with pytest.raises(ProblemError, match="not a whole number of 8-GPU nodes"):
        PlannedCPScheduler(1000, Group(12), profile=PROFILE)
    with pytest.raises(ProblemError, match="profile.time"):
        PlannedCPScheduler(1000, Group(8), profile={**PROFILE, "time": {"quadratic": -1}})
    assert scheduler.get_groups_and_subsamples([], None) == ([], [])
    assert MEGATRON_RULES == {"degree_policy": "aligned", "memory": "sample"}
    assert problem_from_json(scheduler.request([(0, 5)]))  # the service's request document is a valid request


def test_megatrons_own_wrapper_and_loop_run_the_schedule() -> None:
    pytest.importorskip("megatron.core")
    from megatron_workers import megatron_step_worker

    from trainer.launch import spawn

    rng = random.Random(11)
    # Each of 4 DP ranks loads 2 packed samples of 1-4 sub-samples, 20 to 3,000 tokens (capacity 1,000 per rank).
    lengths = {
        r: [[rng.randint(20, 3000 if rng.random() < 0.15 else 600) for _ in range(rng.randint(1, 4))] for _ in range(2)]
        for r in range(4)
    }
    by_rank = spawn(megatron_step_worker, 4, lengths, 1000, PROFILE, (False, True))  # broadcast, then deterministic
    for mode, deterministic in enumerate((False, True)):
        _check_megatron_run([res[mode] for res in by_rank], lengths, deterministic)


def _check_megatron_run(results: list[dict], lengths: dict[int, list[list[int]]], deterministic: bool) -> None:
    assert len({res["digest"] for res in results}) == 1
    schedule = results[0]["sample_id_groups"]
    assert all(res["sample_id_groups"] == schedule for res in results)
    if not deterministic:
        assert [res["source"] for res in results] == ["now", None, None, None]  # rank 0 planned, the others received it
    flat = [n for r in range(4) for packed in lengths[r] for n in packed]
    for rank, res in enumerate(results):
        expected = [i for group in schedule for i in group[rank]]
        assert [run["length"] for run in res["ran"]] == [
            flat[i] for i in expected
        ]  # its sub-samples, in order, routed to it
        cp = {i: sum(i in group[r] for r in range(4)) for group in schedule for i in group[rank]}
        assert [run["cp"] for run in res["ran"]] == [
            cp[i] for i in expected
        ]  # local_cp_size: the ranks listing the sample
        assert res["barriers"] == 1 + len(schedule) - 1  # one before the loop, one between consecutive barrier groups
        assert res["received"] == sorted(set(expected))


def test_plans_through_the_service_and_ahead(tmp_path) -> None:
    from api.local_server import LocalServer

    server = LocalServer(tmp_path / "service")
    try:
        scheduler = PlannedCPScheduler(1000, Group(16), profile=PROFILE, gpus_per_node=8, budget_ms=300, url=server.url)
        now, ahead = _batch(40, 5), _batch(40, 6)
        scheduler.plan_ahead(ahead)  # submitted to the service; planned while "now" trains
        schedule = scheduler.get_groups_and_subsamples(now, None)
        assert scheduler.last["source"] == "now" and scheduler.last["plan"]["id"]
        assert {i for k in schedule[1] for r in k for i in r} == {i for i, _ in now}
        later = scheduler.get_groups_and_subsamples(ahead, None)
        assert scheduler.last["source"] == "ahead"
        index = {i: k for k, (i, _) in enumerate(ahead)}
        report = check_assignment(scheduler.problem(ahead), assignment_of(later[1], index))
        assert report.ok, report.violations[:3]
        scheduler.close()
    finally:
        server.stop()


def test_busy_last_grows_groups_when_no_sample_can_move() -> None:
    scheduler = PlannedCPScheduler(1000, Group(8), profile=PROFILE, gpus_per_node=8)
    problem = scheduler.problem([(0, 1500), (1, 900), (2, 700)])
    # One sample per group and ranks 4-7 idle: the smallest groups double until all 8 ranks work.
    fixed = busy_last(problem, Assignment.of([[((0, 1), (0,)), ((2,), (1,)), ((3,), (2,))]]))
    (last,) = fixed.micro_batches
    assert sorted(r for ranks, _ in last for r in ranks) == list(range(8))
    assert sorted(len(ranks) for ranks, _ in last) == [2, 2, 4]
    report = check_assignment(problem, fixed)
    assert report.ok, report.violations


def test_tensor_parallel_puts_fewer_domain_ranks_on_a_node() -> None:
    # 8 DP x CP ranks with TP 2 on nodes of 8 GPUs: 4 domain ranks per node (Megatron's order, tensor innermost).
    scheduler = PlannedCPScheduler(1000, Group(8), profile=PROFILE, gpus_per_node=8, tensor_parallel=2)
    cluster = scheduler.problem([(0, 100)]).cluster
    assert cluster.domain_size == 8 and cluster.node_rank_ranges == ((0, 4), (4, 8))
    groups, _ = scheduler.get_groups_and_subsamples(_batch(24, 1), None)
    plan = scheduler.last["plan"]
    for mb in plan["micro_batches"]:
        for g in mb["groups"]:
            assert g["intra_node"] == (len({r // 4 for r in g["ranks"]}) == 1)
