"""Every part of the lower bound against the brute-force optimum and against verified plans.

The oracle (tests/oracle.py) enumerates every plan of a tiny instance with the scalar cost formula
alone; a bound part above its optimum is invalid. The instances span the profiles of
tests/oracle_instances.py (mixed GPU types among them) and variants with the optional profile terms
(per-sample ring steps, group messages, padded bytes) and tight memory. A deliberately wrong
variant of the long-sample part is caught on the same instances, so the check can fail.
"""

from __future__ import annotations

import copy
import functools
import math

import numpy as np
import pytest
from oracle import brute_force_optimum
from oracle_instances import instance

from bench.grid import make_problem, resolve_profile
from bench.workload_catalog import WORKLOADS
from optimizer.bounds.few_micro_batches import _heads, few_micro_batch_bound
from optimizer.bounds.long_sample import OtherFill, long_sample_bound
from optimizer.bounds.lower_bounds import _extremes, bound_parts, fewest_micro_batches
from optimizer.costs.tables import CostTables
from optimizer.errors import PlannerError
from optimizer.problem.documents import problem_from_json
from optimizer.verify.verifier import verify
from planning.planner import plan

SEEDS = 240


def _variant(doc: dict, seed: int) -> dict:
    """The instance with one optional profile term switched on (by seed), when it has a profile."""
    prof = doc.get("profile")
    if prof is None:
        return doc
    out = copy.deepcopy(doc)
    prof = out["profile"]
    kind = seed % 4
    if kind == 1:
        prof["time"]["sample_step"] = 2e-3
    elif kind == 2:
        prof["comm"]["latency_s"] = {"intra": 2e-4, "inter": 2e-3}
        prof["comm"]["messages_per_step"] = 1.0
        prof["comm"]["group_messages"] = {"per_step": 40.0, "fixed": 30.0}
    elif kind == 3:
        prof["comm"]["padded_bytes"] = True
        prof["time"]["group_constant"] = prof["time"]["group_constant"] * 20
    return out


def _cases():
    for seed in range(SEEDS):
        doc, tags = instance(seed)
        try:
            problem = problem_from_json(_variant(doc, seed))
            tables = CostTables.build(problem)
        except PlannerError:
            continue
        yield seed, tags, problem, tables


@functools.cache
def _solved_cases():
    """The cases the oracle solves, with their optimum (enumerated once for all the tests here)."""
    out = []
    for seed, tags, problem, tables in _cases():
        optimum = brute_force_optimum(problem)
        if not math.isinf(optimum):
            out.append((seed, tags, problem, tables, optimum))
    return tuple(out)


def _wrong_long_sample(tables: CostTables) -> float:
    """The long-sample part if the slow sample had to run on its least-area size (invalid: a plan
    may put it on a wider, costlier group that finishes sooner)."""
    fastest, least, _ = _extremes(tables)
    b, n = tables.group_constant, float(tables.n_ranks)
    lengths = tables.lengths.astype(np.float64)
    t = tables.best_time
    others = OtherFill(lengths, least)
    out = 0.0
    for h in range(tables.n_samples):
        j = int(tables.min_degree_index[h]) + int(
            np.argmin(t[h, tables.min_degree_index[h] :] * tables.degrees[tables.min_degree_index[h] :])
        )
        wait = n * (float(tables.best_group_constants[j]) - b + float(t[h, j]))
        fill = others.without(h, float(tables.rank_capacity.sum()) - float(lengths[h]))
        out = max(
            out, fewest_micro_batches(tables) * b + (float(least.sum()) + max(0.0, wait - float(least[h]) - fill)) / n
        )
    return out


