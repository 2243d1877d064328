"""The bucket MILP: a home-made planner after the idea FlexSP (ASPLOS 2025) published, solved with OR-Tools CP-SAT.

It is not FlexSP: the real FlexSP solver runs as its own baseline (:mod:`bench.flexsp_real`, planner
``flexsp``) where it can, that is under a Ulysses profile its cost model can express, with SCIP
installed. This one stays because it runs where that cannot: under ring and analytical profiles,
on mixed clusters, and with OR-Tools only, within the same budget as the planner.

The idea taken from FlexSP's description: choose, per micro-batch, a set of sequence-parallel groups of power-of-two
sizes >= 2 and assigns length buckets to them so that the slowest group finishes first; sequences are bucketed (about 16
buckets) to keep the MILP small, and several micro-batch counts are tried.

Here, for each micro-batch count M from the least memory allows upwards, until
two counts gave a plan or the budget is spent:

1. the samples are dealt to M micro-batches longest first, each to the micro-batch with the least
   rank-seconds so far among those with token room (a sample's rank-seconds: size x time on its
   smallest fitting size);
2. each micro-batch is solved as the MILP below within its share of the time budget, starting
   from a static hint (the smallest size that fits every bucket, balanced longest first);
3. bucket counts are turned back into samples (longest first, to the least-loaded copy).

When the solver finds no solution within its share, the starting point is kept if it places every
sample (FlexSP's own MILPs run for seconds each; this one gets the same budget as the planner).

MILP of one micro-batch. Notation: buckets b (log-spaced length ranges) with c_b samples,
longest length U_b and mean time t_b(s) on a group of size s; candidate groups g of size s_g
(powers of two >= 2, at most 64 candidates per size; when the domain holds more groups of a size,
each candidate stands for r_g identical copies); C per-rank capacity, N ranks, beta the group
constant.

- variables: y_g in {0, 1} (candidate used), x_bg >= 0 integer (samples of b on each copy of g), T;
- (1) every sample placed: sum_g r_g x_bg >= c_b;
- (2) ranks: sum_g r_g s_g y_g <= N;
- (3) only used groups hold samples: x_bg <= c_b y_g; a bucket only goes to sizes where U_b fits;
- (4) memory, with bucket lengths rounded up as FlexSP does: sum_b U_b x_bg <= C s_g;
- (5) makespan: T >= beta y_g + sum_b t_b(s_g) x_bg;
- symmetry: y_{s,k} >= y_{s,k+1} for candidates of one size;
- objective: minimise T. Times are integer microseconds (CP-SAT takes integer coefficients).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimizer.costs.tables import CostTables
from optimizer.plan.records import Assignment

BUCKETS = 16
CANDIDATES_PER_SIZE = 64


@dataclass
class BucketMILPResult:
    assignment: Assignment | None
    micro_batches: int | None = None
    statuses: list[str] = field(default_factory=list)
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"micro_batches": self.micro_batches, "statuses": self.statuses, "message": self.message}


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _buckets(samples: list[int], lengths: np.ndarray, count: int) -> list[list[int]]:
    """Samples in at most ``count`` buckets with log-spaced length boundaries (empty buckets dropped)."""
    ls = lengths[samples].astype(np.float64)
    lo, hi = float(ls.min()), float(ls.max())
    if hi <= lo:
        return [list(samples)]
    edges = np.exp(np.linspace(np.log(lo), np.log(hi), count + 1))
    which = np.clip(np.searchsorted(edges, ls, side="right") - 1, 0, count - 1)
    out: list[list[int]] = [[] for _ in range(count)]
    for i, k in zip(samples, which.tolist(), strict=True):
        out[k].append(i)
    return [b for b in out if b]


def _hint(
    model: Any,
    cands: list[tuple[int, int]],
    y: list[Any],
    x: dict[tuple[int, int], Any],
    buckets: list[list[int]],
    counts: list[int],
    longest: list[int],
    mean_us: dict[tuple[int, int], int],
    cap: float,
    n_ranks: int,
    beta: int,
) -> tuple[set[int], dict[tuple[int, int], int], bool]:
    """A static starting point for the solver: the smallest size that fits every bucket, as many groups
    of it as the ranks allow, bucket units longest first to the least-loaded group with memory room."""
    size = min(s for s, _ in cands if all(longest[k] <= cap * s for k in range(len(buckets))))
    mine = [g for g, (s, _) in enumerate(cands) if s == size]
    opened = set()
    ranks_left = n_ranks
    for g in mine:
        if cands[g][0] * cands[g][1] <= ranks_left:
            opened.add(g)
            ranks_left -= cands[g][0] * cands[g][1]
    load = dict.fromkeys(opened, 0)
    tokens = dict.fromkeys(opened, 0)
    quota = dict.fromkeys(x, 0)
    complete = True
    for k in sorted(range(len(buckets)), key=lambda k: -longest[k]):
        left = counts[k]
        while left > 0:
            room = [g for g in opened if tokens[g] + longest[k] <= cap * size]
            if not room:
                complete = False
                break
            g = min(room, key=lambda g: load[g])
            quota[k, g] += 1
            load[g] += mean_us[k, size]
            tokens[g] += longest[k]
            left -= cands[g][1]
    for g in range(len(cands)):
        model.add_hint(y[g], g in opened)
    for key, var in x.items():
        model.add_hint(var, quota[key])
    return opened, quota, complete


def _solve_micro_batch(
    tables: CostTables, samples: list[int], sizes: list[int], seconds: float, workers: int
) -> tuple[list[tuple[int, list[int]]] | None, str]:
    """Groups (size, sample indices) of one micro-batch, or None; and the solver status."""
    from ortools.sat.python import cp_model

    n_ranks = tables.n_ranks
    cap = float(tables.rank_capacity.min())
    lengths = tables.lengths
    times = tables.best_time
    index = tables.degree_index
    beta = int(round(tables.group_constant * 1e6))
    buckets = _buckets(samples, lengths, BUCKETS)
    counts = [len(b) for b in buckets]
    longest = [int(lengths[b].max()) for b in buckets]
    mean_us = {
        (k, s): int(math.ceil(float(times[b, index[s]].mean()) * 1e6)) for k, b in enumerate(buckets) for s in sizes
    }
    smallest = max(2, _next_pow2(math.ceil(max(longest) / cap)))
    if smallest > sizes[-1]:
        return None, "infeasible"

    model = cp_model.CpModel()
    cands: list[tuple[int, int]] = []  # (size, copies)
    y = []
    x: dict[tuple[int, int], Any] = {}
    for s in sizes:
        fits = [k for k in range(len(buckets)) if longest[k] <= cap * s]
        if not fits:
            continue
        room = min(n_ranks // s, sum(counts[k] for k in fits))
        if room == 0:
            continue
        n_cand = min(room, CANDIDATES_PER_SIZE)
        copies = math.ceil(room / n_cand)
        first = len(cands)
        for _ in range(n_cand):
            g = len(cands)
            cands.append((s, copies))
            y.append(model.new_bool_var(f"y{g}"))
            for k in fits:
                x[k, g] = model.new_int_var(0, counts[k], f"x{k}_{g}")
                model.add(x[k, g] <= counts[k] * y[g])  # (3)
            model.add(sum(longest[k] * x[k, g] for k in fits) <= int(cap * s))  # (4)
            if g > first:
                model.add(y[g - 1] >= y[g])  # symmetry
    opened, quota, complete = _hint(model, cands, y, x, buckets, counts, longest, mean_us, cap, n_ranks, beta)
    horizon = beta + sum(max(mean_us[k, s] for s in sizes) * counts[k] for k in range(len(buckets)))
    makespan = model.new_int_var(0, horizon, "T")
    for k in range(len(buckets)):  # (1)
        model.add(sum(cands[g][1] * x[k, g] for g in range(len(cands)) if (k, g) in x) >= counts[k])
    model.add(sum(c * s * y[g] for g, (s, c) in enumerate(cands)) <= n_ranks)  # (2)
    for g, (s, _) in enumerate(cands):  # (5)
        model.add(makespan >= beta * y[g] + sum(mean_us[k, s] * x[k, g] for k in range(len(buckets)) if (k, g) in x))
    model.minimize(makespan)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, seconds)
    solver.parameters.num_workers = workers
    solver.parameters.catch_sigint_signal = False
    status = solver.solve(model)
    name = solver.status_name(status).lower()
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        used = {g for g in range(len(cands)) if solver.value(y[g])}
        units = {key: solver.value(var) for key, var in x.items()}
    elif complete:
        name += "+hint"  # nothing found within the share: keep the complete starting point
        used, units = opened, quota
    else:
        return None, name

    copies_out: list[tuple[int, dict[int, int]]] = []
    for g, (s, c) in enumerate(cands):
        if g in used:
            per_copy = {k: units[k, g] for k in range(len(buckets)) if (k, g) in units}
            copies_out.extend((s, dict(per_copy)) for _ in range(c))
    members: list[list[int]] = [[] for _ in copies_out]
    loads = [0.0] * len(copies_out)
    for k, bucket in enumerate(buckets):
        heap = [(loads[q], q) for q, (_, per_copy) in enumerate(copies_out) if per_copy.get(k, 0) > 0]
        heapq.heapify(heap)
        for i in sorted(bucket, key=lambda i: -int(lengths[i])):
            _, q = heapq.heappop(heap)
            s, units_left = copies_out[q]
            units_left[k] -= 1
            members[q].append(i)
            loads[q] += float(times[i, index[s]])
            if units_left[k] > 0:
                heapq.heappush(heap, (loads[q], q))
    return [(s, m) for (s, _), m in zip(copies_out, members, strict=True) if m], name


def bucket_milp(tables: CostTables, budget_s: float, workers: int = 1, counts_tried: int = 2) -> BucketMILPResult:
    """The bucket MILP's plan within ``budget_s`` seconds (see the module docstring)."""
    start = time.perf_counter()
    n_ranks = tables.n_ranks
    sizes = [int(s) for s in tables.degrees if s >= 2 and not (s & (s - 1)) and s <= n_ranks]
    if not sizes:
        return BucketMILPResult(
            None, message="the domain has fewer than 2 ranks; the bucket MILP needs groups of size >= 2"
        )
    cap = float(tables.rank_capacity.min())
    lengths = tables.lengths
    least = max(1, math.ceil(float(lengths.sum()) / (cap * n_ranks) - 1e-12))
    most = tables.problem.options.micro_batch_limit
    tries = list(range(least, most + 1))
    if not tries:
        return BucketMILPResult(
            None, message=f"memory needs {least} micro-batches, more than options.max_micro_batches {most}"
        )
    index = tables.degree_index
    min_size = [max(2, _next_pow2(math.ceil(int(L) / cap))) for L in lengths.tolist()]
    if max(min_size) > sizes[-1]:
        return BucketMILPResult(None, message="a sample needs a larger group than the domain allows")
    area = [min_size[i] * float(tables.best_time[i, index[min_size[i]]]) for i in range(len(min_size))]
    order = sorted(range(len(area)), key=lambda i: -area[i])
    best: BucketMILPResult = BucketMILPResult(None, message="no micro-batch count gave a solution within the budget")
    best_time = math.inf
    share = budget_s / sum(tries[:counts_tried])
    from optimizer.plan.evaluate import assignment_step_time

    solved = 0
    for m_count in tries:
        if solved >= counts_tried or time.perf_counter() - start >= budget_s:
            break
        mbs: list[list[int]] = [[] for _ in range(m_count)]
        load = [0.0] * m_count
        room = cap * n_ranks
        toks = [0.0] * m_count
        for i in order:
            fits = [m for m in range(m_count) if toks[m] + lengths[i] <= room]
            m = min(fits, key=lambda m: load[m]) if fits else min(range(m_count), key=lambda m: toks[m])
            mbs[m].append(i)
            load[m] += area[i]
            toks[m] += float(lengths[i])
        plan: list[list[tuple[list[int] | tuple[int, ...], list[int] | tuple[int, ...]]]] = []
        statuses = []
        for samples in mbs:
            if not samples:
                continue
            left = budget_s - (time.perf_counter() - start)
            groups, status = _solve_micro_batch(tables, samples, sizes, min(share, left), workers)
            statuses.append(status)
            if groups is None:
                plan = []
                break
            at = 0
            placed: list[tuple[list[int] | tuple[int, ...], list[int] | tuple[int, ...]]] = []
            for s, members in sorted(groups, key=lambda g: -g[0]):
                placed.append((tuple(range(at, at + s)), members))
                at += s
            plan.append(placed)
        if not plan:
            if best.assignment is None:
                best = BucketMILPResult(
                    None,
                    m_count,
                    statuses,
                    (
                        f"no solution for {m_count} micro-batch(es) within the budget "
                        f"({statuses[-1] if statuses else 'not run'})"
                    ),
                )
            continue
        solved += 1
        a = Assignment.of(plan)
        t = assignment_step_time(tables, a)
        if t < best_time:
            best, best_time = BucketMILPResult(a, m_count, statuses), t
    return best
