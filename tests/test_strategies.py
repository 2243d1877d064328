"""The heuristic's strategies (optimizer.heuristic.strategies) and their parts: degrees, chunks,
few samples, segments."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from optimizer.bounds.lower_bounds import lower_bound
from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError
from optimizer.heuristic.chunks import token_chunks
from optimizer.heuristic.few_samples import few_samples_plan
from optimizer.heuristic.packing import HeuristicPlanner
from optimizer.heuristic.strategies import heuristic_plan
from optimizer.plan.evaluate import assignment_step_time
from optimizer.problem.degrees import DENSE_SIZES, LADDER_STEP, allowed_degrees, size_problem
from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import WORKLOADS
from optimizer.verify.verifier import check_assignment

FLEXSP_7B = json.loads(
    (Path(__file__).resolve().parents[1] / "optimizer" / "presets" / "profiles" / "flexsp-gpt7b.json").read_text()
)
MODEL_64_HEADS = {
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


def _problem(
    workload: str, n: int, seed: int, nodes: int = 8, options: dict | None = None, profile: dict | None = FLEXSP_7B
):
    doc = {
        "batch": WORKLOADS[workload](n, seed=seed),
        "cluster": {"nodes": nodes, "gpus_per_node": 8},
        "model": MODEL_64_HEADS,
        "options": options or {},
    }
    if profile is not None:
        doc["profile"] = profile
    return problem_from_json(doc)


def test_sizes_are_every_integer_up_to_the_dense_limit_then_a_ladder_of_whole_nodes_to_the_domain():
    problem = problem_from_json(
        {
            "batch": WORKLOADS["video"](8, seed=0),
            "cluster": {"nodes": 128, "gpus_per_node": 8},
            "model_preset": "llama3-8b",
        }
    )
    sizes = allowed_degrees(problem)
    assert sizes[:DENSE_SIZES] == list(range(1, DENSE_SIZES + 1)) and sizes[-1] == 1024
    above = sizes[DENSE_SIZES:]
    assert all(d % 8 == 0 for d in above)
    assert all(b / a <= LADDER_STEP + 1e-9 or b - a == 8 for a, b in zip([DENSE_SIZES, *above], above, strict=False))
    # The verifier accepts exactly these sizes.
    assert all(size_problem(problem, d) is None for d in sizes)
    assert [d for d in range(1, 1025) if size_problem(problem, d) is None] == sizes
    # The caller's cap is the top of the ladder.
    capped = problem.with_options(max_degree=300)
    assert (
        allowed_degrees(capped)[-1] == 300
        and size_problem(capped, 300) is None
        and size_problem(capped, 304) is not None
    )


@pytest.fixture
def two_heads(monkeypatch):
    """The long head's first two heads only, and its first pass alone: a plan without a deadline runs every
    candidate, and the tests that use this one check other things in a third of the time (more heads:
    test_head_micro_batches_follow_one_another_while_they_pay; the second pass:
    test_the_rest_that_packs_fastest_is_planned_though_its_bound_ranks_it_lower)."""
    from optimizer.heuristic import long_head

    monkeypatch.setattr(long_head, "HEADS", 2)
    monkeypatch.setattr(long_head, "PLANNED_WIDER", long_head.PLANNED)
    monkeypatch.setattr(long_head, "QUICK", 0)


def test_no_cap_on_micro_batches_by_default(two_heads):
    problem = _problem("video", 512, 3)
    assert problem.options.max_micro_batches is None
    plan = heuristic_plan(CostTables.build(problem))
    assert len(plan.micro_batches) > 8  # the former default cap
    assert check_assignment(problem, plan).ok


def test_token_chunks_minimise_the_largest_chunk():
    rng = np.random.default_rng(0)
    for _ in range(30):
        tokens = np.sort(rng.integers(1, 1000, size=int(rng.integers(2, 9))).astype(np.float64))[::-1].copy()
        count = int(rng.integers(1, len(tokens) + 1))
        starts = token_chunks(tokens, count)
        got = max(tokens[a:b].sum() for a, b in zip(starts[:-1], starts[1:], strict=False))
        assert starts[0] == 0 and starts[-1] == len(tokens) and len(starts) - 1 <= count
        best = min(
            max(tokens[a:b].sum() for a, b in zip((0, *cut), (*cut, len(tokens)), strict=False))
            for k in range(count)
            for cut in itertools.combinations(range(1, len(tokens)), k)
        )
        assert got <= best * (1 + 1e-6) + 1.0


def test_few_samples_plan_is_the_best_split_into_runs():
    """Against enumeration: every split of the length order into runs, every size per run (one micro-batch)."""
    for seed in range(4):
        problem = _problem("video", 5, seed, nodes=2)
        tables = CostTables.build(problem)
        plan = few_samples_plan(tables)
        assert plan is not None and check_assignment(problem, plan).ok
        order = list(np.lexsort((np.arange(5), -tables.lengths)))
        cap = float(tables.rank_capacity.min())
        best = np.inf
        for k in range(5):
            for cut in itertools.combinations(range(1, 5), k):
                runs = [order[a:b] for a, b in zip((0, *cut), (*cut, 5), strict=False)]
                options = [[d for d in tables.degrees.tolist() if tables.lengths[r].sum() <= cap * d] for r in runs]
                for sizes in itertools.product(*options):
                    if sum(sizes) > tables.n_ranks:
                        continue
                    t = max(
                        tables.group_constant
                        + float(tables.time_matrix(d <= tables.node_size, 1.0)[r, tables.degree_index[d]].sum())
                        for r, d in zip(runs, sizes, strict=True)
                    )
                    best = min(best, t)
        assert assignment_step_time(tables, plan) <= best * (1 + 1e-9)


def test_few_samples_search_stops_at_the_deadline_after_its_first_block(monkeypatch):
    """12 samples: 2,048 splits in blocks; past the deadline only the first block runs, and its best split is a plan
    no faster than the whole search's."""
    import time

    from optimizer.heuristic import few_samples

    problem = _problem("video", 12, 1, nodes=2)
    tables = CostTables.build(problem)
    calls = []
    real = few_samples.best_split
    monkeypatch.setattr(few_samples, "best_split", lambda *a: calls.append(a[-3]) or real(*a))
    whole = few_samples_plan(tables)
    assert len(calls) == (1 << 11) // few_samples.MASKS_PER_CALL
    calls.clear()
    hurried = few_samples_plan(tables, deadline=time.perf_counter())
    assert calls == [0]
    if hurried is not None:
        assert check_assignment(problem, hurried).ok
        assert assignment_step_time(tables, hurried) >= assignment_step_time(tables, whole) * (1 - 1e-12)


