"""Micro-batches led by the longest samples, their other ranks filled up to memory, the rest after them.

When memory allows only a few micro-batches and every micro-batch costs a large constant, the
plan wants the fewest micro-batches; but a micro-batch that holds the longest samples on wide
groups (often across nodes) uses little of those ranks' memory, and the ranks it leaves out wait
for it. This strategy builds such a micro-batch on purpose:

1. the *head*: the k longest samples, each alone on a group, the groups together at most R ranks;
   sizes start at each sample's memory minimum and the slowest sample is widened to the next
   allowed size while the budget R allows (min-max), so the head's time T0 is as short as R permits;
   groups of a node or more take whole nodes, smaller ones stay within a node;
2. the *fill*: the ranks the head leaves free form groups of f ranks within a node (f = 1, 2, 4, 8
   ... up to a node, each tried); the next samples, longest first, go where they finish first among
   the least-loaded of these groups and the head's own groups, as long as the group stays within
   its memory and within T0 (work that costs no time: the micro-batch lasts T0 anyway, and its
   memory would otherwise stay idle); a sample that fits nowhere is left for later;
3. the *rest*: the samples left are planned by the caller's planner as a batch of their own, in the
   micro-batches after the head; or another head is built from them the same way, and so on up to
   :data:`HEADS` heads, with the rest after the last.

Candidates are heads of 1 to :data:`HEAD_MAX` samples on rank budgets from their memory minimum to the whole domain (in
:data:`BUDGET_STEPS` steps) with every fill size. They are ranked by T0 plus an estimate of the rest: first a quick one
(the rest's fewest micro-batches by memory, two when it still holds samples that need groups across nodes beside others,
times the constant, plus its samples' least rank-seconds over all ranks), then, for the :data:`SHORTLIST` best distinct
ones, the larger of that and the rest's lower bound. The rest is planned for the best-ranked candidates (:data:`PLANNED`
of them per head) and for the best one of every micro-batch count of the rest, in the order of their estimates, while
the deadline allows, while a candidate's estimate is below the best plan found and while the time left exceeds what the
previous candidate took; each planned candidate is polished by the local search before it
is compared. Each next head is built after the best-ranked head before it whose rest could be planned; when
another first head's plan (its rest planned at once) was faster than that one's, the heads after it are built
too: the estimate that ranks them can misjudge which first head pays, and the rest's plan tells.

A second pass, run when time is left after the first, does the same with wider picks: the candidates ranked up to
:data:`PLANNED_WIDER` (for the first head, those the first pass left out), then the one among the :data:`QUICK`
best-ranked whose rest packs fastest by the whole-batch packing alone (the bound ranks rests by what they need at
least, and rests that need about the same can pack quite differently). It comes second so that a budget that ends
within the first pass gets the first pass's plans, deeper heads included, as they were.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from optimizer.bounds.lower_bounds import lower_bound
from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError
from optimizer.heuristic.chunks import join_parts
from optimizer.heuristic.heap_kernels import pop, push
from optimizer.heuristic.local_search import POLISH_ROUNDS, LocalSearch
from optimizer.heuristic.pace import Pace
from optimizer.heuristic.packing import HeuristicPlanner
from optimizer.jit import compiled
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.records import Assignment, GroupAssignment

HEAD_MAX = 12
"""Most samples in the head."""
BUDGET_STEPS = 8
"""Rank budgets tried per head, from its memory minimum to the whole domain."""
SHORTLIST = 32
"""Candidates whose rest gets a lower bound, per head."""
PLANNED = 2
"""Candidates whose rest is planned per head micro-batch in the first pass, best estimate first (besides the best of
each micro-batch count of the rest)."""
PLANNED_WIDER = 4
"""The same in the second pass, which plans those the first left out, and the quickest packing among :data:`QUICK`."""
QUICK = 8
"""Best-ranked candidates whose rest is also packed by the whole-batch packing alone, the fastest of them planned."""
HEADS = 6
"""Most head micro-batches built one after another: on memory-tight batches whose long samples fill several
micro-batches, each head of the next longest samples pays (gpt7b and gpt30b long-text batches on 64 ranks).
Past the second, a head is begun only while the time left is at least the time the heads took so far, so
that a budget leaves the polish of the plan after them its share."""
CHAINS = 2
"""Chains of heads built per pass: after the best-estimated first head, then after the first head that planned
fastest when that is another one."""

RestPlanner = Callable[[CostTables, float | None], Assignment]


@compiled
def fill_groups(
    order: np.ndarray,
    lengths: np.ndarray,
    times: np.ndarray,
    n_fill: int,
    capacity: np.ndarray,
    load: np.ndarray,
    tokens: np.ndarray,
    budget: float,
    out_group: np.ndarray,
) -> int:
    """Place ``order`` (longest first) on groups: ``n_fill`` filling groups of one size (time column 0),
    then the head's groups (group ``n_fill + h`` reads column ``1 + h``). Each sample goes where it
    finishes first among the least-loaded filling group and every head group, within ``budget``
    seconds and the group's memory (``capacity``, tokens); else it is skipped (``out_group[k] = -1``).
    ``load`` and ``tokens`` start at what the groups already hold and are updated. Returns the count placed."""
    key1 = np.empty(max(n_fill, 1))
    key2 = np.zeros(max(n_fill, 1))
    ident = np.empty(max(n_fill, 1), dtype=np.int64)
    size = 0
    for g in range(n_fill):
        size = push(key1, key2, ident, 0, size, load[g], 0.0, g)
    placed = 0
    for k in range(order.shape[0]):
        i = order[k]
        out_group[k] = -1
        best = -1
        best_finish = budget
        if size > 0:
            g = ident[0]
            finish = load[g] + times[i, 0]
            if finish <= best_finish and tokens[g] + lengths[i] <= capacity[g]:
                best, best_finish = g, finish
        for g in range(n_fill, load.shape[0]):
            finish = load[g] + times[i, 1 + g - n_fill]
            if finish < best_finish and tokens[g] + lengths[i] <= capacity[g]:
                best, best_finish = g, finish
        if best < 0:
            continue
        if best < n_fill:
            _, _, g, size = pop(key1, key2, ident, 0, size)
            size = push(key1, key2, ident, 0, size, best_finish, 0.0, g)
        load[best] = best_finish
        tokens[best] += lengths[i]
        out_group[k] = best
        placed += 1
    return placed


@dataclass(frozen=True)
class Head:
    """The longest samples each alone on a group: the groups, each one's time and the ranks they use (a mask)."""

    groups: list[GroupAssignment]
    times: np.ndarray
    used: np.ndarray

    @property
    def time(self) -> float:
        """T0: the slowest head group's time."""
        return float(self.times.max())


