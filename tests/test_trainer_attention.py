"""Context-parallel attention at low precision, with grouped-query heads, when a rank fails, and the
hybrid scheme (Ulysses inside, ring across) from the kernel to apply_plan and the training step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from optimizer.errors import ProblemError  # noqa: E402
from optimizer.plan.sharding import token_ranges  # noqa: E402
from trainer._testing import attention_worker_many, failing_ring_worker  # noqa: E402
from trainer.apply import apply_plan, hybrid_sub_groups  # noqa: E402
from trainer.attention_check import error_table, hybrid_pairs  # noqa: E402
from trainer.attention_tiles import mask_value  # noqa: E402
from trainer.launch import spawn  # noqa: E402
from trainer.ring_attention import (  # noqa: E402
    HybridSpec,
    RingSpec,
    full_attention,
    hybrid_attention,
    ring_attention,
    shard_layout,
)


def test_mask_value_fits_every_dtype():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert torch.tensor(mask_value(dtype), dtype=dtype).isfinite()


def _one_rank(dtype, heads=6, kv_heads=2):
    layout = shard_layout([19, 6], 1)
    spec = RingSpec(None, (0,), 0, tuple(layout))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(25, heads, 8, generator=g).to(dtype).requires_grad_(True)
    k, v = (torch.randn(25, kv_heads, 8, generator=g).to(dtype).requires_grad_(True) for _ in range(2))
    return q, k, v, spec, layout


def test_gqa_on_one_rank_equals_repeated_heads_in_float64():
    q, k, v, spec, layout = _one_rank(torch.float64)
    out = ring_attention(q, k, v, spec)
    out.sum().backward()
    qr, kr, vr = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    ref = full_attention(qr, kr.repeat_interleave(3, dim=1), vr.repeat_interleave(3, dim=1), *layout[0])
    ref.sum().backward()
    assert (out - ref).abs().max() < 1e-13
    for ours, theirs in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        assert (ours - theirs).abs().max() < 1e-13


def test_float16_runs_without_overflow_and_keeps_its_dtype():
    q, k, v, spec, _ = _one_rank(torch.float16)
    out = ring_attention(q, k, v, spec)
    out.float().square().sum().backward()
    assert out.dtype == torch.float16 and out.isfinite().all()
    assert all(x.grad is not None and x.grad.dtype == torch.float16 and x.grad.isfinite().all() for x in (q, k, v))


def test_bad_head_counts_are_refused():
    q, k, v, spec, _ = _one_rank(torch.float32, heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="multiple of the 4 key/value heads"):
        ring_attention(q, k, v, spec)


def test_low_precision_error_is_at_sdpa_level_on_three_ranks():
    # Errors against float64 on the same rounded inputs, at SDPA's level because the accumulators are float32
    # (in the input dtype they would be 13-17x SDPA's in bfloat16).
    # Ring (GQA 6/2) and Ulysses (2 kv heads do not divide 3: repeated).
    rows = error_table(
        [3], ["bfloat16", "float16"], ["ring", "ulysses"], lengths=[41, 16, 3], heads=6, kv_heads=2, dim=8
    )
    assert len(rows) == 4
    for r in rows:
        assert max(r["ours"]) <= 1.5 * max(r["sdpa"]), r
        assert max(r["ours"]) > 0  # rounding happened: the check can see a difference


def test_a_failing_rank_does_not_hang_its_peers():
    timeout = 3.0
    seen = spawn(failing_ring_worker, 2, 1, timeout, 2.0)
    assert (
        seen[1]["error"] == "RingError" and "injected failure" in seen[1]["message"] and "rank 1" in seen[1]["message"]
    )
    for r in (0,):
        assert seen[r]["error"] == "RingError", seen[r]
        assert seen[r]["seconds"] < timeout + 10, seen[r]


@pytest.mark.parametrize("lengths, d, tile", [([20] * 16, 4, 128), ([23, 4, 1, 9], 3, 4), ([300, 7, 7, 40], 2, 16)])
def test_tiles_cover_every_visible_pair_exactly_once(lengths, d, tile):
    from trainer.attention_tiles import tiles
    from trainer.ring_attention import visible

    layout = shard_layout(lengths, d)
    total = 0
    for p in range(d):
        qp, qs = layout[p]
        for src in range(d):
            kp, ks = layout[src]
            want = visible(qp, qs, kp, ks)
            got = torch.zeros_like(want, dtype=torch.int64)
            parts = tiles(qp, qs, kp, ks, tile)
            for rows, cols, m in parts:
                assert len(set(cols.tolist())) == len(cols) and len(set(rows.tolist())) == len(rows)
                assert torch.equal(m, want[rows][:, cols])
                got[rows[:, None], cols[None, :]] += m.long()
            assert torch.equal(got, want.long())
            total += len(parts)
    if lengths == [20] * 16:
        assert total <= 2 * d * d  # short samples merged: not one tile per sample and chunk


def test_device_check_runs_on_cpu(tmp_path):
    import json

    from trainer.gpu_check import main

    out = tmp_path / "check.json"
    rc = main(
        [
            "--device",
            "cpu",
            "--lengths",
            "16,48",
            "--degrees",
            "1,2",
            "--mixes",
            "1,3",
            "--hidden",
            "32",
            "--heads",
            "4",
            "--ffn-hidden",
            "64",
            "--exact-tokens",
            "96",
            "--held-out",
            "3",
            "--repeats",
            "1",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["exactness"]) == {"float32", "bfloat16", "float16"}
    for name in ("bfloat16", "float16"):
        ours, sdpa = doc["exactness"][name]["ring_d1"], doc["exactness"][name]["sdpa"]
        assert len(ours) == len(sdpa) == 4 and max(ours) <= 1.5 * max(sdpa)
    assert max(doc["exactness"]["float32"]["ring_d1"]) < 1e-4
    assert [(k["lengths"], k["length"], k["degree"]) for k in doc["kernel_times"]] == [(2, 48, 1), (8, 16, 2)]
    assert all(k["matmul_s"] > 0 for k in doc["kernel_times"])
    assert len(doc["cost_model"]["held_out"]) == 3 and doc["cost_model"]["mean_abs_error"] >= 0


# -- hybrid: Ulysses inside, ring across --------------------------------------------------------

HYBRID_LENGTHS = [23, 4, 1, 9]
"""Samples shorter than 2d leave whole pieces of padding; several samples share one pass."""


def _hybrid_errors(d, calls):
    per_rank = spawn(attention_worker_many, d, calls)
    return [[max(per_rank[r][i]["ours"][j] for r in range(d)) for j in range(4)] for i in range(len(calls))]


def test_hybrid_on_four_ranks_matches_float64_attention():
    base = {"lengths": HYBRID_LENGTHS, "scheme": "hybrid", "dim": 4}
    calls = [
        # GQA where u = 2 does not divide the 3 key/value heads (repeated), in several tiles per block.
        {**base, "heads": 6, "kv_heads": 3, "ulysses": 2, "tile": 4},
        # u = 2 splitting 2 key/value heads; the group's ranks out of order, so the Ulysses sub-groups'
        # process-group numbering differs from their positions.
        {**base, "heads": 4, "kv_heads": 2, "ulysses": 2, "order": [3, 1, 0, 2]},
        {**base, "heads": 4, "kv_heads": 2, "ulysses": 4, "order": [2, 0, 3, 1]},  # u = d: Ulysses
        {**base, "heads": 4, "kv_heads": 2, "ulysses": 1},  # u = 1: ring
        {**base, "heads": 4, "kv_heads": 2, "ulysses": 2, "dtype": "bfloat16", "sdpa": True},
    ]
    per_rank = spawn(attention_worker_many, 4, calls)
    for i, call in enumerate(calls[:4]):
        for r in range(4):
            assert max(per_rank[r][i]["ours"]) < 1e-12, (call, r, per_rank[r][i])
    low = [max(per_rank[r][4]["ours"][j] for r in range(4)) for j in range(4)]
    sdpa = per_rank[0][4]["sdpa"]
    assert 0 < max(low) <= 1.5 * max(sdpa), (low, sdpa)


def test_hybrid_on_six_ranks_matches_float64_attention():
    # Rings of 3 over two Ulysses widths' worth of heads; GQA split (4/2) and repeated (6/3).
    base = {"lengths": HYBRID_LENGTHS, "scheme": "hybrid", "dim": 4, "ulysses": 2}
    errors = _hybrid_errors(6, [{**base, "heads": 4, "kv_heads": 2}, {**base, "heads": 6, "kv_heads": 3, "tile": 4}])
    for e in errors:
        assert max(e) < 1e-12, errors


def test_hybrid_layout_and_ring_blocks():
    # u = 1 is the ring split; with u = d one ring position holds the whole sequence.
    for (pr, sr), (ph, sh) in zip(shard_layout([23, 4], 4), shard_layout([23, 4], 4, "hybrid", 1), strict=True):
        assert torch.equal(pr, ph) and torch.equal(sr, sh)
    layout = tuple(shard_layout([23, 4, 1, 9], 6, "hybrid", 2))
    seen = sorted((int(s), int(p)) for pos, seg in layout for p, s in zip(pos, seg, strict=True))
    assert seen == sorted((s, p) for s, n in enumerate([24, 12, 12, 12]) for p in range(n))  # each padded token once
    spec = HybridSpec((10, 11, 12, 13, 14, 15), 3, 2, layout, None, None)
    assert (spec.ring_index, spec.ulysses_index) == (1, 1)
    assert spec.ulysses_ranks == (12, 13) and spec.ring_ranks == (11, 13, 15)
    ring = spec.ring()
    assert ring.ranks == (11, 13, 15) and ring.position == 1 and ring is spec.ring()
    for i in range(3):
        assert torch.equal(ring.layout[i][0], torch.cat([layout[2 * i][0], layout[2 * i + 1][0]]))
    # Ring position 0's block holds zig-zag chunks 0 and 5 of a ring of 3 (6 chunks of 4 tokens), whole.
    assert sorted(ring.layout[0][0][ring.layout[0][1] == 0].tolist()) == list(range(4)) + list(range(20, 24))
    with pytest.raises(ValueError, match="must divide the group size"):
        HybridSpec((0, 1, 2), 0, 2, tuple(shard_layout([5], 3)), None, None)
    wide = tuple(shard_layout([5], 8, "hybrid", 4))
    q, k = torch.zeros(int(wide[3][0].numel()), 6, 4), torch.zeros(int(wide[3][0].numel()), 2, 4)
    with pytest.raises(ValueError, match="Ulysses width 4 to divide the 6 query heads"):
        hybrid_attention(q, k, k, HybridSpec(tuple(range(8)), 3, 4, wide, None, None))


def test_hybrid_check_skips_what_cannot_run():
    pairs, skipped = hybrid_pairs([4, 6, 8], [2, 4], 8)
    assert pairs == [(4, 2), (4, 4), (6, 2), (8, 2), (8, 4)]
    assert skipped == ["d 6 with u 4: u does not divide d"]
    assert hybrid_pairs([4], [4], 6)[1] == ["d 4 with u 4: u does not divide the 6 query heads"]


HYBRID_PLAN = {
    "scheme": "hybrid",
    "domain_size": 4,
    "micro_batches": [
        {"groups": [{"ranks": [0, 1, 2, 3], "ulysses_size": 2, "samples": ["a", "b"], "lengths": [21, 5]}]},
        {
            "groups": [
                {"ranks": [1, 0], "ulysses_size": 2, "samples": ["c"], "lengths": [9]},
                {"ranks": [2, 3], "ulysses_size": 1, "samples": ["d"], "lengths": [6]},
            ]
        },
        {
            "groups": [
                {"ranks": [3, 2, 1], "ulysses_size": 1, "samples": ["e"], "lengths": [13]},
                {"ranks": [0], "ulysses_size": 1, "samples": ["f"], "lengths": [4]},
            ]
        },
    ],
}


def test_apply_plan_reads_a_hybrid_plan():
    works = [apply_plan(HYBRID_PLAN, r) for r in range(4)]
    assert works[0].scheme == "hybrid"
    assert works[0].communicators == ((0, 1, 2, 3), (1, 0), (2, 3), (3, 2, 1))
    # Every hybrid group's Ulysses sub-groups and rings, each once, the same list on every rank.
    assert works[0].sub_groups == ((0, 1), (2, 3), (0, 2), (1, 3), (3, 2, 1))
    assert all(w.sub_groups == works[0].sub_groups for w in works)
    mb = works[3].micro_batches[0]
    assert mb.ulysses_size == 2 and mb.ulysses_ranks == (2, 3) and mb.ring_ranks == (1, 3)
    assert works[0].micro_batches[1].ulysses_ranks == (1, 0) and works[0].micro_batches[1].ring_ranks == (0,)
    assert works[2].micro_batches[1].ring_ranks == (2, 3) and works[2].micro_batches[1].ulysses_ranks == (2,)
    for m, doc in enumerate(HYBRID_PLAN["micro_batches"]):
        for g in doc["groups"]:
            d, u = len(g["ranks"]), g["ulysses_size"]
            for sid, length in zip(g["samples"], g["lengths"], strict=True):
                covered = []
                for pos, r in enumerate(g["ranks"]):
                    sh = next(s for s in works[r].micro_batches[m].shards if s.sample == sid)
                    assert sh.ranges == tuple(tuple(x) for x in token_ranges(length, d, "hybrid", u)[pos])
                    assert sh.padded_length == (-(-length // (2 * d)) * 2 * d if d > 1 else length)
                    covered += [t for a, b in sh.ranges for t in range(a, b)]
                assert sorted(covered) == list(range(length))
    # The shards' padded ranges are the attention layout of the rank's position.
    pos, _ = shard_layout([21, 5], 4, "hybrid", 2)[3]
    held = [t for sh in works[3].micro_batches[0].shards for a, b in sh.padded_ranges for t in range(a, b)]
    assert pos.tolist() == held


def test_apply_plan_maps_hybrid_sub_groups_under_tp():
    work = apply_plan(HYBRID_PLAN, 5, tensor_parallel=2)  # planner rank 2, tensor rank 1
    assert work.micro_batches[0].group == (1, 3, 5, 7)
    assert work.micro_batches[0].ulysses_ranks == (5, 7) and work.micro_batches[0].ring_ranks == (1, 5)
    assert len(work.sub_groups) == 10 and (0, 2) in work.sub_groups and (5, 7) in work.sub_groups
    assert work.sub_groups == apply_plan(HYBRID_PLAN, 0, tensor_parallel=2).sub_groups


def _with_group(**changes):
    group = {"ranks": [0, 1, 2, 3], "samples": ["a"], "lengths": [8]}
    doc = {"scheme": "hybrid", "micro_batches": [{"groups": [group]}]}
    doc["micro_batches"][0]["groups"][0].update(changes)
    return doc


@pytest.mark.parametrize(
    "changes, message",
    [({}, "has no 'ulysses_size'"), ({"ulysses_size": 3}, "3 does not divide"), ({"ulysses_size": 0}, "positive")],
)
def test_apply_plan_rejects_a_bad_ulysses_size(changes, message):
    with pytest.raises(ProblemError, match=message) as exc:
        apply_plan(_with_group(**changes), 0)
    assert exc.value.field == "plan.micro_batches[0].groups[0].ulysses_size"
    assert exc.value.hint
    # The same group is fine with a divisor, and a ring plan ignores the field.
    apply_plan(_with_group(ulysses_size=2), 0)
    apply_plan({**_with_group(**changes), "scheme": "ring"}, 0)


def test_hybrid_sub_groups():
    assert hybrid_sub_groups((5, 4, 3, 2, 1, 0), 3) == [(5, 4, 3), (2, 1, 0), (5, 2), (4, 1), (3, 0)]
    assert hybrid_sub_groups((0, 1), 2) == [(0, 1)] and hybrid_sub_groups((0, 1), 1) == [(0, 1)]


def test_hybrid_plan_step_equals_single_process():
    # Micro-batches with u = 2 inside a ring of 2, u = d, u = 1 and groups given out of rank order.
    import random

    from trainer.step_equivalence import reference, step_worker
    from trainer.tiny_model import TinyConfig

    cfg = TinyConfig()
    rng = random.Random(3)
    lengths = {"a": 21, "b": 5, "c": 9, "d": 6, "e": 13, "f": 4}
    samples = {k: [rng.randrange(cfg.vocab) for _ in range(n)] for k, n in lengths.items()}
    results = spawn(step_worker, 4, HYBRID_PLAN, cfg, samples)
    ref_loss, ref_grad = reference(cfg, samples)
    for r, res in enumerate(results):
        assert res["loss"] == pytest.approx(ref_loss, rel=1e-10), f"rank {r}"
        err = float((res["grad"] - ref_grad).abs().max())
        assert err <= 1e-10 * max(1.0, float(ref_grad.abs().max())), f"rank {r}: gradient differs by {err}"