@pytest.mark.parametrize("workload,seed", [("video", 3), ("mixed", 3), ("long-text", 2), ("anyres", 0)])
def test_strategies_beat_the_whole_batch_heuristic_under_flexsp_profile(workload, seed, two_heads):
    problem = _problem(workload, 512, seed)
    tables = CostTables.build(problem)
    whole = assignment_step_time(tables, HeuristicPlanner(tables).plan())
    plan = heuristic_plan(tables)
    step = assignment_step_time(tables, plan)
    assert check_assignment(problem, plan).ok
    assert lower_bound(tables) <= step < whole * 0.97


def test_strategies_stay_out_of_the_way_under_the_analytical_profile():
    """Where the whole-batch plan is within 3% of the bound, it is the plan (planning stays in milliseconds)."""
    problem = _problem("video", 512, 0, profile=None)
    tables = CostTables.build(problem)
    whole = HeuristicPlanner(tables).plan()
    assert assignment_step_time(tables, whole) <= lower_bound(tables) * 1.03
    assert heuristic_plan(tables) == whole


def test_micro_batch_cap_holds_in_every_strategy():
    problem = _problem("mixed", 256, 1, options={"max_micro_batches": 6})
    tables = CostTables.build(problem)
    plan = heuristic_plan(tables)
    assert len(plan.micro_batches) <= 6 and check_assignment(problem, plan).ok