@dataclass(frozen=True)
class Filled:
    """A head and its fill: the head's groups, the filling groups' ranks (one row each), the samples after the
    head (longest first) and the group each went to (-1: left for the rest, its index past the filling groups:
    a head group)."""

    heads: list[GroupAssignment]
    fills: np.ndarray
    after: np.ndarray
    group: np.ndarray

    @property
    def rest(self) -> np.ndarray:
        """The rows left for the rest, longest first."""
        return self.after[self.group < 0]

    def groups(self) -> list[GroupAssignment]:
        """The first micro-batch's groups: the filling groups that took a sample, then the head's."""
        everyone = [tuple(r) for r in self.fills.tolist()] + [r for r, _ in self.heads]
        members: list[list[int]] = [[] for _ in everyone]
        for h, (_, samples) in enumerate(self.heads):
            members[len(self.fills) + h] += samples
        for s, g in zip(self.after.tolist(), self.group.tolist(), strict=True):
            if g >= 0:
                members[g].append(s)
        return [(r, tuple(m)) for r, m in zip(everyone, members, strict=True) if m]


Candidate = tuple[float, float, Filled, np.ndarray]
"""(estimate, the head's time T0, the first micro-batch (:meth:`Filled.groups`), the rest's sample rows)."""


class LongHead:
    """Candidates of the module docstring for one batch (``tables``)."""

    def __init__(self, tables: CostTables) -> None:
        self.tables = tables
        self.order = np.lexsort((np.arange(tables.n_samples), -tables.lengths))
        self.degrees = [int(d) for d in tables.degrees]
        # Each sample's smallest size by the smallest rank memory (a head group may land on any ranks).
        self._min_index = np.searchsorted(
            float(tables.rank_capacity.min()) * tables.degrees, tables.lengths, side="left"
        )
        self.speed = float(tables.rank_speed.min())
        self._times: dict[bool, np.ndarray] = {}
        self._lengths = tables.lengths.astype(np.float64)
        sizes = tables.degrees.astype(np.float64)
        area = tables.best_time * sizes
        area[np.arange(tables.n_ranks + 1)[None, : len(sizes)] < tables.min_degree_index[:, None]] = np.inf
        self._area = area.min(axis=1)
        self._spanning = (
            tables.lengths > float(tables.rank_capacity.min()) * tables.node_size
        )  # each sample's least rank-seconds over the sizes that hold it

    def _times_by_size(self, sample: int) -> np.ndarray:
        """The sample's time alone on each allowed size (within a node where the size fits one; the slowest GPU)."""
        fits = self.tables.degrees <= self.tables.node_size
        return np.where(fits, self._matrix(True)[sample], self._matrix(False)[sample])

    def widenings(self, k: int) -> list[tuple[int, tuple[int, ...]]]:
        """The min-max sizes of the k longest samples as the rank budget grows: (ranks used, sizes)
        after each widening of the slowest sample to the next allowed size, from the memory minima.
        The sizes for a budget R are the last entry using at most R ranks."""
        head = self.order[:k].tolist()
        index = [int(self._min_index[s]) for s in head]
        if max(index) >= len(self.degrees):
            return []
        times = [self._times_by_size(s) for s in head]
        last = len(self.degrees) - 1
        heap = [(-float(times[i][index[i]]), i) for i in range(k)]
        heapq.heapify(heap)
        used = sum(self.degrees[j] for j in index)
        out = [(used, tuple(self.degrees[j] for j in index))]
        while heap:
            _, i = heap[0]
            if index[i] == last:
                break  # the slowest sample is as wide as allowed: widening others cannot shorten the head
            used += self.degrees[index[i] + 1] - self.degrees[index[i]]
            if used > self.tables.n_ranks:
                break
            index[i] += 1
            heapq.heapreplace(heap, (-float(times[i][index[i]]), i))
            out.append((used, tuple(self.degrees[j] for j in index)))
        return out

    def _place(self, sizes: list[int]) -> list[tuple[int, ...]] | None:
        """Ranks of each head group: groups of a node or more on whole nodes first, the smaller ones
        each within one node; None when they do not fit that way."""
        free = {lo: list(range(lo, hi)) for lo, hi in self.tables.node_ranges}
        out: list[tuple[int, ...] | None] = [None] * len(sizes)
        nodes = list(free)
        for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
            d = sizes[i]
            if d >= self.tables.node_size:
                whole = [lo for lo in nodes if len(free[lo]) == self.tables.node_size]
                ranks: list[int] = []
                for lo in whole:
                    take = free[lo][: d - len(ranks)]
                    ranks += take
                    free[lo] = free[lo][len(take) :]
                    if len(ranks) == d:
                        break
                if len(ranks) < d:
                    return None
                out[i] = tuple(ranks)
            else:
                room = next((lo for lo in nodes if len(free[lo]) >= d), None)
                if room is None:
                    return None
                out[i], free[room] = tuple(free[room][:d]), free[room][d:]
        return [r for r in out if r is not None]

    def fill_sizes(self) -> list[int]:
        """Sizes of the groups that fill the ranks the head leaves free: 1, 2, 4, 8 ... within a node."""
        allowed = set(self.degrees)
        out, d = [], 1
        while d <= self.tables.node_size:
            if d in allowed:
                out.append(d)
            d *= 2
        return out

    def head(self, k: int, sizes: tuple[int, ...]) -> Head | None:
        """The head's groups (the k longest samples on groups of ``sizes``), their times and which ranks they use."""
        placed = self._place(list(sizes))
        if placed is None:
            return None
        heads: list[GroupAssignment] = [
            (ranks, (int(s),)) for ranks, s in zip(placed, self.order[:k].tolist(), strict=True)
        ]
        times = np.array([self.tables.group_time(samples, ranks) for ranks, samples in heads])
        used = np.zeros(self.tables.n_ranks, dtype=bool)
        for ranks, _ in heads:
            used[list(ranks)] = True
        return Head(heads, times, used)

    def fill(self, head: Head, fill: int) -> Filled:
        """Where the next samples go when the ranks the head leaves free form groups of ``fill`` ranks (see
        the module docstring); :meth:`Filled.groups` lists the first micro-batch's groups."""
        tables = self.tables
        b = tables.group_constant
        heads, t0 = head.groups, head.time
        rest = self.order[len(heads) :]
        free = np.flatnonzero(~head.used)
        node = tables.rank_node[free]
        first = np.searchsorted(node, node, side="left")  # nodes hold consecutive ranks
        place = np.arange(free.size) - first
        whole = np.bincount(node, minlength=int(tables.rank_node.max()) + 1)[node] // fill * fill
        fills = free[place < whole].reshape(-1, fill)
        columns = [self._column(fill, True)] + [self._column(len(r), tables.group_span(r)[0]) for r, _ in heads]
        sizes = np.array([fill] * len(fills) + [len(r) for r, _ in heads], dtype=np.float64)
        if tables.homogeneous:
            capacity = sizes * float(tables.rank_capacity[0])
        else:
            least = [float(tables.rank_capacity[f].min()) for f in fills]
            capacity = sizes * np.array(least + [float(tables.rank_capacity[list(r)].min()) for r, _ in heads])
        load = np.zeros(sizes.size)
        load[len(fills) :] = head.times - b
        tokens = np.zeros(sizes.size)
        tokens[len(fills) :] = [float(tables.lengths[samples[0]]) for _, samples in heads]
        out = np.empty(rest.size, dtype=np.int64)
        fill_groups(
            rest,
            self._lengths,
            np.ascontiguousarray(np.stack(columns, axis=1)),
            len(fills),
            capacity,
            load,
            tokens,
            t0 - b,
            out,
        )
        return Filled(heads, fills, rest, out)

    def _matrix(self, intra: bool) -> np.ndarray:
        if intra not in self._times:
            self._times[intra] = self.tables.time_matrix(intra, self.speed)
        return self._times[intra]

    def _column(self, d: int, intra: bool) -> np.ndarray:
        """Every sample's time on a group of d ranks (within a node or not; the slowest GPU)."""
        return self._matrix(intra)[:, self.tables.degree_index[d]]

    def ranked(self, limit: float, deadline: float | None) -> list[Candidate]:
        """Candidates as (estimate, T0, first micro-batch, rest rows), best estimate first; only those whose
        estimate (T0 plus the rest's lower bound) is below ``limit``. The :data:`SHORTLIST` best by a
        quicker estimate (:meth:`rest_estimate`) get the rest's lower bound."""
        quick: list[Candidate] = []

        def late() -> bool:
            return deadline is not None and time.perf_counter() > deadline

        for k in range(1, min(HEAD_MAX, self.tables.n_samples - 1) + 1):
            if late():
                break
            steps = self.widenings(k)
            chosen: dict[tuple[int, ...], None] = {}
            for budget in self.budgets():
                fitting = [sizes for used, sizes in steps if used <= budget]
                if fitting:
                    chosen[fitting[-1]] = None
            for sizes in chosen:
                if late():
                    break
                head = self.head(k, sizes)
                if head is None:
                    continue
                t0 = head.time
                for fill in self.fill_sizes():
                    if late():
                        break
                    filled = self.fill(head, fill)
                    rest = filled.rest
                    if rest.size and (quick_estimate := t0 + self.rest_estimate(rest)) < limit:
                        quick.append((quick_estimate, t0, filled, rest))
        quick.sort(key=lambda c: c[0])
        out = []
        seen: set[tuple[float, int, int]] = set()
        for _, t0, filled, rest in quick:
            key = (t0, rest.size, hash(rest.tobytes()))  # fill sizes that leave the same rest
            if key in seen:
                continue
            seen.add(key)
            if len(seen) > SHORTLIST or late():
                break
            estimate = t0 + max(lower_bound(self.tables.subset(rest), splits=False), self.rest_estimate(rest))
            if estimate < limit:
                out.append((estimate, t0, filled, rest))
        return sorted(out, key=lambda c: c[0])

    def rest_estimate(self, rest: np.ndarray) -> float:
        """A quick lower estimate of the rest's step time: its fewest micro-batches' constants plus its
        samples' least rank-seconds spread over every rank."""
        return self.rest_count(rest) * self.tables.group_constant + float(self._area[rest].sum()) / self.tables.n_ranks

    def quickest_rest(self, candidates: list[Candidate], deadline: float | None) -> int | None:
        """Which of ``candidates`` has the least T0 plus its rest's step time under the whole-batch packing
        (:class:`optimizer.heuristic.packing.HeuristicPlanner`); None when none packs by the deadline."""
        best: tuple[float, int] | None = None
        for i, (_, t0, _, rest) in enumerate(candidates):
            if deadline is not None and time.perf_counter() > deadline:
                break
            sub = self.tables.subset(rest)
            try:
                step = t0 + assignment_step_time(sub, HeuristicPlanner(sub).plan(deadline))
            except InfeasibleError:
                continue
            if best is None or step < best[0]:
                best = (step, i)
        return None if best is None else best[1]

    def rest_count(self, rest: np.ndarray) -> int:
        """The micro-batches :meth:`rest_estimate` counts for the rest."""
        tables = self.tables
        count = math.ceil(float(self._lengths[rest].sum()) / float(tables.rank_capacity.sum()) * (1 - 1e-12))
        spanning = int(np.count_nonzero(self._spanning[rest]))
        if 0 < spanning < rest.size:
            count = max(count, 2)  # samples that need groups across nodes rarely share a micro-batch with the rest
        return max(1, count)

    def budgets(self) -> list[int]:
        n = self.tables.n_ranks
        step = max(1, math.ceil(n / BUDGET_STEPS))
        return sorted({min(n, step * i) for i in range(1, BUDGET_STEPS + 1)})


