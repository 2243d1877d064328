"""Turn an assignment into a plan, with times from the cost tables.

Group times are computed for all groups at once from the assignment's flat arrays
(:attr:`optimizer.plan.records.Assignment.flat`): each group's span (intra-node, slowest GPU) by a
reduction over its ranks, then one gather and one sum per time matrix.
"""

from __future__ import annotations

import weakref
from itertools import chain, pairwise

import numpy as np

from optimizer.costs.group_classes import group_spans, unique_rows
from optimizer.costs.tables import CostTables
from optimizer.plan.group_sets import new_communicators, reporting
from optimizer.plan.records import Assignment, FlatGroups, GroupPlan, MicroBatchPlan, Plan, SolverStats, StaticBaseline


def flat_group_times(tables: CostTables, flat: FlatGroups) -> tuple[np.ndarray, np.ndarray]:
    """(predicted seconds, intra-node?) of every group; 0 s for a group without samples.

    Raises KeyError for a group whose size is not an allowed degree (as the tables would).
    """
    n_groups = flat.size.shape[0]
    if n_groups == 0:
        return np.zeros(0), np.zeros(0, dtype=bool)
    j, intra, speed, _ = group_spans(tables, flat.ranks, flat.rank_start, flat.size)
    gid = np.repeat(np.arange(n_groups), flat.count)
    total = np.zeros(n_groups)
    keys = np.stack([intra.astype(np.float64), speed], axis=1)
    uniq, _, inverse = unique_rows(keys)
    for u in range(uniq.shape[0]):
        matrix = tables.time_matrix(bool(uniq[u, 0]), float(uniq[u, 1]))
        if uniq.shape[0] == 1:
            total += np.bincount(gid, weights=matrix[flat.samples, j[gid]], minlength=n_groups)
        else:
            sel = inverse[gid] == u
            total += np.bincount(gid[sel], weights=matrix[flat.samples[sel], j[gid[sel]]], minlength=n_groups)
    if tables.varying_group_constant:
        constant = np.where(intra, tables.group_constants(True)[j], tables.group_constants(False)[j])
        return np.where(flat.count > 0, total + constant, 0.0), intra
    return np.where(flat.count > 0, total + tables.group_constant, 0.0), intra


def group_times(tables: CostTables, assignment: Assignment) -> tuple[np.ndarray, np.ndarray]:
    """:func:`flat_group_times` of the assignment's groups, kept with the assignment for these tables
    (a plan's assignment is evaluated by the strategies, the planner and :func:`build_plan` in turn)."""
    kept = assignment.__dict__.get("_group_times")
    if kept is not None and kept[0]() is tables:
        return kept[1]
    times = flat_group_times(tables, assignment.flat)
    assignment.__dict__["_group_times"] = (weakref.ref(tables), times)  # never keeps the tables alive
    return times


def assignment_step_time(tables: CostTables, assignment: Assignment) -> float:
    """Sum over micro-batches of the slowest group's predicted time: what planners compare (the
    profile's per-step constant is left out here and added by :func:`build_plan`)."""
    flat = assignment.flat
    times, _ = group_times(tables, assignment)
    slowest = np.zeros(len(assignment.micro_batches))
    np.maximum.at(slowest, flat.micro_batch, times)
    return sum(slowest.tolist())


def build_plan(
    tables: CostTables,
    assignment: Assignment,
    solver: SolverStats,
    lower_bound_s: float,
    static: StaticBaseline | None = None,
) -> Plan:
    flat = assignment.flat
    times, intra = group_times(tables, assignment)
    # Gathered by numpy (an object array for the ids): far fewer interpreter steps per sample than
    # indexing a list, which matters at tens of thousands of samples. Tuples: a group's slice is its field.
    flat_ids = tuple(tables.problem.batch.ids[flat.samples].tolist())
    flat_lengths = tuple(tables.lengths[flat.samples].tolist())
    starts = np.zeros(flat.count.shape[0] + 1, dtype=np.int64)
    np.cumsum(flat.count, out=starts[1:])
    bounds = starts.tolist()
    spans = list(pairwise(bounds))
    group_plans = list(
        map(
            GroupPlan,
            [ranks for mb in assignment.micro_batches for ranks, _ in mb],
            [flat_ids[a:b] for a, b in spans],
            [flat_lengths[a:b] for a, b in spans],
            times.tolist(),
            intra.tolist(),
        )
    )
    orders = _by_first_rank(flat, len(assignment.micro_batches))
    mbs = [MicroBatchPlan(tuple(map(group_plans.__getitem__, order))) for order in orders]
    # Every group's sample indices in the plan's group order (the verifier reads them, see Plan).
    in_order = np.fromiter(chain.from_iterable(orders), dtype=np.int64, count=flat.count.shape[0])
    count = flat.count[in_order]
    ends = np.cumsum(count)
    positions = np.repeat(starts[:-1][in_order] - (ends - count), count) + np.arange(flat.samples.shape[0])
    step = 0.0
    for plan_mb in mbs:
        step += plan_mb.predicted_time_s
    problem = tables.problem
    # The per-step constant (gradient all-reduce, optimizer step) is the same for every plan: it adds
    # to the step, the bound and the static layout alike.
    extra = tables.profile.step_constant
    if extra:
        step += extra
        lower_bound_s += extra
        if static is not None:
            static = StaticBaseline(static.degree, static.micro_batches, static.predicted_step_time_s + extra)
    new = None
    if reporting(problem):
        new = tuple(new_communicators(problem, (g.ranks for mb in mbs for g in mb.groups)))
    return Plan(
        new_communicators=new,
        group_setup_s=problem.options.new_group_cost_s * len(new) if new else 0.0,
        micro_batches=tuple(mbs),
        predicted_step_time_s=step,
        lower_bound_s=lower_bound_s,
        scheme=tables.profile.scheme,
        ulysses_sizes=(
            tuple(zip(tables.degrees.tolist(), tables.ulysses_widths.tolist(), strict=True))
            if tables.profile.scheme == "hybrid"
            else ()
        ),
        scheme_reason=problem.scheme_reason,
        domain_size=tables.n_ranks,
        solver=solver,
        static_baseline=static,
        model=problem.model.name,
        sample_indices=tuple(flat.samples[positions].tolist()),
    )


def _by_first_rank(flat: FlatGroups, n_micro_batches: int) -> list[list[int]]:
    """Group indices of each micro-batch, ordered by their first rank."""
    order = np.lexsort((flat.first_rank, flat.micro_batch))
    per_micro_batch = np.bincount(flat.micro_batch, minlength=n_micro_batches)
    out, start = [], 0
    ordered = order.tolist()
    for count in per_micro_batch.tolist():
        out.append(ordered[start : start + count])
        start += count
    return out