# A memory-tight batch (found by tests/test_properties.py): 38 samples, 3 micro-batches allowed on 12 ranks.
TIGHT_SAMPLES = [
    {"id": "s0", "text_tokens": 7132},
    {"id": "s1", "text_tokens": 1, "images": [{"tokens": 1426, "frames": 5}]},
    {"id": "s2", "text_tokens": 13252, "images": [{"tokens": 1, "frames": 8}]},
    {"id": "s3", "text_tokens": 29, "images": [{"tokens": 1776, "frames": 4}]},
    {"id": "s4", "text_tokens": 1718, "images": [{"tokens": 1191, "frames": 7}]},
    {"id": "s5", "text_tokens": 4000},
    {"id": "s6", "text_tokens": 14947, "images": [{"tokens": 1221, "frames": 8}]},
    {"id": "s7", "text_tokens": 20048, "images": [{"tokens": 1, "frames": 1}]},
    {"id": "s8", "text_tokens": 23551},
    {"id": "s9", "text_tokens": 39115, "images": [{"tokens": 1878, "frames": 7}]},
    {"id": "s10", "text_tokens": 2684, "images": [{"tokens": 556, "frames": 8}]},
    {"id": "s11", "text_tokens": 3871, "images": [{"tokens": 1300, "frames": 2}]},
    {"id": "s12", "text_tokens": 1},
    {"id": "s13", "text_tokens": 1},
    {"id": "s14", "text_tokens": 1},
    {"id": "s15", "text_tokens": 1},
    {"id": "s16", "text_tokens": 1},
    {"id": "s17", "text_tokens": 1},
    {"id": "s18", "text_tokens": 6789},
    {"id": "s19", "text_tokens": 39435},
    {"id": "s20", "text_tokens": 471, "images": [{"tokens": 1665, "frames": 4}]},
    {"id": "s21", "text_tokens": 3869, "images": [{"tokens": 365, "frames": 8}]},
    {"id": "s22", "text_tokens": 7131, "images": [{"tokens": 1, "frames": 1}]},
    {"id": "s23", "text_tokens": 7132},
    {"id": "s24", "text_tokens": 39435},
    {"id": "s25", "text_tokens": 1, "images": [{"tokens": 1, "frames": 1}]},
    {"id": "s26", "text_tokens": 5795, "images": [{"tokens": 191, "frames": 7}]},
    {"id": "s27", "text_tokens": 1, "images": [{"tokens": 1, "frames": 1}]},
    {"id": "s28", "text_tokens": 1},
    {"id": "s29", "text_tokens": 1},
    {"id": "s30", "text_tokens": 1},
    {"id": "s31", "text_tokens": 1},
    {"id": "s32", "text_tokens": 6470, "images": [{"tokens": 1, "frames": 1}]},
    {"id": "s33", "text_tokens": 6471},
    {"id": "s34", "text_tokens": 6789},
    {"id": "s35", "text_tokens": 7132},
    {"id": "s36", "text_tokens": 30885},
    {"id": "s37", "text_tokens": 33307},
]


def test_memory_tight_batch_the_whole_batch_packing_misses_is_planned_by_the_strategies():
    problem = problem_from_json(
        {
            "batch": {"samples": TIGHT_SAMPLES},
            "cluster": {"nodes": 3, "gpus_per_node": 4},
            "model_preset": "internvl2-8b",
            "options": {"backend": "heuristic", "max_micro_batches": 3},
        }
    )
    tables = CostTables.build(problem)
    with pytest.raises(InfeasibleError):
        HeuristicPlanner(tables).plan()
    plan = heuristic_plan(tables)
    assert check_assignment(problem, plan).ok and len(plan.micro_batches) <= 3


def test_pace_starts_a_step_only_while_the_last_one_still_fits(monkeypatch):
    from optimizer.heuristic import pace as pace_module
    from optimizer.heuristic.pace import Pace

    now = [100.0]
    monkeypatch.setattr(pace_module.time, "perf_counter", lambda: now[0])
    assert all(Pace(None, first_s=1e9).room() for _ in range(3))  # no deadline: always room (deterministic plans)
    pace = Pace(100.5, first_s=0.2)
    assert pace.room()  # 0.5 s left, the estimate 0.2 s fits
    now[0] += 0.3
    pace.done()  # that step took 0.3 s
    assert not pace.room()  # 0.2 s left < 0.3 s
    late = Pace(100.5, first_s=0.6)
    now[0] = 100.0
    assert not late.room()  # the estimate alone does not fit