def picks(head: LongHead, ranked: list[Candidate], planned: int) -> list[int]:
    """Which of the ``ranked`` candidates (best estimate first) to plan, in that order: the ``planned`` best, and the
    best of every micro-batch count of the rest (the count is the plan's largest discrete choice, and the estimates
    of different counts err differently)."""
    counts: set[int] = set()
    chosen = []
    for i, cand in enumerate(ranked):
        count = head.rest_count(cand[3])
        if i < planned or count not in counts:
            chosen.append(i)
        counts.add(count)
    return chosen


def candidates(
    head: LongHead, limit: float, deadline: float | None, wider: bool, first_head: bool
) -> Iterator[Candidate]:
    """The candidates to plan, in order: the :func:`picks` of the ranking with :data:`PLANNED` best; with ``wider``
    those with :data:`PLANNED_WIDER` best (on the ``first_head``, only those the first pass did not plan: its ranking
    is the first pass's), then the one among the :data:`QUICK` best-ranked whose rest packs fastest, when the picks
    left it out (its packings are made only when the caller asks for it)."""
    ranked = head.ranked(limit, deadline)
    if not wider:
        yield from (ranked[i] for i in picks(head, ranked, PLANNED))
        return
    done = set(picks(head, ranked, PLANNED)) if first_head else set()
    chosen = picks(head, ranked, PLANNED_WIDER)
    yield from (ranked[i] for i in chosen if i not in done)
    quickest = head.quickest_rest(ranked[:QUICK], deadline)
    if quickest is not None and quickest not in chosen:
        yield ranked[quickest]