def test_no_bound_part_exceeds_the_optimum():
    checked = binding_long = binding_speed = wrong_caught = 0
    for seed, tags, problem, tables in _cases():
        optimum = brute_force_optimum(problem)
        if math.isinf(optimum):
            continue
        parts = bound_parts(tables)
        for name, value in parts.items():
            assert value <= optimum * (1 + 1e-9), (
                f"seed {seed} {tags}: bound part {name} {value} above the optimum {optimum}"
            )
        others = max(v for k, v in parts.items() if k != "long_sample")
        binding_long += parts.get("long_sample", 0.0) > others * 1.001
        binding_speed += "speed" in parts and parts["speed"] >= max(parts.values())
        wrong_caught += _wrong_long_sample(tables) > optimum * (1 + 1e-9)
        checked += 1
    assert checked >= 150
    # The long-sample and speed parts are the largest on some instances, so the check above tests them.
    assert binding_long >= 4, binding_long
    assert binding_speed >= 3, binding_speed
    # And the oracle tells a wrong variant of the long-sample part.
    assert wrong_caught >= 1


def test_long_sample_part_matches_a_plain_greedy_reading():
    """The part's fractional knapsack and size minimum against a loop over samples in Python."""
    for _, _, _, tables in list(_cases())[:60]:
        fastest, least, _ = _extremes(tables)
        got = long_sample_bound(tables, fewest_micro_batches(tables), fastest, least)
        floor = fewest_micro_batches(tables) * tables.group_constant + float(least.sum()) / tables.n_ranks
        b, n = tables.group_constant, tables.n_ranks
        lengths = tables.lengths.tolist()
        best = 0.0
        for h in range(tables.n_samples):
            others = sorted((j for j in range(tables.n_samples) if j != h), key=lambda j: -least[j] / lengths[j])
            room, fill = float(tables.rank_capacity.sum()) - lengths[h], 0.0
            for j in others:
                take = min(1.0, max(0.0, room) / lengths[j])
                fill += take * least[j]
                room -= take * lengths[j]
            heads = []
            for j in range(int(tables.min_degree_index[h]), len(tables.degrees)):
                t = float(tables.best_time[h, j])
                a = float(tables.degrees[j]) * t
                heads.append(a + max(0.0, n * (float(tables.best_group_constants[j]) - b + t) - a - fill))
            best = max(best, fewest_micro_batches(tables) * b + (float(least.sum()) - float(least[h]) + min(heads)) / n)
        # The part tries the slowest and longest samples only: never above the all-samples maximum,
        # and absent only when that maximum is the plain sum.
        if got is None:
            assert best <= floor * (1 + 1e-9)
        else:
            assert floor * (1 - 1e-12) <= got <= best * (1 + 1e-12)


def test_few_micro_batch_part_binds_and_its_wrong_variant_is_caught(monkeypatch):
    """The few-micro-batch part is the largest on some oracle instances (so the check above tests it),
    and a wrong variant, where each micro-batch takes half the other samples' work its memory allows,
    exceeds the optimum on some (so the check can fail)."""
    binding = wrong_caught = 0
    real = OtherFill.within

    def halved(self: OtherFill, budget: np.ndarray) -> np.ndarray:
        return 0.5 * real(self, budget)

    for _, _, _, tables, optimum in _solved_cases():
        parts = bound_parts(tables)
        if "few_micro_batches" not in parts:
            continue
        others = max(v for k, v in parts.items() if k != "few_micro_batches")
        binding += parts["few_micro_batches"] > others * 1.001
        t = tables.for_bounds
        fastest, least, _ = _extremes(t)
        with monkeypatch.context() as patched:
            patched.setattr(OtherFill, "within", halved)
            wrong = few_micro_batch_bound(t, fewest_micro_batches(t), fastest, least)
        wrong_caught += wrong is not None and wrong > optimum * (1 + 1e-9)
    assert binding >= 10, binding
    assert wrong_caught >= 1, wrong_caught