def test_memory_first_in_one_pass_opens_micro_batches_as_needed_and_the_search_stops_at_the_deadline():
    """A memory-tight batch (many long samples on few ranks): the one-pass packing (micro-batches opened only
    when needed) holds every sample within memory and uses no more micro-batches than the count search would
    try; with a deadline already past, the search returns at once with that packing; without a deadline it
    finds the fewest count."""
    import time

    from optimizer.bounds.lower_bounds import fewest_micro_batches

    rng = np.random.default_rng(3)
    batch = {
        "samples": [{"id": f"s{i}", "text_tokens": int(n)} for i, n in enumerate(rng.integers(2000, 20000, size=400))]
    }
    problem = problem_from_json(
        {"batch": batch, "cluster": {"nodes": 1, "gpus_per_node": 6}, "model": MODEL_64_HEADS, "profile": FLEXSP_7B}
    )
    tables = CostTables.build(problem)
    planner = HeuristicPlanner(tables)
    counts = list(range(fewest_micro_batches(tables), tables.n_samples + 1))
    quick = planner.pack_memory_first(counts[-1], spread=False)
    assert quick is not None and check_assignment(problem, quick).ok
    assert len(quick.micro_batches) < len(counts)
    searched = planner._fewest_memory_first(counts)
    assert searched is not None and check_assignment(problem, searched).ok
    assert len(searched.micro_batches) <= len(quick.micro_batches) * 1.5
    t0 = time.perf_counter()
    hurried = planner._fewest_memory_first(counts, deadline=t0)
    assert hurried == quick


def test_memory_first_keeps_the_faster_of_the_one_pass_and_the_spread_packing_with_a_deadline_or_without():
    """A memory-tight long-text batch on 64 ranks at group-size floor 2 (the bench grid's stress-group-constant,
    seed 2): no time-targeted count packs, and the one-pass and spread packings both take 6 micro-batches, the
    one-pass one 17% faster. The plan is the same with a deadline and without one (deterministic mode), and no
    slower than the one pass's."""
    import time

    from bench.grid import make_problem, resolve_profile
    from bench.workload_catalog import get_workload

    problem = make_problem(get_workload("long-text"), 64, 512, 2, 1000.0, resolve_profile("stress-group-constant"), 512)
    tables = CostTables.build(problem)
    planner = HeuristicPlanner(tables, 2)
    counts = planner.micro_batch_counts()
    quick = planner.pack_memory_first(counts[-1], spread=False)
    spread = planner.pack_memory_first(len(quick.micro_batches))
    assert spread is not None and len(spread.micro_batches) == len(quick.micro_batches)
    assert assignment_step_time(tables, quick) < 0.9 * assignment_step_time(tables, spread)
    untimed = planner._fewest_memory_first(counts)
    assert assignment_step_time(tables, untimed) <= assignment_step_time(tables, quick)
    deterministic = assignment_step_time(tables, planner.plan())
    timed = assignment_step_time(tables, planner.plan(time.perf_counter() + 60.0))
    assert deterministic == timed
    assert check_assignment(problem, planner.plan()).ok


def test_the_heuristic_starts_from_the_static_layout_when_it_is_faster_and_polishes_it():
    """An anyres batch on 64 ranks (the bench grid's stress-group-constant, seed 2) whose best static layout
    is 4% faster than what the packings, chunks, segments and long head find without it: the heuristic's plan
    is that layout or better, verified, and the polish improves on it."""
    from bench.grid import make_problem, resolve_profile
    from bench.workload_catalog import get_workload
    from optimizer.heuristic.static_layout import best_static

    problem = make_problem(get_workload("anyres"), 64, 512, 2, 1000.0, resolve_profile("stress-group-constant"), 512)
    tables = CostTables.build(problem)
    static = best_static(tables)
    assert static is not None
    report: dict[str, object] = {}
    planned = heuristic_plan(tables, report=report)
    assert assignment_step_time(tables, planned) < static[0].predicted_step_time_s * (1 - 1e-6)
    assert report["strategy"] == "static layout + local search"
    assert check_assignment(problem, planned).ok


