"""Static layouts, planned under the same cost model, for comparison.

*Static at its best*: one power-of-two context-parallel size c for the whole batch, the domain cut
into floor(N / c) contiguous groups of c ranks, the samples balanced over the groups longest first
(each to the group with memory room that would finish it first: on GPUs of several speeds a fast
group takes more) and spread over as many micro-batches as memory requires; the best c and
micro-batch count for this batch are kept. This is what a well-tuned
static Megatron or DeepSpeed mesh achieves on the batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from optimizer.costs.group_classes import class_times, classify, unique_rows
from optimizer.costs.tables import CostTables
from optimizer.heuristic.static_kernels import balance_static, members_by_bin, sort_ties_by_index
from optimizer.plan.records import Assignment, StaticBaseline
from optimizer.problem.degrees import size_problem


@dataclass(frozen=True)
class _Layout:
    """The static groups of size c and what the balancing reads about them."""

    c: int
    n_groups: int
    order: np.ndarray  # samples longest first (by their time on group 0), ties in index order
    times: np.ndarray  # [classes, n] each sample's time on a group of each class
    group_class: np.ndarray  # [G] class of each group: its (intra-node?, slowest speed), and size where sizes differ
    limit: np.ndarray  # [G] tokens each group holds per micro-batch
    constant: np.ndarray  # [classes] group constant of each class
    rest_min: np.ndarray  # [n] the shortest length among order[p:], for every p
    groups: tuple[tuple[int, ...], ...] | None = None  # each group's ranks (None: contiguous groups of c)


@dataclass(frozen=True)
class _Balanced:
    micro_batches: int
    step_time: float
    used_micro_batches: int  # the non-empty ones
    sample_bin: np.ndarray  # [n] bin m * G + k of every sample


def _layout(tables: CostTables, c: int) -> _Layout | None:
    """floor(N/c) contiguous groups of c ranks, or None if c is not an allowed size."""
    j = tables.degree_index.get(c)
    if j is None:
        return None
    n_groups = tables.n_ranks // c
    used = n_groups * c
    nodes = tables.rank_node[:used].reshape(n_groups, c)
    intra = np.all(nodes == nodes[:, :1], axis=1)
    speed = tables.rank_speed[:used].reshape(n_groups, c).min(axis=1)
    capacity = tables.rank_capacity[:used].reshape(n_groups, c).min(axis=1)
    spans, _, group_class = unique_rows(np.stack([intra.astype(np.float64), speed], axis=1))
    spans = spans.T
    times = np.empty((spans.shape[1], tables.n_samples))
    constant = np.empty(spans.shape[1])
    for k in range(spans.shape[1]):
        times[k] = tables.time_matrix(bool(spans[0, k]), float(spans[1, k]))[:, j]
        constant[k] = tables.group_constants(bool(spans[0, k]))[j]
    order, rest_min = _longest_first(tables, times[group_class[0]])
    return _Layout(c, n_groups, order, times, group_class, capacity * c, constant, rest_min)


def _longest_first(tables: CostTables, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples by decreasing ``times``, ties in index order, and the shortest length from each place on."""
    keys = -times
    order = np.argsort(keys)
    sort_ties_by_index(keys, order)  # as np.argsort(keys, kind="stable"), faster
    rest_min = np.minimum.accumulate(tables.lengths[order][::-1].astype(np.float64))[::-1].copy()
    return order, rest_min


def _balance(tables: CostTables, layout: _Layout, micro_batches: int) -> _Balanced | None:
    """The samples balanced over ``micro_batches`` copies of the layout's groups, or None if memory forbids."""
    sample_bin = np.empty(tables.n_samples, dtype=np.int64)
    load = np.empty(micro_batches * layout.n_groups)
    mb_time = np.empty(micro_batches)
    if not balance_static(
        layout.order,
        tables.lengths,
        layout.times,
        layout.group_class,
        layout.limit,
        micro_batches,
        layout.constant,
        sample_bin,
        load,
        mb_time,
        layout.rest_min,
    ):
        return None
    used = [t for t in mb_time.tolist() if t > 0.0]
    # The step time as :func:`optimizer.plan.evaluate.assignment_step_time` adds it up:
    # slowest group per micro-batch, summed in order.
    return _Balanced(micro_batches, sum(used), len(used), sample_bin)


def _assignment(layout: _Layout, balanced: _Balanced) -> Assignment:
    """The balanced layout as an assignment; each group lists its samples in placement order."""
    n_bins = balanced.micro_batches * layout.n_groups
    members = np.empty(len(layout.order), dtype=np.int64)
    ends = np.empty(n_bins, dtype=np.int64)
    members_by_bin(layout.order, balanced.sample_bin, n_bins, members, ends)
    flat = members.tolist()
    bounds = ends.tolist()
    c = layout.c
    ranks = layout.groups or [tuple(range(k * c, (k + 1) * c)) for k in range(layout.n_groups)]
    mbs = []
    start = 0
    for m in range(balanced.micro_batches):
        groups = []
        for k in range(layout.n_groups):
            end = bounds[m * layout.n_groups + k]
            if end > start:
                groups.append((ranks[k], tuple(flat[start:end])))
            start = end
        if groups:
            mbs.append(tuple(groups))
    return Assignment(tuple(mbs))


