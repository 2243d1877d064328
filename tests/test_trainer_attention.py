"""Context-parallel attention at low precision, with grouped-query heads, and when a rank fails."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainer._testing import failing_ring_worker  # noqa: E402
from trainer.attention_check import error_table  # noqa: E402
from trainer.attention_tiles import mask_value  # noqa: E402
from trainer.launch import spawn  # noqa: E402
from trainer.ring_attention import RingSpec, full_attention, ring_attention, shard_layout  # noqa: E402


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