@pytest.mark.parametrize("workload", ["video", "mixed"])
def test_the_local_search_hands_over_the_flat_arrays_its_groups_give(workload):
    """LocalSearch.assignment builds Assignment.flat from its own arrays; they equal the arrays made
    from the groups it returns (after moves and merges, on a mixed cluster too)."""
    from dataclasses import fields

    from optimizer.costs.tables import CostTables
    from optimizer.heuristic.local_search import LocalSearch
    from optimizer.heuristic.packing import HeuristicPlanner
    from optimizer.plan.records import Assignment

    cluster = "mixed-h100-a100" if workload == "mixed" else "h100-8x8"
    problem = problem_from_json(
        {"batch": WORKLOADS[workload](300, seed=2), "cluster_preset": cluster, "model_preset": "qwen2-vl-7b"}
    )
    tables = CostTables.build(problem)
    search = LocalSearch(tables, HeuristicPlanner(tables).plan(), max_rounds=50)
    search.run()
    given = search.assignment()
    rebuilt = Assignment(given.micro_batches).flat
    for f in fields(rebuilt):
        assert np.array_equal(getattr(given.flat, f.name), getattr(rebuilt, f.name)), f.name


def test_an_evaluated_assignment_pickles_and_keeps_its_times_per_tables():
    import pickle

    from optimizer.plan.evaluate import group_times

    problem = problem_from_json(
        {"batch": WORKLOADS["video"](40, seed=3), "cluster_preset": "h100-8x8", "model_preset": "qwen2-vl-7b"}
    )
    tables = CostTables.build(problem)
    assignment = HeuristicPlanner(tables).plan()
    first = group_times(tables, assignment)
    assert group_times(tables, assignment) is first  # kept for these tables
    other = CostTables.build(problem)
    assert group_times(other, assignment) is not first  # recomputed for others, the same values
    assert np.array_equal(group_times(other, assignment)[0], first[0])
    copy = pickle.loads(pickle.dumps(assignment))
    assert copy == assignment
    assert assignment_step_time(tables, copy) == assignment_step_time(tables, assignment)


def test_head_micro_batches_follow_one_another_while_they_pay(monkeypatch):
    """A memory-tight batch whose long samples fill several micro-batches (a bench grid video batch under
    FlexSP's 7B fit, 128 samples on 32 ranks): heads of the next longest samples after the first two give
    a faster plan than two heads and the rest (deterministic: no deadline)."""
    import math

    from bench.grid import make_problem, resolve_profile
    from bench.workload_catalog import get_workload
    from optimizer.heuristic import long_head

    problem = make_problem(get_workload("video"), 32, 128, 1, 1000.0, resolve_profile("flexsp-gpt7b"), 512, True)
    tables = CostTables.build(problem)

    def rest(sub, deadline):
        return heuristic_plan(sub, deadline, long_head=False)

    found = {}
    most = long_head.HEADS
    for heads in (2, most):
        monkeypatch.setattr(long_head, "HEADS", heads)
        plan = long_head.long_head_plan(tables, rest, math.inf, None)
        assert plan is not None and check_assignment(problem, plan[0]).ok
        found[heads] = plan[1]
    assert found[most] < found[2] * 0.99


def test_heads_are_also_built_after_a_first_head_whose_rest_planned_faster(monkeypatch):
    """The heads after the first follow the best-estimated first head; when another first head's plan was
    faster, a chain of heads after it is built too: on a bench grid mixed batch under FlexSP's 7B fit (256
    samples on 64 ranks, seed 2) it gives a plan more than 1% faster than the one chain (deterministic)."""
    import math

    from bench.grid import make_problem, resolve_profile
    from bench.workload_catalog import get_workload
    from optimizer.heuristic import long_head

    problem = make_problem(get_workload("mixed"), 64, 256, 2, 1000.0, resolve_profile("flexsp-gpt7b"), 512, True)
    tables = CostTables.build(problem)

    def rest(sub, deadline):
        return heuristic_plan(sub, deadline, long_head=False)

    found = {}
    for chains in (1, long_head.CHAINS):
        monkeypatch.setattr(long_head, "CHAINS", chains)
        plan = long_head.long_head_plan(tables, rest, math.inf, None)
        assert plan is not None and check_assignment(problem, plan[0]).ok
        found[chains] = plan[1]
    assert found[long_head.CHAINS] < found[1] * 0.99