def test_few_micro_batch_part_on_two_against_a_grid_of_lengths():
    """On batches of two micro-batches at the fewest, the part's minimum over the two lengths (the larger
    of two sums of per-micro-batch minima) against a plain search of the least sum itself: every split of
    the heads, the first length on a fine grid (with every point where a head's least area falls) and
    the second the least on the same grid that gives both micro-batches room for the other samples' work.
    Never above it (a relaxation), within half a per cent, and equal to it within the grid's step on most."""
    checked = close = 0
    for _, _, _, tables in list(_cases())[:120]:
        t = tables.for_bounds
        if fewest_micro_batches(t) != 2:
            continue
        fastest, least, _ = _extremes(t)
        got = few_micro_batch_bound(t, 2, fastest, least)
        heads = _heads(t, fastest).tolist()
        rest = [i for i in range(t.n_samples) if i not in heads]
        b, n, q = t.group_constant, float(t.n_ranks), float(t.rank_capacity.sum())
        lengths = t.lengths.astype(float)
        intra, inter, fits = t.best_placements()
        sizes = []  # per head: (finish over b, area) on each allowed size
        for h in heads:
            row = []
            for j in range(int(t.min_degree_index[h]), len(t.degrees)):
                time = float(intra[h, j]) if fits[j] and intra[h, j] < inter[h, j] else float(inter[h, j])
                row.append((float(t.best_group_constants[j]) - b + time, float(t.degrees[j]) * time))
            sizes.append(row)
        work = float(least[rest].sum())
        top = 3 * (work + sum(min(a for _, a in row) for row in sizes)) / n + max(p for row in sizes for p, _ in row)
        grid = np.unique(np.concatenate([np.linspace(0.0, top, 3001), [p for row in sizes for p, _ in row]]))
        fill = OtherFill(lengths[rest], least[rest]) if rest else None
        best = math.inf
        for split in range(1 << (len(heads) - 1)):
            side = [0] + [(split >> (j - 1)) & 1 ^ 1 for j in range(1, len(heads))]
            rooms = []
            for m in (0, 1):
                held = sum(lengths[h] for h, s in zip(heads, side, strict=True) if s == m)
                cap = float(fill.within(np.array([q - held]))[0]) if fill is not None and held <= q else 0.0
                if held > q:
                    cap = -math.inf
                area = np.zeros_like(grid)
                for row, s in zip(sizes, side, strict=True):
                    if s == m:
                        area = area + np.array([min((a for p, a in row if p <= tau), default=math.inf) for tau in grid])
                room = np.where((n * grid >= area) & np.isfinite(area), np.minimum(n * grid - area, cap), -math.inf)
                rooms.append(np.maximum.accumulate(room))
            for i, tau in enumerate(grid):
                if rooms[0][i] == -math.inf:
                    continue
                k = np.searchsorted(rooms[1], work - max(0.0, min(rooms[0][i], work)) - 1e-12)
                if k < len(grid):
                    best = min(best, tau + grid[k])
        value = min(2 * b + best, 3 * b + float(least.sum()) / n)
        step = top / 3000
        assert got <= value * (1 + 1e-9), (got, value)
        assert got >= value * 0.995, (got, value)
        close += got >= value - 2 * step - 1e-9
        checked += 1
    assert checked >= 20, checked
    assert close >= 0.75 * checked, (close, checked)


@pytest.mark.parametrize(
    "profile,workload,ranks,seed",
    [
        ("flexsp-gpt7b", "mixed", 64, 1),
        ("stress-memory-tight", "mixed", 64, 1),
        ("stress-mixed-gpu", "image-sft", 64, 1),
    ],
)
def test_raised_bound_stays_below_verified_plans(profile, workload, ranks, seed):
    problem = make_problem(WORKLOADS[workload], ranks, 512, seed, 200.0, resolve_profile(profile), 512, False)
    tables = CostTables.build(problem)
    parts = bound_parts(tables)
    result = plan(problem)
    report = verify(result, problem)
    assert report.ok, report.violations
    assert max(parts.values()) + problem.cost_profile.step_constant <= report.step_time_s * (1 + 1e-9)
    # Each of these cases is one where the speed or long-sample part raises the bound above the micro-batch one.
    if "speed" in parts:
        assert parts["speed"] > parts["micro_batches"]
    else:
        assert parts.get("long_sample", 0.0) > parts["micro_batches"] * 1.003