def long_head_plan(
    tables: CostTables,
    plan_rest: RestPlanner,
    best_time: float,
    deadline: float | None,
    whole_s: float = 0.0,
    wider: bool = False,
) -> tuple[Assignment, float] | None:
    """The best plan of the module docstring's candidates that beats ``best_time``, or None
    (``whole_s``: seconds one plan of the whole batch took, the estimate of a first rest's time; ``wider``: the
    second pass, which plans the candidates the first left out)."""
    if tables.n_samples < 3 or tables.problem.options.micro_batch_limit < 2:
        return None
    if deadline is not None and time.perf_counter() + whole_s > deadline:
        return None  # ranking the candidates alone takes about one plan of the whole batch
    chain = _Chain(tables, plan_rest, best_time, deadline, whole_s, wider)
    firsts = chain.run(_Start((), 0.0, np.arange(tables.n_samples)))
    fastest = min(firsts[1:], key=lambda f: f[0], default=None)
    if CHAINS > 1 and fastest is not None and fastest[0] < firsts[0][0] * (1 - 1e-9):
        _, first, t0, rest = fastest
        chain.run(_Start((first,), t0, rest))
    return chain.found


@dataclass(frozen=True)
class _Start:
    """Where a chain of heads starts: the head micro-batches so far, their time, and the rows left after them."""

    prefix: tuple[tuple[GroupAssignment, ...], ...]
    time: float
    rows: np.ndarray