def test_micro_batch_counts_filled_beyond_max_fill_are_tried_last():
    """A count whose micro-batches memory would fill beyond MAX_FILL is tried after the others, not
    skipped: on the rest of a long-text batch under FlexSP's 7B fit (64 ranks, 512 samples, seed 2)
    once its 24 longest samples are planned apart, the fullest count packs 9% faster than any other."""
    from bench.grid import make_problem, resolve_profile
    from bench.workload_catalog import get_workload
    from optimizer.heuristic import packing

    problem = make_problem(get_workload("long-text"), 64, 512, 2, 1000.0, resolve_profile("flexsp-gpt7b"), 512, True)
    tables = CostTables.build(problem)
    rest = tables.subset(np.sort(np.argsort(-tables.lengths, kind="stable")[24:]))
    planner = HeuristicPlanner(rest)
    counts = planner.micro_batch_counts()
    full = [n for n in counts[:-1] if planner.memory_fill(n) > packing.MAX_FILL]
    assert full == counts[:1]
    tried: list[int] = []
    pack = planner._pack_raising
    planner._pack_raising = lambda target, n: (tried.append(n), pack(target, n))[1]  # type: ignore[method-assign]
    plan = planner.plan(None)
    assert tried[-1] == full[0] and full[0] not in tried[:-1]
    assert check_assignment(rest.problem, plan).ok
    assert len(plan.micro_batches) == full[0]

    class Others(HeuristicPlanner):  # the same packing without the full count
        def micro_batch_counts(self) -> list[int]:
            return [n for n in super().micro_batch_counts() if n not in full]

    assert assignment_step_time(rest, plan) < 0.93 * assignment_step_time(rest, Others(rest).plan(None))


def test_the_rest_that_packs_fastest_is_planned_though_its_bound_ranks_it_lower(monkeypatch):
    """Two heads' rests the bound ranks alike can pack quite differently: on a bench grid video batch under
    FlexSP's 30B fit (256 samples on 128 ranks, seed 1) the long head's second pass, which also plans the
    candidate whose rest the whole-batch packing packs fastest, finds a plan more than 5% faster than the first
    pass and than the second pass without that candidate (deterministic: no deadline)."""
    import math

    from bench.grid import make_problem, resolve_profile
    from bench.workload_catalog import get_workload
    from optimizer.heuristic import long_head

    problem = make_problem(get_workload("video"), 128, 256, 1, 1000.0, resolve_profile("flexsp-gpt30b"), 512, True)
    tables = CostTables.build(problem)

    def rest(sub, deadline):
        return heuristic_plan(sub, deadline, long_head=False)

    first = long_head.long_head_plan(tables, rest, math.inf, None)
    assert first is not None
    found = {}
    for quick in (0, long_head.QUICK):
        monkeypatch.setattr(long_head, "QUICK", quick)
        plan = long_head.long_head_plan(tables, rest, first[1], None, wider=True)
        assert plan is not None and check_assignment(problem, plan[0]).ok
        found[quick] = plan[1]
    assert found[long_head.QUICK] < min(first[1], found[0]) * 0.95