def test_group_size_lp_never_exceeds_the_optimum(monkeypatch):
    """The LP bound of solver_models.size_bound, without and with an incumbent (one just above the
    optimum among them, which drops the most columns), against the oracle; it is the largest bound on
    some instances, and wrong variants (samples over a third of a group never share it; the micro-batch
    of a sample holds none of the others' work) exceed the optimum on some, so the check can fail."""
    pytest.importorskip("highspy")
    from solver_models import size_bound as sb

    checked = binding = wrong_caught = wait_caught = 0
    for seed, tags, _, tables, optimum in _solved_cases():
        for upper in (math.inf, optimum * 1.5, optimum * (1 + 1e-6)):
            value = sb.size_bound(tables, upper)
            assert value is not None, f"seed {seed} {tags}: no LP bound"
            assert value <= optimum * (1 + 1e-9), (
                f"seed {seed} {tags}: LP bound {value} above the optimum {optimum} (upper {upper})"
            )
        binding += value > max(bound_parts(tables).values()) * 1.001
        with monkeypatch.context() as patched:
            patched.setattr(sb, "HALF", 1 / 3)
            wrong = sb.size_bound(tables)
        wrong_caught += wrong is not None and wrong > optimum * (1 + 1e-9)
        with monkeypatch.context() as patched:  # as if i's micro-batch held none of the others' work
            patched.setattr(sb, "others_wait", lambda t, least: (float(least.sum()) - least) / t.n_ranks, raising=True)
            wrong = sb.size_bound(tables, optimum * (1 + 1e-6))
        wait_caught += wrong is not None and wrong > optimum * (1 + 1e-9)
        checked += 1
    assert checked >= 150
    assert binding >= 3, binding
    assert wrong_caught >= 1
    assert wait_caught >= 1


def test_group_size_lp_over_gpu_kinds_never_exceeds_the_optimum(monkeypatch):
    """On clusters of two GPU kinds (a faster one with more memory) the LP counts each kind's ranks apart:
    never above the oracle's optimum; above the LP that counts every rank as the fastest and roomiest on
    some instances, so the kinds' rows are checked; and above the LP whose groups of the slow kind may be
    wider than its ranks or hold more than its memory, and use none of the fast ranks, on some."""
    pytest.importorskip("highspy")
    from solver_models import size_bound as sb

    checked = raised = spans = 0
    for seed, tags, _, tables, optimum in _solved_cases():
        if not tags["shape"].endswith("-mixed") or len(sb.gpu_kinds(tables.for_bounds)) < 2:
            continue
        value = sb.size_bound(tables)
        assert value is not None and value <= optimum * (1 + 1e-9), f"seed {seed} {tags}: {value} > {optimum}"
        with monkeypatch.context() as patched:
            patched.setattr(sb, "gpu_kinds", _one_kind)
            single = sb.size_bound(tables)
        raised += single is not None and value > single * 1.001
        with monkeypatch.context() as patched:
            _loosen_kinds(patched, sb)
            loose = sb.size_bound(tables)
        spans += loose is not None and value > loose * 1.001
        checked += 1
    assert checked >= 10, checked
    assert raised >= 1
    assert spans >= 1, spans


