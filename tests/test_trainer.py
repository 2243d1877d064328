"""Trainer pieces: group pool, apply_plan, ring and Ulysses attention against full attention."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from optimizer.errors import ProblemError  # noqa: E402
from optimizer.plan.sharding import token_ranges  # noqa: E402
from trainer._testing import attention_worker, pool_worker  # noqa: E402
from trainer.apply import apply_plan  # noqa: E402
from trainer.group_pool import _partitions, aligned_blocks, canonical  # noqa: E402
from trainer.launch import spawn  # noqa: E402
from trainer.ring_attention import shard_layout  # noqa: E402


def test_aligned_blocks_and_canonical_keys():
    assert aligned_blocks(6, [1, 2, 3, 4]) == [(0, 1), (2, 3), (4, 5), (0, 1, 2), (3, 4, 5), (0, 1, 2, 3)]
    assert canonical([3, 1, 2]) == (1, 2, 3)
    with pytest.raises(ValueError):
        canonical([1, 1])


def test_partitions_are_disjoint_and_keep_every_group():
    keys = [(0, 1), (1, 2), (2, 3), (4, 5), (0, 5)]
    parts = _partitions(keys)
    assert sorted(k for p in parts for k in p) == sorted(keys)
    for p in parts:
        ranks = [r for k in p for r in k]
        assert len(ranks) == len(set(ranks))


PLAN = {
    "scheme": "ring",
    "domain_size": 4,
    "predicted_step_time_s": 1.0,
    "micro_batches": [
        {
            "groups": [
                {"ranks": [0, 1, 2], "samples": ["a", "b"], "lengths": [10, 3], "predicted_time_s": 0.5},
                {"ranks": [3], "samples": ["c"], "lengths": [7]},
            ]
        },
        {"groups": [{"ranks": [2, 3], "samples": ["d"], "lengths": [5]}]},
    ],
}


def test_apply_plan_covers_every_token_once():
    works = [apply_plan(PLAN, r) for r in range(4)]
    assert works[0].communicators == ((0, 1, 2), (2, 3))
    assert works[0].micro_batches[1].group is None and works[0].micro_batches[1].position == -1
    assert works[3].micro_batches[0].group == (3,)
    for m, mb in enumerate(PLAN["micro_batches"]):
        for g in mb["groups"]:
            for sid, length in zip(g["samples"], g["lengths"], strict=True):
                covered = []
                for r in g["ranks"]:
                    w = works[r].micro_batches[m]
                    assert w.position == g["ranks"].index(r)
                    sh = next(s for s in w.shards if s.sample == sid)
                    covered += [t for a, b in sh.ranges for t in range(a, b)]
                assert sorted(covered) == list(range(length))
    # Each position holds the same padded amount, matching the attention layout.
    for r in range(3):
        sh = works[r].micro_batches[0].shards[0]
        assert sum(b - a for a, b in sh.padded_ranges) == 12 // 3
        assert sh.ranges == tuple(tuple(x) for x in token_ranges(10, 3)[r])
    pos, _ = shard_layout([10, 3], 3)[1]
    assert pos.tolist() == [t for a, b in works[1].micro_batches[0].shards[0].padded_ranges for t in range(a, b)] + [
        t for a, b in works[1].micro_batches[0].shards[1].padded_ranges for t in range(a, b)
    ]


def test_apply_plan_reads_a_planner_plan(make_problem):
    from planning.planner import plan

    problem = make_problem(cluster_preset="h100-1x8", backend="heuristic")
    p = plan(problem)
    work = apply_plan(p, 0)
    assert len(work.micro_batches) == len(p.micro_batches)
    assert list(work.communicators) == p.communicators


@pytest.mark.parametrize(
    "bad, rank, field",
    [
        ({"micro_batches": 3}, 0, "plan"),
        ({"scheme": "tree", "micro_batches": []}, 0, "plan.scheme"),
        ({"domain_size": 2, "micro_batches": []}, 3, "rank"),
        ({"micro_batches": [{"groups": [{"ranks": [0], "samples": ["a"]}]}]}, 0, "plan.micro_batches[0].groups"),
        (
            {"micro_batches": [{"groups": [{"ranks": [0, 1], "samples": ["a"]}, {"ranks": [1], "samples": ["b"]}]}]},
            1,
            "plan.micro_batches[0]",
        ),
        (42, 0, "plan"),
    ],
)
def test_apply_plan_rejects_bad_plans_naming_the_field(bad, rank, field):
    with pytest.raises(ProblemError) as exc:
        apply_plan(bad, rank)
    assert exc.value.field == field


# Sizes 1, 2 and 3 of both schemes also run in the 6-process step test (test_trainer_e2e.py).
@pytest.mark.parametrize("d, scheme, tile", [(3, "ring", 4), (5, "ring", 128), (2, "ulysses", 128)])
def test_context_parallel_attention_matches_full_attention(d, scheme, tile):
    # Samples shorter than 2d leave whole chunks of padding; several samples share one pass; a
    # small tile makes each block run in several tiles.
    diffs = spawn(attention_worker, d, [23, 4, 1, 9], scheme, tile)
    for r, ds in enumerate(diffs):
        assert max(ds["ours"]) < 1e-12, f"position {r}: {ds}"


def test_group_pool_creates_once_and_reuses():
    res = spawn(pool_worker, 4)
    for r, x in enumerate(res):
        assert x["first"] == 3  # (0,1), (2,3), (0,1,2)
        assert x["again"] == 0 and x["on_demand"] == 1
        assert x["hits"] == 1 and x["unknown"] == "missing" and x["single"]
        assert x["known"] == [[0, 1], [2, 3], [0, 1, 2], [0, 3]]
        assert x["sum"] == (5.0 if r in (0, 3) else float(r + 1))


def test_ranks_follow_megatron_order_under_tp_and_pp():
    from trainer.ranks import RankLayout

    lay = RankLayout(4, tensor_parallel=2, pipeline_parallel=2)
    assert lay.world_size == 16
    seen = {lay.global_rank(r, t, s): (r, t, s) for s in range(2) for r in range(4) for t in range(2)}
    assert sorted(seen) == list(range(16))
    assert all(lay.coordinates(g) == c for g, c in seen.items())
    assert lay.global_rank(1, 0, 0) == 2 and lay.global_rank(0, 1, 0) == 1 and lay.global_rank(0, 0, 1) == 8
    assert lay.domain_ranks(1, 1) == (9, 11, 13, 15)
    with pytest.raises(ProblemError) as exc:
        lay.coordinates(16)
    assert exc.value.field == "rank"


def test_apply_plan_maps_planner_ranks_to_global_ranks():
    # TP 2 x PP 2 over the 4-rank plan: global rank 8 (stage 1, planner rank 0, tensor rank 0) gets planner
    # rank 0's share, its groups in global ranks.
    work = apply_plan(PLAN, 8, tensor_parallel=2, pipeline_parallel=2)
    assert work.rank == 8
    assert work.micro_batches[0].group == (8, 10, 12) and work.micro_batches[0].position == 0
    assert work.micro_batches[1].group is None
    plain = apply_plan(PLAN, 0)
    assert [s.padded_ranges for s in work.micro_batches[0].shards] == [
        s.padded_ranges for s in plain.micro_batches[0].shards
    ]
    # Every copy of every group, in one order on every rank: 2 planner groups x 4 (tensor rank, stage) copies.
    assert (
        len(work.communicators) == 8
        and work.communicators == apply_plan(PLAN, 15, tensor_parallel=2, pipeline_parallel=2).communicators
    )
    assert (9, 11, 13) in work.communicators and (12, 14) in work.communicators
    assert work.reduce_ranks == (8, 10, 12, 14) and len(work.reduce_groups) == 4
    w13 = apply_plan(PLAN, 13, tensor_parallel=2, pipeline_parallel=2)  # planner rank 2, tensor rank 1, stage 1
    assert w13.micro_batches[0].group == (9, 11, 13) and w13.micro_batches[0].position == 2
    assert w13.micro_batches[1].group == (13, 15) and w13.micro_batches[1].position == 0
    with pytest.raises(ProblemError) as exc:
        apply_plan(PLAN, 16, tensor_parallel=2, pipeline_parallel=2)
    assert exc.value.field == "rank"