def static_assignment(tables: CostTables, c: int, micro_batches: int) -> Assignment | None:
    """Balance the batch over ``micro_batches`` x floor(N/c) static groups of size c, or None if memory forbids."""
    layout = _layout(tables, c)
    if layout is None:
        return None
    balanced = _balance(tables, layout, micro_batches)
    return None if balanced is None else _assignment(layout, balanced)


def best_static(
    tables: CostTables, ruled_out: dict[int, str] | None = None
) -> tuple[StaticBaseline, Assignment] | None:
    """The best static power-of-two layout for this batch (see the module docstring).

    Sizes are tried in order of their fluid estimate (rank-seconds over N plus the per-micro-batch
    constant); a size whose estimate is already above the best layout found cannot win and is skipped.
    Every layout tried is scored from its groups' loads; only the best becomes an assignment.
    ``ruled_out`` receives, by size, the rule that ruled out each power-of-two size found unusable (every
    one of them when the answer is None: :func:`no_static_reason` words it).
    """
    n = tables.n_ranks
    cap = float(tables.rank_capacity.min())
    total = float(tables.lengths.sum())
    longest = int(tables.lengths.max())
    most = tables.problem.options.micro_batch_limit
    sizes = []
    c = 1
    while c <= n:
        if longest <= cap * c and c in tables.degree_index:
            n_groups = n // c
            least = max(1, math.ceil(total / (cap * c * n_groups) - 1e-12))
            if least <= most:
                sizes.append((c, n_groups, least))
            elif ruled_out is not None:
                ruled_out[c] = (
                    f"needs at least {least} micro-batches for the batch's {total:,.0f} tokens, more than the "
                    f"{most} allowed (options.max_micro_batches)"
                )
        elif ruled_out is not None:
            ruled_out[c] = _size_rule(tables, c, longest, cap)
        c *= 2
    works = tables.best_time_columns([tables.degree_index[c] for c, _, _ in sizes]).sum(axis=1).tolist()
    constant = tables.best_group_constants.tolist()
    candidates = sorted(
        (work / n_groups + least * constant[tables.degree_index[c]], c, least)
        for work, (c, n_groups, least) in zip(works, sizes, strict=True)
    )
    best: tuple[_Layout, _Balanced] | None = None
    for estimate, c, least in candidates:
        if best is not None and estimate >= best[1].step_time:
            break
        layout = _layout(tables, c)
        assert layout is not None  # c is an allowed size
        fits = False
        for mb in range(least, min(most, least + 1) + 1):
            balanced = _balance(tables, layout, mb)
            fits = fits or balanced is not None
            if balanced is not None and (best is None or balanced.step_time < best[1].step_time):
                best = (layout, balanced)
        if not fits and ruled_out is not None:
            tried = f"{least}" if min(most, least + 1) == least else f"{least} or {least + 1}"
            ruled_out[c] = f"overflows a group's memory when the samples are balanced over {tried} micro-batches"
    if best is None:
        return None
    layout, balanced = best
    return StaticBaseline(
        degree=layout.c, micro_batches=balanced.used_micro_batches, predicted_step_time_s=balanced.step_time
    ), _assignment(layout, balanced)


KIND_EXTRA_MICRO_BATCHES = 3
"""Micro-batch counts a layout per GPU kind tries beyond the least its memory allows."""
WIDE_GROUPS = (1, 2)
"""The numbers of wide fast groups :func:`best_kind_layout` tries beside fast groups of a node's size."""