def test_length_class_lp_never_exceeds_the_optimum(monkeypatch):
    """The LP over micro-batch length classes (solver_models.length_class_bound) against the oracle,
    under two incumbents; it is the largest bound on some instances, its whole-group rows raise it on
    some (a long sample no longer runs on a sliver of a wide group), and a wrong variant (a class's
    micro-batches charged their longest length, not their shortest) exceeds the optimum on some."""
    pytest.importorskip("highspy")
    from solver_models import length_class_bound as lc
    from solver_models import size_bound as sb

    checked = binding = wrong_caught = whole = 0
    for seed, tags, _, tables, optimum in _solved_cases():
        for upper in (optimum * 1.5, optimum * 1.05):
            found = lc.length_class_bound(tables, upper, rounds=4)
            assert found is not None, f"seed {seed} {tags}: no class bound (upper {upper})"
            assert found.bound_s <= optimum * (1 + 1e-9), (
                f"seed {seed} {tags}: class bound {found.bound_s} above the optimum {optimum} (upper {upper})"
            )
        others = max([*bound_parts(tables).values(), sb.size_bound(tables) or 0.0])
        binding += found.bound_s > others * 1.001
        with monkeypatch.context() as patched:
            patched.setattr(lc, "_charged", lambda low, high: high)
            wrong = lc.length_class_bound(tables, optimum * 1.5, rounds=4)
        wrong_caught += wrong is not None and wrong.bound_s > optimum * (1 + 1e-9)
        first = lc.length_class_bound(tables, optimum * 1.05, rounds=1)  # one round each: the rows, not the rounds
        with monkeypatch.context() as patched:
            patched.setattr(lc, "WHOLE_SHARE", math.inf)
            partial = lc.length_class_bound(tables, optimum * 1.05, rounds=1)
        whole += first is not None and partial is not None and first.bound_s > partial.bound_s * 1.001
        checked += 1
    assert checked >= 150
    assert binding >= 3, binding
    assert wrong_caught >= 1
    assert whole >= 10, whole


def test_length_class_lp_over_gpu_kinds_never_exceeds_the_optimum(monkeypatch):
    """On clusters of two GPU kinds the class LP's groups are of a kind (the speed and memory of their
    slowest rank, on ranks of that kind or faster): never above the oracle's optimum; above the LP that
    counts every rank as the fastest and roomiest on some instances; and above the LP whose groups of the
    slow kind may be wider than its ranks or hold more than its memory, and use none of the fast ranks."""
    pytest.importorskip("highspy")
    from solver_models import length_class_bound as lc
    from solver_models import size_bound as sb

    checked = raised = spans = 0
    for seed, tags, _, tables, optimum in _solved_cases():
        if not tags["shape"].endswith("-mixed") or len(sb.gpu_kinds(tables.for_bounds)) < 2:
            continue
        found = lc.length_class_bound(tables, optimum * 1.05, rounds=4)
        assert found is not None and found.bound_s <= optimum * (1 + 1e-9), f"seed {seed} {tags}: {found}"
        with monkeypatch.context() as patched:
            patched.setattr(lc, "gpu_kinds", _one_kind)
            single = lc.length_class_bound(tables, optimum * 1.05, rounds=4)
        raised += single is not None and found.bound_s > single.bound_s * 1.001
        with monkeypatch.context() as patched:
            _loosen_kinds(patched, lc)
            loose = lc.length_class_bound(tables, optimum * 1.05, rounds=4)
        spans += loose is not None and found.bound_s > loose.bound_s * 1.001
        checked += 1
    assert checked >= 10, checked
    assert raised >= 1, raised
    assert spans >= 1, spans


def _loosen_kinds(patched: pytest.MonkeyPatch, module: object) -> None:
    """An LP over GPU kinds (``module``: size_bound or length_class_bound) whose groups of a slow kind may be
    wider than its ranks or hold more than its memory, and use none of the fast ranks."""
    patched.setattr(module, "kind_fits", lambda kinds, q, deg, lengths: np.ones((len(lengths), len(deg)), bool))
    patched.setattr(
        module,
        "held_ranks",
        lambda kinds, q, deg: np.array([deg * (r <= q) for r in range(len(kinds))], dtype=np.float64),
    )


