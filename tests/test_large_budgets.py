"""Budgets on large batches: the fixed work estimated from rates measured here, refused budgets, and
the optional phases that step aside, with their reason, when the deadline leaves them no room.

Nothing here depends on how fast the machine is: the planner's decisions are driven by rates fixed
with :func:`planning.fixed_work.fixed_rates` (or only compared with themselves), and the compiled
loops rewritten for speed are checked against plain versions of the rule they implement.
"""

from __future__ import annotations

import bisect
import re
import time

import numpy as np
import pytest

from optimizer.errors import ProblemError
from optimizer.heuristic import memory_first_kernels as mf
from optimizer.heuristic.static_kernels import balance_static
from optimizer.plan.summary import summary_text
from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import long_tail_video
from optimizer.verify.verifier import verify
from planning import fixed_work, planner
from planning.fixed_work import Rates, fixed_rates, minimum_budget_ms, problem_budget_ms
from planning.planner import plan

NO_WORK = Rates(base_ms=0.0, sample_ms=0.0, slot_ms=0.0, cell_ms=0.0, finish_ms=0.0, static_ms=0.0, tight_bound_ms=0.0)
"""Rates of a machine where nothing takes time: every optional phase has room, no budget is refused."""


def _problem(samples: int = 96, budget_ms: float = 200.0, **options):
    return problem_from_json(
        {
            "cluster": {"nodes": 2, "gpus_per_node": 8},
            "model_preset": "qwen2-vl-7b",
            "batch": long_tail_video(samples, seed=3),
            "options": {"backend": "heuristic", "time_budget_ms": budget_ms, **options},
        }
    )


def test_a_budget_below_the_fixed_work_is_refused_at_once_naming_the_field_and_the_budget_needed():
    slow = Rates(
        base_ms=500.0, sample_ms=0.0, slot_ms=0.0, cell_ms=0.0, finish_ms=0.0, static_ms=0.0, tight_bound_ms=0.0
    )
    problem = _problem(budget_ms=200.0)
    with fixed_rates(slow):
        assert problem_budget_ms(problem) == pytest.approx(fixed_work.LOW_SHARE * 500.0)  # above the 200 ms asked for
        with pytest.raises(ProblemError) as info:
            plan(problem)
    error = info.value
    assert error.field == "options.time_budget_ms"
    assert "the batch of 96 samples on 16 ranks needs about 500 ms here" in error.message
    asked = re.search(r"options\.time_budget_ms of at least (\d+)", error.hint or "")
    assert asked is not None and int(asked.group(1)) >= fixed_work.suggested_budget_ms(500.0) > 500


def test_a_budget_that_covers_the_fixed_work_is_not_refused():
    covered = Rates(
        base_ms=100.0, sample_ms=0.0, slot_ms=0.0, cell_ms=0.0, finish_ms=0.0, static_ms=0.0, tight_bound_ms=0.0
    )
    with fixed_rates(covered):
        problem = _problem(budget_ms=60_000.0)
        assert problem_budget_ms(problem) < 60_000.0
        result = plan(problem)
    assert verify(result, problem).ok


def test_a_budget_spent_before_planning_began_is_planned_late_not_refused():
    """The refusal judges the budget asked for: a request that waited (a queue, a caller's set-up) gets its plan."""
    from planning.deadline import Deadline

    covered = Rates(
        base_ms=100.0, sample_ms=0.0, slot_ms=0.0, cell_ms=0.0, finish_ms=0.0, static_ms=0.0, tight_bound_ms=0.0
    )
    problem = _problem(budget_ms=1000.0)
    with fixed_rates(covered):
        result = plan(problem, deadline=Deadline.after_ms(1000.0, start=time.perf_counter() - 5.0))  # long past due
    assert verify(result, problem).ok


def test_deterministic_plans_are_never_refused_nor_cut_for_time():
    # Their answer depends on the input alone: not on rates measured on this machine.
    hopeless = Rates(
        base_ms=1e9, sample_ms=1.0, slot_ms=1.0, cell_ms=1.0, finish_ms=1.0, static_ms=1e6, tight_bound_ms=1e6
    )
    with fixed_rates(NO_WORK):
        free = plan(_problem(deterministic=True))
    with fixed_rates(hopeless):
        result = plan(_problem(deterministic=True))
    assert result.static_baseline is not None and "skipped" not in result.solver.details
    assert result.to_json(shards=False)["micro_batches"] == free.to_json(shards=False)["micro_batches"]