def _kind_layout(tables: CostTables, sizes: dict[float, int], wide: tuple[int, int] = (0, 0)) -> _Layout:
    """Groups of ``sizes[speed]`` consecutive ranks of each GPU kind (ranks of one speed, in rank order;
    the remainder of a kind idles); with ``wide`` = (count, size), the fastest kind's first ranks form
    ``count`` groups of ``size`` before its groups of ``sizes[speed]``."""
    groups: list[tuple[int, ...]] = []
    speeds = tables.rank_speed
    fastest = float(speeds.max())
    for speed, c in sizes.items():
        ranks = np.flatnonzero(speeds == speed).tolist()
        if speed == fastest and wide[0]:
            count, size = wide
            groups += [tuple(ranks[k * size : (k + 1) * size]) for k in range(count)]
            ranks = ranks[count * size :]
        groups += [tuple(ranks[k * c : (k + 1) * c]) for k in range(len(ranks) // c)]
    classes = classify(tables, groups)
    group_class = classes.group_class
    times = np.ascontiguousarray(class_times(tables, classes.keys).T)
    constant = np.array([tables.group_constants(intra)[j] for j, intra, _ in classes.keys])
    limit = classes.capacity * np.fromiter(map(len, groups), dtype=np.float64, count=len(groups))
    order, rest_min = _longest_first(tables, times[group_class[0]])
    return _Layout(0, len(groups), order, times, group_class, limit, constant, rest_min, tuple(groups))


def best_kind_layout(tables: CostTables, deadline: float | None = None) -> tuple[float, Assignment] | None:
    """On a cluster of GPUs of two speeds, the fastest layout of one allowed power-of-two size per kind
    (two different sizes; one size for all is :func:`best_static`'s), balanced as the static layout is
    over the least micro-batch count its memory allows and the next KIND_EXTRA_MICRO_BATCHES: (step time,
    plan), or None when there are not two kinds or no such layout holds the batch.

    The sizes that pay differ by kind: under ``stress-mixed-gpu`` an H100 rank holds 6,449 tokens and an
    A100 rank 4,300, so H100 ranks run image samples alone while A100 ranks need groups of several. Layouts
    with the fast kind in groups of a node's size and the slow kind in groups of at most a node are also tried
    with WIDE_GROUPS wide groups of the fast kind (one size, whole nodes, at most half the fast ranks): a
    batch's longest samples need groups across nodes, which one size per kind gives every fast rank. With a
    ``deadline`` the search stops there with the best layout found."""
    speeds = sorted(set(tables.rank_speed.tolist()), reverse=True)
    if len(speeds) != 2:
        return None
    counts = {sp: int((tables.rank_speed == sp).sum()) for sp in speeds}
    options = {sp: [c for c in tables.degrees.tolist() if c & (c - 1) == 0 and c <= counts[sp]] for sp in speeds}
    node = tables.node_size
    best: tuple[_Layout, _Balanced] | None = None

    def balanced_best(layout: _Layout) -> None:
        nonlocal best
        found = _fewest_balanced(tables, layout)
        if found is not None and (best is None or found.step_time < best[1].step_time):
            best = (layout, found)

    for fast in options[speeds[0]]:
        for slow in options[speeds[1]]:
            if fast == slow:
                continue
            if deadline is not None and time.perf_counter() > deadline:
                break
            balanced_best(_kind_layout(tables, {speeds[0]: fast, speeds[1]: slow}))
    half = counts[speeds[0]] // 2  # the most fast ranks wide groups take
    in_node = max((c for c in options[speeds[0]] if c <= node), default=0)
    for slow in (c for c in options[speeds[1]] if c <= node) if in_node else ():
        for size in (c for c in options[speeds[0]] if node < c <= half):
            for count in (k for k in WIDE_GROUPS if k * size <= half):
                if deadline is not None and time.perf_counter() > deadline:
                    break
                balanced_best(_kind_layout(tables, {speeds[0]: in_node, speeds[1]: slow}, (count, size)))
    if best is None:
        return None
    return best[1].step_time, _assignment(*best)


def _fewest_balanced(tables: CostTables, layout: _Layout) -> _Balanced | None:
    """The fastest balance of ``layout`` over the least micro-batch count its memory allows and the next
    KIND_EXTRA_MICRO_BATCHES, or None when none holds the batch."""
    if float(tables.lengths.max()) > float(layout.limit.max()):
        return None
    most = tables.problem.options.micro_batch_limit
    least = max(1, math.ceil(float(tables.lengths.sum()) / float(layout.limit.sum()) - 1e-12))
    best: _Balanced | None = None
    for mb in range(least, min(most, least + KIND_EXTRA_MICRO_BATCHES) + 1):
        balanced = _balance(tables, layout, mb)
        if balanced is not None and (best is None or balanced.step_time < best.step_time):
            best = balanced
    return best


def _size_rule(tables: CostTables, c: int, longest: int, cap: float) -> str:
    """Why groups of ``c`` ranks cannot run the batch at all: the size is not allowed, or too small for its
    longest sample."""
    if c not in tables.degree_index:
        why = size_problem(tables.problem, c)
        if why is None:  # allowed by every rule but the existing groups' (options.group_reuse "only")
            return "is not the size of an existing group (options.group_reuse 'only')"
        return why.removeprefix(f"size {c} ")
    return f"cannot hold the longest sample ({longest:,} tokens; {cap:,.0f} tokens per rank on the smallest GPU)"


def no_static_reason(ruled_out: dict[int, str]) -> str:
    """Why no static power-of-two layout exists, from what :func:`best_static` recorded: the sizes each rule
    ruled out."""
    by_rule: dict[str, list[int]] = {}
    for c, rule in sorted(ruled_out.items()):
        by_rule.setdefault(rule, []).append(c)
    parts = [
        f"size {cs[0]} {rule}" if len(cs) == 1 else f"each of sizes {', '.join(map(str, cs))} {rule}"
        for rule, cs in by_rule.items()
    ]
    return "no static power-of-two layout fits: " + "; ".join(parts) if parts else "no static power-of-two layout fits"