_Planned = tuple[float, tuple[GroupAssignment, ...], float, np.ndarray]
"""A candidate whose rest planned: (the whole plan's step time, the head's micro-batch, the time of the heads so far
with its T0, the rows of the rest)."""


class _Chain:
    """Heads built one after another (the module docstring's step 3), the best plan found over every chain run."""

    def __init__(
        self,
        tables: CostTables,
        plan_rest: RestPlanner,
        best_time: float,
        deadline: float | None,
        whole_s: float,
        wider: bool,
    ) -> None:
        self.tables, self.plan_rest, self.best_time = tables, plan_rest, best_time
        self.deadline, self.wider = deadline, wider
        self.pace = Pace(deadline, whole_s)  # a rest started just before the deadline would run past it
        self.found: tuple[Assignment, float] | None = None
        self.started = time.perf_counter()

    def expired(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def run(self, start: _Start) -> list[_Planned]:
        """The chain from ``start``; the candidates of its first head whose rest planned, best-estimated first."""
        tables, deadline = self.tables, self.deadline
        n = tables.n_samples
        cap = tables.problem.options.max_micro_batches
        prefix, prefix_time, rows = list(start.prefix), start.time, start.rows
        firsts: list[_Planned] = []
        for level in range(len(prefix), HEADS):
            if rows.size < 3 or (cap is not None and len(prefix) + 2 > cap) or self.expired():
                break
            elapsed = time.perf_counter() - self.started
            if level >= 2 and deadline is not None and deadline - time.perf_counter() < elapsed:
                break  # a third head and more only while at most half the time is gone: the polish after needs some

            sub = tables if rows.size == n else tables.subset(rows)
            target = self.best_time if self.found is None else self.found[1]
            planned: list[_Planned] = []
            for estimate, t0, filled, rest in candidates(
                LongHead(sub), target - prefix_time, deadline, self.wider, not prefix
            ):
                target = self.best_time if self.found is None else self.found[1]
                if prefix_time + estimate >= target * (1 - 1e-9) or self.expired():
                    break
                if not self.pace.room():
                    break
                options = {} if cap is None else {"max_micro_batches": cap - len(prefix) - 1}
                try:
                    rest_plan = self.plan_rest(tables.subset(rows[rest], **options), deadline)
                except InfeasibleError:
                    self.pace.done()
                    continue
                first = tuple((ranks, tuple(int(rows[s]) for s in samples)) for ranks, samples in filled.groups())
                joined = join_parts([(np.arange(n), Assignment((*prefix, first))), (rows[rest], rest_plan)])
                search = LocalSearch(tables, joined, max_rounds=POLISH_ROUNDS)  # the parts were planned apart
                search.run(deadline)
                joined, step = search.assignment(), search.step_time()
                self.pace.done()
                planned.append((step, first, prefix_time + t0, rows[rest]))
                if step < target * (1 - 1e-9):
                    self.found = (joined, step)
            if level == len(start.prefix):
                firsts = planned
            if not planned:
                break
            _, first, prefix_time, rows = planned[0]  # the next head follows the best-estimated candidate that planned
            prefix.append(first)
        return firsts