def test_the_static_baseline_steps_aside_with_its_reason_when_the_deadline_leaves_no_room():
    no_room = Rates(
        base_ms=0.0, sample_ms=0.0, slot_ms=0.0, cell_ms=0.0, finish_ms=0.0, static_ms=1e6, tight_bound_ms=0.0
    )
    problem = _problem()
    with fixed_rates(no_room):
        result = plan(problem)
    assert result.static_baseline is None
    why = result.solver.details["skipped"]["static_baseline"]
    assert why.startswith("not computed: the deadline leaves") and "it needs about" in why
    doc = result.to_json(shards=False)
    assert "static_baseline" not in doc and doc["static_baseline_reason"] == why
    assert f"static layout: none ({why})" in summary_text(result, problem)
    assert verify(result, problem).ok


def test_with_room_the_static_baseline_is_computed():
    with fixed_rates(NO_WORK):
        result = plan(_problem())
    assert result.static_baseline is not None and "static_baseline" not in result.solver.details.get("skipped", {})


def test_a_static_baseline_not_asked_for_says_so():
    problem = _problem()
    with fixed_rates(NO_WORK):
        result = plan(problem, compare_static=False)
    assert result.static_baseline is None
    assert result.solver.details["skipped"]["static_baseline"] == "not asked for"
    assert "static layout: none (not asked for)" in summary_text(result, problem)


def test_the_tighter_bounds_step_aside_for_the_cheapest_valid_one_without_room(monkeypatch):
    costly = Rates(
        base_ms=0.0, sample_ms=0.0, slot_ms=0.0, cell_ms=0.0, finish_ms=0.0, static_ms=0.0, tight_bound_ms=1e6
    )
    problem = _problem()
    monkeypatch.setattr(
        planner, "size_bound_within", lambda *args: None
    )  # the group-size LP has its own budget rule (tests/test_size_bound.py)
    with fixed_rates(NO_WORK):
        full = plan(problem)
    with fixed_rates(costly):
        quick = plan(problem)
    assert quick.solver.details["bound"] == "single_sample"
    assert quick.solver.details["skipped"]["tighter_bounds"].startswith(
        "only the single-sample bound: the deadline leaves"
    )
    assert quick.lower_bound_s <= full.lower_bound_s <= full.predicted_step_time_s * (1 + 1e-12)
    assert "lower bound: only the single-sample bound" in summary_text(quick, problem)
    assert verify(quick, problem).ok


def test_the_estimate_grows_with_the_batch_and_the_domain():
    figures = [minimum_budget_ms(n, r) for n, r in ((1024, 64), (4096, 64), (16_384, 64), (65_536, 64), (65_536, 256))]
    assert all(a <= b for a, b in zip(figures, figures[1:], strict=False))
    assert minimum_budget_ms(4096, 64, micro_batches=40) >= minimum_budget_ms(4096, 64)
    assert minimum_budget_ms(4096, 64, sizes=64) >= minimum_budget_ms(4096, 64, sizes=7)
    rates = Rates(
        base_ms=1.0, sample_ms=0.002, slot_ms=0.004, cell_ms=1e-5, finish_ms=0.0, static_ms=0.0, tight_bound_ms=0.0
    )
    with fixed_rates(rates):
        small, large = minimum_budget_ms(16_384, 256, sizes=79), minimum_budget_ms(65_536, 256, sizes=79)
    # Linear in the samples: per sample its own rate and its cells (79 sizes, two placements).
    assert large - small == pytest.approx(fixed_work.LOW_SHARE * (0.002 + 1e-5 * 79 * 2) * (65_536 - 16_384))


def test_every_backend_needs_the_same_fixed_work():
    # An exact backend runs only in the time left after the heuristic's plan.
    with fixed_rates(
        Rates(
            base_ms=2.0, sample_ms=0.003, slot_ms=0.01, cell_ms=1e-5, finish_ms=0.0, static_ms=0.0, tight_bound_ms=0.0
        )
    ):
        assert (
            len({minimum_budget_ms(8192, 128, backend) for backend in ("heuristic", "auto", "cpsat", "highs", "cbc")})
            == 1
        )


def test_the_measured_rates_fit_the_calibration_batches():
    small, slotted, light = fixed_work.calibration_problems()
    assert len(slotted.batch) == len(light.batch) > len(small.batch)
    assert fixed_work.fewest_micro_batches(slotted) > fixed_work.fewest_micro_batches(light)
    rates = fixed_work.rates()
    assert all(getattr(rates, name) >= 0.0 for name in Rates.__dataclass_fields__)


