"""Planning a batch in segments of similar length, each with micro-batches of its own.

The step time adds the slowest group of every micro-batch, so a micro-batch that mixes one very
long sample (on a wide group, often across nodes) with many short ones wastes the ranks that wait
for the long one, and forces every micro-batch to open such a wide group. Cutting the batch,
sorted by length, into consecutive segments and planning each segment on its own micro-batches
lets the longest samples share a few micro-batches on groups as wide as they need (up to the whole
domain) while the rest keeps narrow, intra-node groups. The step time of the whole is the sum of
the segments' step times.

Search (greedy, within the heuristic's deadline):

1. the whole batch as one segment is the first candidate (the caller's plan);
2. cut points: where the sorted samples' cumulative tokens fill a given share of one micro-batch's
   memory (N ranks x capacity), for shares from :data:`CUT_SHARES`, and where the memory-minimal
   group size of the samples changes from above one node to within one;
3. the head (the longest samples, up to the cut) is planned by the heuristic; the rest too, unless
   the head's step time plus the rest's lower bound already exceeds the best plan known; the best
   cut is kept when it beats the current plan, and the rest is cut again the same way, up to
   :data:`MAX_SEGMENTS` segments.
"""

from __future__ import annotations

import numpy as np

from optimizer.bounds.lower_bounds import lower_bound
from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError
from optimizer.heuristic.chunks import SubPlanner, join_parts
from optimizer.heuristic.pace import Pace
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.records import Assignment

CUT_SHARES = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Cut where the head's tokens reach these multiples of one micro-batch's memory."""
MAX_SEGMENTS = 4
"""Most segments a plan is cut into."""


def _cuts(tables: CostTables, order: np.ndarray, node_size: int) -> list[int]:
    """Candidate head sizes (numbers of the longest samples) for the samples ``order`` (longest first)."""
    n = order.shape[0]
    lengths = tables.lengths[order].astype(np.float64)
    cum = np.cumsum(lengths)
    mb_tokens = float(tables.rank_capacity.min()) * tables.n_ranks
    cuts = {int(np.searchsorted(cum, share * mb_tokens, side="left")) + 1 for share in CUT_SHARES}
    cap = float(tables.rank_capacity.min())
    spanning = int(np.count_nonzero(lengths > cap * node_size))
    cuts.update({spanning, (spanning + 1) // 2})
    return sorted(k for k in cuts if 1 <= k < n)


def segmented(
    tables: CostTables,
    plan_one: SubPlanner,
    first: Assignment,
    first_time: float,
    deadline: float | None,
    whole_s: float = 0.0,
) -> tuple[Assignment, float]:
    """The best plan found by cutting the batch into segments (see the module docstring), or
    ``first`` when no cut beats it. ``plan_one(tables, deadline)`` plans one segment; a cut is tried
    only while the last cut's time (at first ``whole_s``, one plan of the whole batch) is left."""
    order = np.lexsort((np.arange(tables.n_samples), -tables.lengths))
    fixed: list[tuple[np.ndarray, Assignment]] = []
    rest = order
    fixed_mbs = 0
    limit = tables.problem.options.micro_batch_limit
    rest_plan, rest_time = first, first_time  # the plan of ``rest`` (the whole batch at first)
    pace = Pace(deadline, whole_s)
    for _ in range(MAX_SEGMENTS - 1):
        best = None
        for k in _cuts(tables, rest, tables.node_size):
            if not pace.room():
                break
            try:
                head, tail = rest[:k], rest[k:]
                try:
                    head_t, tail_t = tables.subset(head), tables.subset(tail)
                    head_a = plan_one(head_t, deadline)
                    head_time = assignment_step_time(head_t, head_a)
                    target = rest_time if best is None else min(rest_time, best[0])
                    if head_time + lower_bound(tail_t, splits=False) >= target * (1 - 1e-9):
                        continue  # the rest cannot make up for this head
                    tail_a = plan_one(tail_t, deadline)
                    if fixed_mbs + len(head_a.micro_batches) + len(tail_a.micro_batches) > limit:
                        continue  # the caller's cap on micro-batches
                    total = head_time + assignment_step_time(tail_t, tail_a)
                except InfeasibleError:
                    continue
                if total < rest_time * (1 - 1e-9) and (best is None or total < best[0]):
                    best = (total, head, head_a, tail, tail_a, head_time)
            finally:
                pace.done()
        if best is None:
            break
        total, head, head_a, tail, tail_a, head_time = best
        fixed.append((head, head_a))
        fixed_mbs += len(head_a.micro_batches)
        rest, rest_plan, rest_time = tail, tail_a, total - head_time
    if not fixed:
        return first, first_time
    merged = join_parts([*fixed, (rest, rest_plan)])
    return merged, assignment_step_time(tables, merged)
