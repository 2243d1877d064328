"""Cost formulas against numbers computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.costs.analytical import activation_bytes_per_token, analytical_profile, model_state_bytes_per_rank
from optimizer.costs.profile import Bandwidth
from optimizer.costs.tables import CostTables, sample_time
from optimizer.presets import load_preset
from optimizer.problem.documents import cluster_from_json, model_from_json, problem_from_json, profile_from_json

PROFILE = {
    "time": {"quadratic": 1e-9, "linear": 1e-5, "sample_constant": 1e-3, "group_constant": 2e-3},
    "comm": {
        "scheme": "ring",
        "bytes_per_token": 1000.0,
        "bandwidth_bytes_per_s": {"intra": 1e9, "inter": {"2": 5e8, "4": 2.5e8}},
    },
    "capacity_tokens_per_rank": 4096,
}


def test_profile_formula_by_hand():
    p = profile_from_json(PROFILE)
    L = 1000
    # d = 1: compute only, no communication.
    assert sample_time(p, L, 0.0, 1, True) == pytest.approx(1e-9 * 1e6 + 1e-5 * 1e3 + 1e-3)
    # d = 4 intra: (a2 L^2 + a1 L)/4 + a0 + k L (3/4) / bw
    expected = (1e-3 + 1e-2) / 4 + 1e-3 + 1000.0 * 1000 * 0.75 / 1e9
    assert sample_time(p, L, 0.0, 4, True) == pytest.approx(expected)
    # inter bandwidth table: d = 3 reads the smallest listed size >= 3, i.e. "4".
    expected = (1e-3 + 1e-2) / 3 + 1e-3 + 1000.0 * 1000 * (2 / 3) / 2.5e8
    assert sample_time(p, L, 0.0, 3, False) == pytest.approx(expected)


def test_bandwidth_table_lookup():
    bw = Bandwidth.from_json({"2": 1.2e11, "4": 1.1e11, "8": 1.0e11}, "x")
    assert bw.at(1) == 1.2e11 and bw.at(2) == 1.2e11 and bw.at(3) == 1.1e11
    assert bw.at(8) == 1.0e11 and bw.at(64) == 1.0e11  # above them all: the largest listed size


def test_ulysses_and_overlap():
    doc = dict(
        PROFILE,
        comm={"scheme": "ulysses", "bytes_per_token": 1000.0, "bandwidth_bytes_per_s": {"intra": 1e9, "inter": 1e9}},
    )
    p = profile_from_json(doc)
    L, d = 2000, 4
    compute = (1e-9 * L * L + 1e-5 * L) / d + 1e-3
    assert sample_time(p, L, 0.0, d, True) == pytest.approx(compute + 1000.0 * L / d / 1e9)
    ring = profile_from_json(dict(PROFILE, comm={**PROFILE["comm"], "overlap_with_attention": True}))
    exposed = max(0.0, 1000.0 * L * 0.75 / 1e9 - 1e-9 * L * L / d)
    assert sample_time(ring, L, 0.0, d, True) == pytest.approx(compute + exposed)


def test_tables_match_scalar_formula():
    problem = problem_from_json(
        {
            "batch": {"samples": [{"id": f"s{i}", "text_tokens": t} for i, t in enumerate([100, 5000, 30000])]},
            "cluster": {"nodes": 2, "gpus_per_node": 4},
            "profile": PROFILE,
        }
    )
    tables = CostTables.build(problem)
    for intra in (True, False):
        m = tables.time_matrix(intra)
        for i, L in enumerate(tables.lengths):
            for j, d in enumerate(tables.degrees):
                # A size wider than a node (4 ranks) cannot be placed within one: it has its spanning times.
                placed = intra and d <= 4
                assert m[i, j] == sample_time(problem.cost_profile, int(L), 0.0, int(d), placed)
    assert 8 in tables.degrees.tolist()
    # Group time: b + sum of the samples' times.
    g = tables.group_time([0, 2], (0, 1))
    assert g == pytest.approx(
        2e-3 + sample_time(problem.cost_profile, 100, 0, 2, True) + sample_time(problem.cost_profile, 30000, 0, 2, True)
    )


def test_analytical_profile_by_hand():
    model = model_from_json(load_preset("models", "llama3-8b", "m"))
    cluster = cluster_from_json({"nodes": 1, "gpus_per_node": 8})
    p = analytical_profile(model, cluster, "ring")
    rate = 989e12 * 0.5
    h, kv, f, V, layers = 4096, 1024, 14336, 128256, 32
    linear = 3 * (layers * 2 * (2 * h * h + 2 * h * kv + 3 * h * f) + 2 * h * V)
    assert p.linear == pytest.approx(linear / rate)
    assert p.quadratic == pytest.approx(3 * layers * 2 * h / rate)
    assert p.bytes_per_token == pytest.approx(3 * layers * 2 * kv * 2)
    states = 8.03e9 * (2 + 4 + 12 / 8)  # ZeRO-1 over the 8-rank domain
    assert model_state_bytes_per_rank(model, cluster) == pytest.approx(states)
    act = layers * 34 * h + 4 * V
    assert activation_bytes_per_token(model, cluster) == pytest.approx(act)
    assert p.capacity_tokens_per_rank == math.floor((80e9 - 4e9 - states) / act)
    assert p.overlap_with_attention and p.scheme == "ring"


def test_vision_tokens_from_pixels_and_frames():
    problem = problem_from_json(
        {
            "batch": {
                "samples": [
                    {"id": "img", "text_tokens": 10, "images": [{"width": 448, "height": 448}]},
                    {"id": "vid", "text_tokens": 5, "videos": [{"frames": 8, "tokens_per_frame": 196}]},
                ]
            },
            "model_preset": "qwen2-vl-7b",
            "cluster_preset": "h100-1x8",
        }
    )
    a, b = problem.batch.samples
    assert a.length == 10 + (448 // 28) ** 2  # Qwen2-VL: one token per 28x28 pixels
    assert b.length == 5 + 8 * 196
    tables = CostTables.build(problem)
    assert np.all(tables.vision > 0)  # the encoder's work is charged


# -- the compiled tables against straightforward numpy ---------------------------------------


def _numpy_matrix(tables: CostTables, intra: bool, speed: float) -> np.ndarray:
    """The cost formula over whole arrays, as broadcast numpy expressions (the reference); a size wider
    than a node is charged across nodes in both matrices."""
    p = tables.profile
    L = tables.lengths.astype(np.float64)[:, None]
    d = tables.degrees.astype(np.float64)[None, :]
    attention = p.quadratic * L * L / d / speed
    compute = (p.quadratic * L * L + p.linear * L + tables.vision[:, None]) / d / speed + p.sample_constant / speed
    compute = np.where(d == 1, compute, compute + p.sample_step * (d - 1) / speed)
    placed = [intra and int(x) <= tables.node_size for x in tables.degrees]
    bw = np.array([p.bandwidth(int(x), k) for x, k in zip(tables.degrees, placed, strict=True)], dtype=np.float64)[
        None, :
    ]
    latency = np.array([p.latency(k) for k in placed])[None, :]
    share = (d - 1) / d if p.scheme == "ring" else 1.0 / d
    unit = (2 if p.scheme == "ring" else 1) * tables.degrees[None, :]
    sent = (-(-tables.lengths[:, None] // unit) * unit).astype(np.float64) if p.padded_bytes else L
    comm = p.bytes_per_token * sent * share / bw + (p.messages_per_step * (d - 1) + p.messages_fixed) * latency
    if p.overlap_with_attention:
        comm = np.maximum(0.0, comm - attention)
    comm = np.where(d == 1, 0.0, comm)
    return compute + comm


def _table_cases():
    from optimizer.problem.workloads import WORKLOADS

    overlap_off = dict(
        PROFILE, comm={**PROFILE["comm"], "latency_s": {"intra": 3e-6, "inter": 2e-5}, "messages_per_step": 7}
    )
    overlap_on = dict(
        PROFILE,
        comm={**PROFILE["comm"], "overlap_with_attention": True},
        time={**PROFILE["time"], "vision_linear": 1e-6, "vision_quadratic": 1e-10},
        speed_by_gpu={"A100-80GB": 0.4},
    )
    ulysses = dict(
        PROFILE,
        comm={"scheme": "ulysses", "bytes_per_token": 700.0, "bandwidth_bytes_per_s": {"intra": 3e9, "inter": 4e8}},
    )
    yield {"batch": WORKLOADS["video"](48, seed=1), "cluster_preset": "h100-8x8", "model_preset": "qwen2-vl-7b"}
    yield {"batch": WORKLOADS["mixed"](60, seed=2), "cluster_preset": "mixed-h100-a100", "model_preset": "qwen2-vl-7b"}
    yield {
        "batch": WORKLOADS["image-sft"](40, seed=3),
        "cluster_preset": "ascend910b-8x8",
        "model_preset": "internvl2-8b",
        "options": {"cp_scheme": "ulysses", "degree_policy": "any"},
    }
    trainer = dict(
        PROFILE,
        time={**PROFILE["time"], "sample_step": 3e-4, "step_constant": 0.02},
        comm={
            **PROFILE["comm"],
            "latency_s": {"intra": 3e-6, "inter": 2e-5},
            "group_messages": {"per_step": 6, "fixed": 2},
            "padded_bytes": True,
        },
    )
    trainer_ulysses = dict(
        trainer,
        comm={
            **ulysses["comm"],
            "padded_bytes": True,
            "messages_per_step": 2,
            "messages_fixed": 3,
            "latency_s": {"intra": 1e-6, "inter": 1e-5},
        },
        speed_by_gpu={"A100-80GB": 0.4},
    )
    for profile in (overlap_off, overlap_on, ulysses, trainer, trainer_ulysses):
        yield {"batch": WORKLOADS["dynamic-res"](30, seed=4), "cluster_preset": "mixed-h100-a100", "profile": profile}


@pytest.mark.parametrize("case", range(8))
def test_compiled_matrices_equal_numpy_to_the_bit(case):
    doc = list(_table_cases())[case]
    tables = CostTables.build(problem_from_json(doc))
    speeds = sorted({1.0, *tables.rank_speed.tolist()})
    for intra in (True, False):
        for speed in speeds:
            m = tables.time_matrix(intra, speed)
            assert np.array_equal(m, _numpy_matrix(tables, intra, speed))
            for i in range(0, tables.n_samples, 7):  # the scalar formula, to the last bit
                assert m[i].tolist() == [
                    sample_time(
                        tables.profile,
                        int(tables.lengths[i]),
                        float(tables.vision[i]),
                        int(d),
                        intra and d <= tables.node_size,
                        speed,
                    )
                    for d in tables.degrees
                ]
    fast = float(tables.rank_speed.max())
    fits = (tables.degrees <= tables.node_size)[None, :]
    expected = np.where(
        fits,
        np.minimum(_numpy_matrix(tables, True, fast), _numpy_matrix(tables, False, fast)),
        _numpy_matrix(tables, False, fast),
    )
    some = [len(tables.degrees) - 1, 0, len(tables.degrees) // 2]
    rows = np.array([tables.n_samples - 1, 0, tables.n_samples // 2])
    assert np.array_equal(tables.best_time_columns(some), expected[:, some].T)  # before the table exists
    assert np.array_equal(tables.best_time_rows(rows), expected[rows])
    assert "best_time" not in tables.__dict__
    assert np.array_equal(tables.best_time, expected)
    assert np.array_equal(tables.best_time_columns(some), expected[:, some].T)
    assert np.array_equal(tables.best_time_rows(rows), expected[rows])
    from optimizer.costs.tables import vision_work

    assert np.array_equal(tables.vision, [vision_work(tables.profile, s) for s in tables.problem.batch.samples])
    assert tables.rank_speed.tolist() == [
        tables.profile.speed_for(tables.problem.cluster.rank_gpu(r).name) for r in range(tables.n_ranks)
    ]


def test_unique_rows_gives_what_numpy_unique_gives():
    from optimizer.costs.group_classes import unique_rows

    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 500):
        rows = np.stack([rng.integers(0, 4, n), rng.integers(0, 2, n), rng.choice([0.4, 1.0], n)], axis=1).astype(float)
        uniq, first, inverse = unique_rows(rows)
        want = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        assert np.array_equal(uniq, want[0])
        assert np.array_equal(first, want[1])
        assert np.array_equal(inverse, want[2].reshape(-1))
