"""The heuristic's strategies, tried in turn within its deadline; the fastest plan wins.

1. *Whole batch* (:class:`optimizer.heuristic.packing.HeuristicPlanner`): one target time for every
   micro-batch. Under most cost models this is within a few per cent of the lower bound, and then
   nothing else runs (that keeps planning in milliseconds).
2. *Group-size floors*: the whole batch again with every group at least 2, 4 or 8 ranks wide
   (within a node), which pools memory when micro-batches are memory-tight (cheap: tried first).
3. *Static layout* (:func:`optimizer.heuristic.static_layout.best_static`): one group size for the whole
   batch, scored from its groups' loads (cheap beside a packing); each sample goes to the group that would
   finish it first, so on GPUs of several speeds its groups of a node's size are what strategy 7 looks
   for. Where it is the fastest plan so far, the local search below starts from it: equal groups are
   sometimes what the packings miss (on the bench grid, anyres batches on 64 ranks). On GPUs of two speeds,
   also layouts of one size per kind (:func:`optimizer.heuristic.static_layout.best_kind_layout`): H100 ranks
   with memory to run image samples alone beside A100 ranks in groups of several; and of a node's size on the
   fast kind beside one or two wide fast groups, for the longest samples.
4. *Sorted chunks* (:mod:`optimizer.heuristic.chunks`): the batch, longest first, cut into micro-batches of
   balanced tokens, each planned on its own; for cost models with a large per-micro-batch constant
   and slow links across nodes, where the longest samples should share micro-batches of their own.
5. *Segments* (:mod:`optimizer.heuristic.segments`): the longest samples split off, with micro-batches of
   their own, and the rest planned again.
6. *Long head* (:mod:`optimizer.heuristic.long_head`): a micro-batch (or two) led by the longest samples
   on wide groups, its other ranks and its groups' idle time filled with the next samples up to
   memory, and the rest planned by strategies 1-5; for memory-tight batches under a large
   per-micro-batch constant, where the fewest micro-batches pay most.
7. *Within nodes* (:func:`within_nodes`): on a cluster of GPUs of different speeds whose every sample fits
   one node, strategies 1-6 again with every group inside a node. The packings price every group at the
   slowest GPU's speed, where crossing nodes adds little to a sample's time (its communication is not
   slowed, its compute is), and so they choose groups across nodes that cost the fast GPUs far more:
   under ``stress-mixed-gpu`` a 27,000-token sample takes 14% more rank-seconds on 16 A100s than on 8,
   and 41% more on 16 H100s than on 8.

The best plan so far is polished by the local search over the whole batch (moves and swaps across
micro-batches) after the chunks, and again after the segments or the long head when they won.

A chunk or segment is planned by the best of: the split of its samples into runs of the length
order (:mod:`optimizer.heuristic.few_samples`, for a handful of samples), polished by the local search;
the best layout of one group size (:func:`optimizer.heuristic.static_layout.best_static`; for long samples under
all-to-all communication that can be a single group of the whole domain); and the whole-batch
heuristic at the floors that paid off.
"""

from __future__ import annotations

import math
import time
from typing import Any

from optimizer.bounds.lower_bounds import fewest_micro_batches, lower_bound
from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError, ProblemError
from optimizer.heuristic.chunks import best_chunked
from optimizer.heuristic.few_samples import few_samples_plan
from optimizer.heuristic.local_search import POLISH_ROUNDS, LocalSearch
from optimizer.heuristic.long_head import long_head_plan
from optimizer.heuristic.packing import FAST_ROUNDS, GOOD_ENOUGH, HeuristicPlanner
from optimizer.heuristic.segments import segmented
from optimizer.heuristic.static_layout import best_kind_layout, best_static
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.records import Assignment

CHUNK_FLOORS = (8, 1)
"""Floors a chunk is planned with (each chunk keeps its best); floor 1 only for chunks of short
samples (longest at most SHORT_SAMPLE_MEMORY_SHARE of one rank's memory), where narrow groups pay no
communication."""
SHORT_SAMPLE_MEMORY_SHARE = 0.5
"""A sample at most this share of one rank's memory counts as short (a memory share, not a time; chosen by hand)."""


def floors(tables: CostTables) -> tuple[int, ...]:
    """Group-size floors tried on the whole batch: 1, then the allowed powers of two up to a node."""
    allowed = set(tables.degrees.tolist())
    return (1, *(d for d in (2, 4, 8, 16) if d <= tables.node_size and d in allowed))


def within_nodes(tables: CostTables) -> CostTables | None:
    """The tables with every group within a node, on a cluster of GPUs of different speeds whose every sample
    fits a node at the smallest rank memory (a sample's own, under either memory rule); else None."""
    node = tables.node_size
    if float(tables.rank_speed.min()) == float(tables.rank_speed.max()) or int(tables.degrees[-1]) <= node:
        return None
    if float(tables.lengths.max()) > float(tables.sample_capacity.min()) * node:
        return None
    try:
        return tables.rebuilt(max_degree=node)
    except (ProblemError, InfeasibleError):  # sizes up to a node that the size rules do not allow
        return None


