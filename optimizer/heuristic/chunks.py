"""Sorted chunks: the batch, longest first, cut into consecutive micro-batches of balanced tokens.

Every micro-batch then holds samples of similar length: the longest share one on groups as wide
as they need, the short ones fill others with narrow groups, and no micro-batch waits for one long
sample while its other ranks idle. For a micro-batch count M the cut is the one that minimises the
largest chunk's tokens (a bisection on that largest count with a greedy cut); each chunk is then
planned as one micro-batch by the segment planner it is given (two when one does not fit). The
caller tries a few counts from the least memory allows and keeps the fastest plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError
from optimizer.heuristic.pace import Pace
from optimizer.jit import compiled
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.records import Assignment

SubPlanner = Callable[[CostTables, float | None], Assignment]


@compiled
def _greedy_cut(tokens: np.ndarray, cap: float, starts: np.ndarray) -> int:
    """Chunks of at most ``cap`` tokens (a chunk of one sample may exceed it), in order; starts to ``starts``."""
    k = 0
    starts[0] = 0
    acc = 0.0
    for i in range(tokens.shape[0]):
        if acc + tokens[i] > cap and i > starts[k]:
            k += 1
            starts[k] = i
            acc = 0.0
        acc += tokens[i]
    return k + 1


def token_chunks(tokens: np.ndarray, count: int) -> np.ndarray:
    """Chunk starts (and the end) of the cut into at most ``count`` chunks with the fewest tokens in the largest."""
    starts = np.empty(tokens.shape[0] + 1, dtype=np.int64)
    lo, hi = float(tokens.max()), float(tokens.sum())
    while hi - lo > max(1.0, 1e-6 * hi):
        mid = 0.5 * (lo + hi)
        if _greedy_cut(tokens, mid, starts) > count:
            lo = mid
        else:
            hi = mid
    k = _greedy_cut(tokens, hi, starts)
    starts[k] = tokens.shape[0]
    return starts[: k + 1].copy()


def chunked_plan(
    tables: CostTables,
    plan_one: SubPlanner,
    order: np.ndarray,
    count: int,
    deadline: float | None,
    give_up_above: float = np.inf,
    whole_s: float = 0.0,
) -> Assignment | None:
    """The plan of ``count`` token-balanced chunks of ``order`` (longest first), or None when a chunk
    cannot be planned in time or the chunks planned so far already take ``give_up_above`` seconds
    (``whole_s``: seconds one plan of the whole batch took, the estimate of the chunks' time)."""
    starts = token_chunks(tables.lengths[order].astype(np.float64), count)
    parts: list[tuple[np.ndarray, Assignment]] = []
    spent = 0.0
    pace = Pace(deadline, whole_s / max(1, count))
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        if not pace.room():
            return None
        rows = order[a:b]
        part = None
        for most in (1, 2):
            if most > 1 and deadline is not None and time.perf_counter() > deadline:
                break  # no time for the second try
            try:
                sub = tables.subset(rows, max_micro_batches=most)
                part = plan_one(sub, deadline)
                break
            except InfeasibleError:
                continue
        pace.done()
        if part is None:
            return None
        spent += assignment_step_time(sub, part)
        if spent >= give_up_above:
            return None
        parts.append((rows, part))
    joined = join_parts(parts)
    return joined if len(joined.micro_batches) <= tables.problem.options.micro_batch_limit else None


def join_parts(parts: list[tuple[np.ndarray, Assignment]]) -> Assignment:
    """One assignment from parts planned on their own: (sample rows of the batch, the part's
    assignment over those rows), micro-batches in order, sample indices mapped back to the batch."""
    mbs = []
    for rows, part in parts:
        for mb in part.micro_batches:
            mbs.append(tuple((ranks, tuple(int(rows[s]) for s in samples)) for ranks, samples in mb))
    return Assignment(tuple(mbs))


def best_chunked(
    tables: CostTables, plan_one: SubPlanner, least: int, deadline: float | None, tries: int = 5, whole_s: float = 0.0
) -> tuple[Assignment, float] | None:
    """The fastest chunked plan over a few counts, from ``least`` (the fewest micro-batches memory allows).

    Counts go up by one; a count whose chunks do not each fit one micro-batch gives a plan with more
    micro-batches than chunks. Once a count gives exactly one micro-batch per chunk, one count more
    is tried and the search stops (and after ``tries`` counts in any case). A count starts only while
    the last one's time (at first ``whole_s``, one plan of the whole batch) is left before ``deadline``.
    """
    order = np.lexsort((np.arange(tables.n_samples), -tables.lengths))
    best: tuple[Assignment, float] | None = None
    count = max(1, least)
    settled = False
    pace = Pace(deadline, whole_s)
    for _ in range(tries):
        if count > tables.n_samples or not pace.room():
            break
        plan = chunked_plan(tables, plan_one, order, count, deadline, best[1] if best else np.inf, whole_s)
        pace.done()
        used = count if plan is None else len(plan.micro_batches)
        if plan is not None:
            step = assignment_step_time(tables, plan)
            if best is None or step < best[1]:
                best = (plan, step)
        if settled:
            break
        if plan is not None and used <= count:
            settled = True
        count += 1
    return best