def test_groups_within_nodes_pay_on_mixed_gpus_where_the_packings_cross_nodes(monkeypatch):
    """On a cluster of H100s and A100s the packings price every group at the A100's speed, where crossing nodes
    costs little. Three strategies keep every group inside a node here: the static layout of groups of 8 (a fast
    group takes more work than a slow one), the layouts of one size per GPU kind and the packings run again
    within nodes. On a bench anyres batch under
    ``stress-mixed-gpu`` (128 samples on 64 ranks, seed 1) the plan has every group inside a node and is more than
    3% faster than the packings across nodes alone (deterministic: no deadline)."""
    from bench.grid import make_problem, resolve_profile
    from bench.workload_catalog import get_workload
    from optimizer import jit
    from optimizer.heuristic import strategies

    jit.load()  # the compiled kernels: two whole heuristic runs
    problem = make_problem(get_workload("anyres"), 64, 128, 1, 1000.0, resolve_profile("stress-mixed-gpu"), 512)
    tables = CostTables.build(problem)
    local = strategies.within_nodes(tables)
    assert local is not None and int(local.degrees[-1]) == tables.node_size
    plan = heuristic_plan(tables)
    assert check_assignment(problem, plan).ok
    assert all(len({int(tables.rank_node[r]) for r in ranks}) == 1 for mb in plan.micro_batches for ranks, _ in mb)
    monkeypatch.setattr(strategies, "within_nodes", lambda tables: None)
    monkeypatch.setattr(strategies, "best_static", lambda tables: None)
    monkeypatch.setattr(strategies, "best_kind_layout", lambda tables, deadline: None)
    across = heuristic_plan(tables)
    assert assignment_step_time(tables, plan) < assignment_step_time(tables, across) * 0.97


def test_groups_stay_free_to_cross_nodes_on_one_gpu_type_or_with_samples_longer_than_a_node():
    from bench.grid import make_problem, resolve_profile
    from bench.workload_catalog import get_workload
    from optimizer.heuristic.strategies import within_nodes

    one_type = make_problem(get_workload("anyres"), 64, 64, 1, 1000.0, resolve_profile("flexsp-gpt7b"), 512)
    assert within_nodes(CostTables.build(one_type)) is None
    long = make_problem(get_workload("video"), 64, 64, 0, 1000.0, resolve_profile("stress-mixed-gpu"), 512)
    tables = CostTables.build(long)
    assert float(tables.lengths.max()) > float(tables.rank_capacity.min()) * tables.node_size
    assert within_nodes(tables) is None
    # Under the sample rule a rank's memory holds one sample at a time: a sample longer than a node still needs
    # a group across nodes, though the micro-batch's tokens are not capped.
    one_at_a_time = problem_from_json({**_two_kinds([12000, 3000, 2000]), "options": {"memory": "sample"}})
    tables = CostTables.build(one_at_a_time)
    assert within_nodes(tables) is None
    assert check_assignment(one_at_a_time, heuristic_plan(tables)).ok


def _two_kinds(lengths: list[int]) -> dict:
    """A request on one node of 4 H100s and one of 4 A100s (at 0.6 of the speed), 2,600 tokens a rank."""
    profile = {
        "time": {"quadratic": 5e-9, "linear": 1.8e-4, "sample_constant": 0.0, "group_constant": 0.05},
        "comm": {"scheme": "ulysses", "bytes_per_token": 2e6, "bandwidth_bytes_per_s": {"intra": 1e11, "inter": 1e10}},
        "capacity_tokens_per_rank": 2600,
        "speed_by_gpu": {"A100-80GB": 0.6},
    }
    return {
        "cluster": {"nodes": [{"count": 1, "gpus": 4, "gpu": "H100-SXM"}, {"count": 1, "gpus": 4, "gpu": "A100-80GB"}]},
        "model_preset": "llama3-8b",
        "profile": profile,
        "batch": {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(lengths)]},
    }


def test_a_batch_that_only_groups_across_nodes_hold_is_still_planned_on_mixed_gpus():
    """Three samples of 2.6 ranks' memory each fit a 4-rank node one at a time, and one micro-batch only when
    a group spans both nodes: planning within nodes finds nothing, and the plan across nodes stands."""
    problem = problem_from_json({**_two_kinds([6760] * 3), "options": {"max_micro_batches": 1}})
    tables = CostTables.build(problem)
    from optimizer.heuristic.strategies import within_nodes

    local = within_nodes(tables)
    assert local is not None
    with pytest.raises(InfeasibleError):
        heuristic_plan(local)
    plan = heuristic_plan(tables)
    assert check_assignment(problem, plan).ok
    assert [len(ranks) for mb in plan.micro_batches for ranks, _ in mb] == [8]