def plan_piece(tables: CostTables, deadline: float | None, tried: tuple[int, ...]) -> Assignment:
    """The best plan of a chunk or segment (see the module docstring); raises InfeasibleError when none is found."""
    best: Assignment | None = None
    best_time = math.inf
    few = few_samples_plan(tables, deadline)
    if few is not None:
        search = LocalSearch(tables, few, max_rounds=FAST_ROUNDS)
        search.run(deadline)
        best, best_time = search.assignment(), search.step_time()
    static = best_static(tables)  # one size for every group: as wide as the domain when that is best
    if static is not None and static[0].predicted_step_time_s < best_time:
        best, best_time = static[1], static[0].predicted_step_time_s
    error: InfeasibleError | None = None
    allowed = set(floors(tables))
    short = float(tables.lengths.max()) <= SHORT_SAMPLE_MEMORY_SHARE * float(tables.rank_capacity.min())
    for floor in tried:
        if floor not in allowed:
            continue
        if floor == 1 and tried[0] != 1 and best is not None and not short:
            continue  # narrow groups only pay off for short samples once a plan exists
        try:
            candidate = HeuristicPlanner(tables, floor).plan(deadline)
        except InfeasibleError as exc:
            error = exc
            continue
        step = assignment_step_time(tables, candidate)
        if step < best_time:
            best, best_time = candidate, step
        if deadline is not None and time.perf_counter() > deadline:
            break
    if best is None:
        raise error or InfeasibleError(
            "no plan found for a part of the batch",
            field="batch.samples",
            hint="allow more micro-batches or add ranks.",
        )
    return best


def heuristic_plan(
    tables: CostTables,
    deadline: float | None = None,
    bound: float | None = None,
    report: dict[str, Any] | None = None,
    long_head: bool = True,
) -> Assignment:
    """The fastest plan of the strategies of the module docstring; past the first only when the
    whole-batch plan is more than GOOD_ENOUGH above ``bound`` (the problem's lower bound, computed
    here when not given). ``report``, when given, receives the strategy whose plan won
    (``strategy``) and the milliseconds each strategy took (``strategies_ms``)."""
    report = {} if report is None else report
    spent: dict[str, float] = {}
    report.update(strategy="whole batch", strategies_ms=spent)
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        spent[name] = round(spent.get(name, 0.0) + (now - clock) * 1000.0, 3)
        clock = now

    try:
        best: Assignment | None = HeuristicPlanner(tables).plan(deadline)
    except InfeasibleError as exc:
        if tables.n_samples < 2:
            raise
        # Memory-tight batches the whole-batch packing cannot place may still pack with pooled
        # memory (floors) or chunk by chunk: the strategies below get their turn before giving up.
        best, first_error = None, exc
    lap("whole batch")
    whole_s = spent["whole batch"] / 1000.0  # what later strategies take per piece, roughly
    if best is not None and tables.n_samples < 2:
        return best
    best_time = math.inf if best is None else assignment_step_time(tables, best)
    if bound is None:
        bound = lower_bound(tables, splits=False)
    if best is not None and best_time <= bound * (1 + GOOD_ENOUGH):
        return best

    def keep(name: str, candidate: Assignment | None, step: float | None = None) -> None:
        nonlocal best, best_time
        if candidate is not None:
            step = assignment_step_time(tables, candidate) if step is None else step
            if step < best_time * (1 - 1e-9) or best is None:
                best, best_time = candidate, step
                report["strategy"] = name
        lap(name)

    def expired() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    def too_late(estimate_s: float) -> bool:
        return deadline is not None and time.perf_counter() + estimate_s > deadline

    floor_of_best = 1
    for floor in floors(tables)[1:]:
        if too_late(whole_s):  # a floor's packing takes about as long as the whole batch's
            break
        before = best_time
        try:
            keep("floors", HeuristicPlanner(tables, floor).plan(deadline))
        except InfeasibleError:
            lap("floors")
            continue  # this floor leaves no packing; the plan in hand stands
        if best_time < before:
            floor_of_best = floor
    if not expired():  # one group size for the whole batch; the polish below may improve on it when it wins
        static = best_static(tables)
        keep("static layout", *((static[1], static[0].predicted_step_time_s) if static is not None else (None,)))
    if not expired():  # on GPUs of two speeds, one size per kind
        per_kind = best_kind_layout(tables, deadline)
        keep("layout per GPU kind", *((per_kind[1], per_kind[0]) if per_kind is not None else (None,)))
    if not expired():
        chunked = best_chunked(
            tables,
            lambda sub, d: plan_piece(sub, d, CHUNK_FLOORS),
            fewest_micro_batches(tables),
            deadline,
            whole_s=whole_s,
        )
        keep("sorted chunks", *(chunked or (None,)))

    if best is None:
        raise first_error

    def polish() -> None:
        # Pieces are polished one by one; moves and swaps across micro-batches may still pay.
        if not expired():
            search = LocalSearch(tables, best, max_rounds=POLISH_ROUNDS)
            search.run(deadline)
            base = str(report["strategy"]).removesuffix(" + local search")
            keep(f"{base} + local search", search.assignment(), search.step_time())

    polish()
    if not expired():
        tried = (1,) if floor_of_best == 1 else (1, floor_of_best)
        before = best_time
        keep(
            "segments", *segmented(tables, lambda sub, d: plan_piece(sub, d, tried), best, best_time, deadline, whole_s)
        )
        if best_time < before:
            polish()
    local = within_nodes(tables) if long_head else None
    if local is not None and not expired():
        try:
            keep("within nodes", heuristic_plan(local, deadline, bound))
        except InfeasibleError:
            lap("within nodes")  # memory that only groups across nodes pool: the plan in hand stands
    for wider in (False, True) if long_head else ():
        if expired():
            break
        found = long_head_plan(
            tables, lambda sub, d: heuristic_plan(sub, d, long_head=False), best_time, deadline, whole_s, wider
        )
        keep("long head, wider" if wider else "long head", *(found or (None,)))
        if found is not None and best_time <= found[1]:
            polish()
    return best