def _one_kind(tables: CostTables) -> list[tuple[float, float, int]]:
    """size_bound.gpu_kinds as if every rank were the fastest and roomiest."""
    return [(float(tables.rank_speed.max()), float(tables.rank_capacity.max()), tables.n_ranks)]


def _ticks():
    """A clock that moves one second each time it is read."""
    ticks = iter(range(10**6))
    return lambda: float(next(ticks))


def _slowest_alone(tables, d, micro_batches):
    """column_bound's first columns made poor: each sample alone on its slowest allowed size."""
    from solver_models import column_bound as cb

    out = []
    for i in range(d.n):
        slowest = int(np.argmax(np.where(d.pair_sample == i, d.pair_length, -np.inf)))
        out.append(cb._Column(-1, int(d.pair_size[slowest]), np.array([i]), float(d.pair_length[slowest])))
    return out


def test_column_generation_lp_never_exceeds_the_optimum(monkeypatch):
    """The group-column LP (solver_models.column_bound) against the oracle, under two incumbents; it is
    at least the length-class LP on the same classes when that LP too counts every rank as the fastest
    and roomiest (the column LP knows no GPU kinds), the largest bound on some instances, and a wrong
    variant (each class's micro-batches charged their longest length) exceeds the optimum on some."""
    pytest.importorskip("highspy")
    from solver_models import column_bound as cb
    from solver_models import length_class_bound as lc

    lagrange = cb._lagrange
    checked = above_class = wrong_caught = lagrangian = wrong_lagrangian = 0
    for seed, tags, _, tables, optimum in _solved_cases():
        for upper in (optimum * 1.5, optimum * 1.05):
            found = cb.column_bound(tables, upper)
            assert found is not None, f"seed {seed} {tags}: no column bound (upper {upper})"
            assert found.converged, f"seed {seed} {tags}: column generation did not converge"
            assert found.bound_s <= optimum * (1 + 1e-9), (
                f"seed {seed} {tags}: column bound {found.bound_s} above the optimum {optimum} (upper {upper})"
            )
        with monkeypatch.context() as patched:
            patched.setattr(lc, "gpu_kinds", _one_kind)
            classes = lc.length_class_bound(tables, optimum * 1.05, rounds=1)
        assert classes is not None
        assert found.bound_s >= classes.bound_s * (1 - cb.CLOSE), (
            f"seed {seed} {tags}: below the class LP {found.bound_s} {classes.bound_s}"
        )
        above_class += found.bound_s > classes.bound_s * 1.001
        with monkeypatch.context() as patched:
            patched.setattr(cb, "_lows", lambda highs: list(highs))
            wrong = cb.column_bound(tables, optimum * 1.5)
        wrong_caught += wrong is not None and wrong.bound_s > optimum * (1 + 1e-9)
        # stopped after two pricings, from poor first columns (each sample alone on its slowest size): the
        # Lagrangian bound, far below the master's value there
        with monkeypatch.context() as patched:
            patched.setattr(cb, "_seeds", _slowest_alone)
            early = cb.column_bound(tables, optimum * 1.5, deadline=5.0, clock=_ticks())
            assert early is None or early.bound_s <= optimum * (1 + 1e-9), (
                f"seed {seed} {tags}: Lagrangian bound {early.bound_s} above the optimum {optimum}"
            )
            lagrangian += early is not None and not early.converged and early.bound_s > 0
            # the missing columns' part left out: no longer a bound
            patched.setattr(cb, "_lagrange", lambda *args: lagrange(*args[:-1], np.zeros_like(args[-1])))
            wrong = cb.column_bound(tables, optimum * 1.5, deadline=5.0, clock=_ticks())
            wrong_lagrangian += wrong is not None and wrong.bound_s > optimum * (1 + 1e-9)
        checked += 1
    assert checked >= 150
    assert above_class >= 3, above_class
    assert wrong_caught >= 1
    assert lagrangian >= 10, lagrangian
    assert wrong_lagrangian >= 1, wrong_lagrangian