def _plain_static_balance(order, lengths, times, group_class, limit, micro_batches, constant):
    """The static balancing's rule, plainly: each sample to the bin with memory room that would finish it first
    (load plus the class's constant plus the sample's time on the class), ties to the lower bin."""
    n_groups = len(group_class)
    load = [0.0] * (micro_batches * n_groups)
    tokens = [0.0] * len(load)
    out = [-1] * len(lengths)
    for i in order:
        fits = [
            (load[b] + constant[group_class[b % n_groups]] + times[group_class[b % n_groups], i], b)
            for b in range(len(load))
            if tokens[b] + lengths[i] <= limit[b % n_groups]
        ]
        if not fits:
            return None
        _, b = min(fits)
        out[i] = b
        tokens[b] += lengths[i]
        load[b] += times[group_class[b % n_groups], i]
    return out, load


@pytest.mark.parametrize("seed", range(40))
def test_the_static_balancing_places_as_the_plain_rule(seed):
    rng = np.random.default_rng(seed)
    n, n_groups, micro_batches, classes = (
        int(rng.integers(1, 120)),
        int(rng.integers(1, 6)),
        int(rng.integers(1, 8)),
        int(rng.integers(1, 3)),
    )
    lengths = rng.integers(1, 900, n).astype(np.int64)
    times = rng.random((classes, n))
    constant = rng.random(classes)
    group_class = rng.integers(0, classes, n_groups).astype(np.int64)
    limit = rng.integers(400, 2500, n_groups).astype(np.float64)
    order = (
        rng.permutation(n) if seed % 2 else np.argsort(-lengths, kind="stable")
    )  # any order, or longest first as the layouts use
    rest_min = np.minimum.accumulate(lengths[order][::-1].astype(np.float64))[::-1].copy()
    out_bin, load, mb_time = np.empty(n, dtype=np.int64), np.empty(micro_batches * n_groups), np.empty(micro_batches)
    ok = balance_static(
        order, lengths, times, group_class, limit, micro_batches, constant, out_bin, load, mb_time, rest_min
    )
    want = _plain_static_balance(
        order.tolist(), lengths.tolist(), times, group_class.tolist(), limit.tolist(), micro_batches, constant
    )
    assert ok == (want is not None)
    if want is not None:
        assert out_bin.tolist() == want[0]
        assert load.tolist() == want[1]


@pytest.mark.parametrize("seed", range(20))
def test_the_sorted_blocks_keep_the_order_of_one_sorted_list(seed):
    # The memory-first packing's groups by (room, group): blocks split when full and leave when empty.
    rng = np.random.default_rng(seed)
    n = 600
    rooms = np.empty((n // (mf.BLOCK // 2) + 2, mf.BLOCK))
    groups = np.empty(rooms.shape, dtype=np.int64)
    size = np.zeros(rooms.shape[0], dtype=np.int64)
    blocks = np.arange(rooms.shape[0])
    n_blocks, n_made = 1, 1
    plain: list[tuple[float, int]] = []
    for step in range(n):
        if plain and rng.random() < 0.4:  # take out the first entry not before (room, -1), as a best fit does
            room = float(rng.integers(0, 50))
            k = bisect.bisect_left(plain, (room, -1))
            if k == len(plain):
                continue
            place = mf._block_of(rooms, groups, size, blocks, n_blocks, room, -1)
            at = mf._index_in(rooms, groups, size, blocks, blocks[place], room, -1)
            assert (rooms[blocks[place], at], groups[blocks[place], at]) == plain.pop(k)
            n_blocks = mf._remove(rooms, groups, size, blocks, n_blocks, place, at)
        else:
            entry = (float(rng.integers(0, 50)), step)
            bisect.insort(plain, entry)
            n_blocks, n_made = mf._insert(rooms, groups, size, blocks, n_blocks, n_made, *entry)
        kept = [(rooms[b, q], groups[b, q]) for b in blocks[:n_blocks].tolist() for q in range(size[b])]
        assert kept == plain


def test_measured_rates_are_kept_for_later_processes_of_this_machine(tmp_path, monkeypatch):
    import os

    from planning import rates_cache

    monkeypatch.setenv("DHP_CACHE_DIR", str(tmp_path))
    assert rates_cache.load(Rates) is None
    measured = Rates(
        base_ms=1.0, sample_ms=0.01, slot_ms=0.002, cell_ms=1e-5, finish_ms=0.003, static_ms=0.004, tight_bound_ms=0.005
    )
    rates_cache.store(measured)
    assert rates_cache.load(Rates) == measured
    (path,) = tmp_path.glob("rates-*.json")
    old = time.time() - rates_cache.MAX_AGE_S - 1
    os.utime(path, (old, old))
    assert rates_cache.load(Rates) is None  # a day old: measured again
    path.write_text("{not json")
    assert rates_cache.load(Rates) is None
