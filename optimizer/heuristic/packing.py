"""The default planner: polynomial time, memory-aware, topology-aware.

Outline (M micro-batches are treated as M micro-batches of the domain; a group lives in one micro-batch):

1. Micro-batch count. M starts at the least count that memory allows (total tokens over the
   capacity of the domain) and goes up only while that pays off (a few counts are tried); counts that
   would fill memory beyond MAX_FILL come last.
2. Target time. For a per-micro-batch target S, each sample takes the smallest allowed group size that
   holds it in memory and finishes it within S (its *degree*). A fluid count of the rank-seconds
   these degrees need, sum_i d_i t_i(d_i) / (S - b), must fit the M N ranks; S is found by
   bisection, and a few targets just above it are tried.
3. Packing. Samples with degree >= 2 are packed best-fit-decreasing into groups of their degree
   (time within S, tokens within capacity); the groups are spread over the micro-batches and placed onto
   nodes (:mod:`optimizer.heuristic.placement`); every rank left over becomes a group of size 1.
   The remaining short samples go, longest first, to the group where they finish earliest
   (LPT on related machines), filling the slack of the long groups as well.
4. Improvement (:mod:`optimizer.heuristic.local_search`): moves and swaps of samples out of each micro-batch's
   slowest group, and growing a slow group over idle neighbouring ranks, while the step time falls.

Everything is deterministic for a given input (ties break on index).
"""

from __future__ import annotations

import math
import time
from functools import cached_property

import numpy as np

from optimizer.costs.group_classes import GroupClasses, class_times, classify
from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError
from optimizer.heuristic.best_fit_kernels import best_fit_long
from optimizer.heuristic.degree_kernels import choose_degrees, fastest_sizes, fluid_work
from optimizer.heuristic.local_search import LocalSearch, Packing
from optimizer.heuristic.lpt_kernels import lpt_place
from optimizer.heuristic.memory_first_kernels import memory_first
from optimizer.heuristic.placement import place_groups, spread_over_micro_batches
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.records import Assignment

EXTRA_MICRO_BATCHES = 2
"""Micro-batch counts always tried beyond the least that memory allows; further counts are tried
while their fluid estimate still beats the best plan found (a count is a decision, not a minimum)."""
BEST_FIT_PROBES = 64
"""Groups a long sample tries (fullest first) before it opens a new one; many, because groups full of
tokens crowd the front when memory binds (with few probes every sample then opens a group)."""
LARGE_BATCH = 16384
LARGE_BATCH_PROBES = 8
"""Probes on batches above LARGE_BATCH samples, where the probing itself would cost more than it saves."""
FAST_ROUNDS = 12
"""Local-search rounds of the fast heuristic (the strategies polish further within the deadline)."""
GOOD_ENOUGH = 0.03
"""Stop trying more micro-batches once within this fraction of the fluid optimum."""
RETRY_FACTOR = 1.05
"""Target raised by this factor when a packing does not fit (then by RETRY_GROWTH each time)."""
RETRY_GROWTH = 1.3
RETRY_LIMIT = 2.0
"""Largest factor of the fluid target tried before a count is given up."""
SMALL_BATCH = 64
"""Batches up to this many samples also try the coarser targets below."""
SMALL_BATCH_TARGETS = (1.25, 1.6, 2.2)
"""Factors of the target tried for small batches."""
MAX_EMPTY_COUNTS = 3
"""Counts tried past the first few while none has packed, before the memory-first fallback."""
MAX_FILL = 0.85
"""A micro-batch count whose memory would be filled beyond this share is tried after the larger counts (its
packing fails on fragmentation more often than not, yet it is the fastest when it fits)."""


class HeuristicPlanner:
    """Plans one batch; build once per problem, call :meth:`plan`."""

    def __init__(self, tables: CostTables, floor: int = 1) -> None:
        """``floor``: the least group size given to any sample (1: sizes follow memory and time alone).
        A larger floor pools the memory of several ranks in every group, so that memory-tight
        micro-batches pack with less waste (at the price of some communication)."""
        self.t = tables
        self.b = tables.group_constant
        self.bj = (
            tables.placed_group_constants
        )  # per size: b, plus the group's messages when the profile has comm.group_messages
        self.capacity = float(tables.rank_capacity.min())
        self.degrees = [int(d) for d in tables.degrees]
        self.node_size = tables.node_size
        # [n, D] time on a well-placed group of each size: within a node up to the node size, across
        # nodes above (the intra-node matrix holds exactly that: a size wider than a node spans nodes).
        self.cost = tables.time_matrix(True, float(tables.rank_speed.min()))
        self.lengths = tables.lengths.astype(np.float64)
        self.min_j = self._min_degree_index()
        if floor > 1:
            self.min_j = np.maximum(
                self.min_j, min(int(np.searchsorted(tables.degrees, floor, side="left")), len(self.degrees) - 1)
            )
        self.total_tokens = float(self.lengths.sum())
        self.probes = BEST_FIT_PROBES if self.lengths.shape[0] <= LARGE_BATCH else LARGE_BATCH_PROBES

    def _min_degree_index(self) -> np.ndarray:
        # The first size whose memory holds the sample (sizes are ascending).
        j = np.searchsorted(self.capacity * self.t.degrees, self.lengths, side="left")
        if (j >= len(self.degrees)).any():
            i = int(np.argmax(j >= len(self.degrees)))
            s = self.t.problem.batch.samples[i]
            need = math.ceil(s.length / self.capacity)
            raise InfeasibleError(
                (
                    f"sample {s.id!r} ({s.length} tokens) needs a group of {need} ranks at {self.capacity:.0f} tokens "
                    f"per rank, above the largest allowed size {self.degrees[-1]}"
                ),
                field="batch.samples",
                hint=f"raise options.max_degree to >= {need}, add ranks, or shorten the sample.",
            )
        return j

    # -- 1. micro-batch counts --------------------------------------------------------------
    def micro_batch_counts(self) -> list[int]:
        """Counts to try, from the least the heuristic's packing (at the smallest per-rank capacity)
        can use; raises only when memory proves the cap too small (at every rank's own capacity)."""
        n_ranks = self.t.n_ranks
        least = max(1, math.ceil(self.total_tokens / (self.capacity * n_ranks) - 1e-12))
        most = self.t.problem.options.micro_batch_limit
        held = float(self.t.rank_capacity.sum())
        proven = max(1, math.ceil(self.total_tokens / held - 1e-12))
        if proven > most:
            raise InfeasibleError(
                (
                    f"the batch holds {self.total_tokens:.0f} tokens but {most} micro-batches of {n_ranks} ranks hold "
                    f"only {most * held:.0f}"
                ),
                field="options.max_micro_batches",
                hint=f"allow at least {proven} micro-batches, add ranks, or send a smaller batch.",
            )
        least = min(least, most)
        return list(range(least, min(most, max(least + EXTRA_MICRO_BATCHES, self.t.n_samples)) + 1))

    def memory_fill(self, n_micro_batches: int) -> float:
        """The share of the memory of ``n_micro_batches`` micro-batches (at the smallest per-rank capacity)
        the batch's tokens fill."""
        return self.total_tokens / (n_micro_batches * self.t.n_ranks * self.capacity)

    # -- 2. target time ---------------------------------------------------------------------
    @cached_property
    def _fastest(self) -> np.ndarray:
        """Each sample's fastest allowed size index (for targets no size meets)."""
        out = np.empty(self.min_j.shape[0], dtype=np.int64)
        fastest_sizes(self.cost + self.bj if self.t.varying_group_constant else self.cost, self.min_j, out)
        return out

    def degrees_for(self, target: float) -> np.ndarray:
        """Index of each sample's degree for a per-micro-batch target time: the smallest size that holds
        it in memory and finishes it within the target (its fastest size if none does)."""
        j = np.empty(self.min_j.shape[0], dtype=np.int64)
        choose_degrees(self.cost, self.min_j, self._fastest, self.bj, float(target), j)
        return j

    @cached_property
    def _fluid_split(self) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Samples that finish on their memory-minimal size within every target tried (all targets
        are at least the slowest sample's best time): their rank-seconds, once; and the others."""
        t_min = self._memory_minimal_times
        lo = self._slowest_alone
        fixed = t_min + self.bj[self.min_j] <= lo
        rest = np.flatnonzero(~fixed)
        return (
            float((self.t.degrees[self.min_j[fixed]] * t_min[fixed]).sum()),
            self.cost[rest],
            self.min_j[rest],
            self._fastest[rest],
        )

    def fluid_ranks(self, target: float) -> float:
        fixed_work, cost, min_j, fastest = self._fluid_split
        work = fixed_work + fluid_work(cost, min_j, fastest, self.t.degrees, self.bj, float(target))
        return work / max(target - self.b, 1e-12)

    @cached_property
    def _slowest_alone(self) -> float:
        """The latest of the samples' earliest finishes (each alone on its fastest size)."""
        fastest = self._fastest
        return float((self.bj[fastest] + self.cost[np.arange(self.cost.shape[0]), fastest]).max())

    @cached_property
    def _memory_minimal_times(self) -> np.ndarray:
        """[n] each sample's time on its memory-minimal size."""
        return self.cost[np.arange(self.cost.shape[0]), self.min_j]

    def target_time(self, n_micro_batches: int) -> float:
        avail = n_micro_batches * self.t.n_ranks
        lo = self._slowest_alone
        if self.fluid_ranks(lo) <= avail:
            return lo
        t_min = self._memory_minimal_times
        hi = float((self.bj[self.min_j] + t_min).max()) + float((t_min * self.t.degrees[self.min_j]).sum()) / avail
        while self.fluid_ranks(hi) > avail:
            hi *= 2
        for _ in range(40):
            if hi - lo <= 1e-3 * hi:
                break
            mid = 0.5 * (lo + hi)
            if self.fluid_ranks(mid) > avail:
                lo = mid
            else:
                hi = mid
        return hi

    # -- 3. packing -------------------------------------------------------------------------
    def pack(self, target: float, n_micro_batches: int) -> Packing | None:
        t = self.t
        j_of = self.degrees_for(target)
        degs = t.degrees
        cost = self.cost
        slack = target - self.b
        rows = np.arange(j_of.shape[0])
        t_of = cost[rows, j_of]
        is_long = degs[j_of] >= 2
        # Long samples: largest size first, then longest time first (ties by index).
        long_rows = rows[is_long]
        long_idx = long_rows[np.lexsort((long_rows, -t_of[is_long], -j_of[is_long]))]
        n_long = long_idx.shape[0]
        long_group = np.empty(n_long, dtype=np.int64)
        g_size = np.empty(n_long, dtype=np.int64)
        g_load = np.empty(n_long, dtype=np.float64)
        g_tokens = np.empty(n_long, dtype=np.float64)
        n_groups = best_fit_long(
            long_idx,
            j_of,
            t_of,
            self.lengths,
            degs,
            self.capacity,
            target - self.bj,
            self.probes,
            long_group,
            g_size,
            g_load,
            g_tokens,
        )
        g_size, g_load, g_tokens = g_size[:n_groups], g_load[:n_groups], g_tokens[:n_groups]
        placed = self._place(g_size, g_load, n_micro_batches)
        if placed is None:
            return None
        ranks, micro_batch_of, free = placed
        # Every free rank becomes a group of size 1.
        unit_ranks = [r for f in free for r in f]
        ranks += [(r,) for r in unit_ranks]
        micro_batch_of = np.concatenate([micro_batch_of, np.repeat(np.arange(n_micro_batches), [len(f) for f in free])])
        short_idx = self._short_first[~is_long[self._short_first]]
        placed_short = self._lpt(ranks, g_size, long_idx, long_group, g_tokens, short_idx, slack)
        if placed_short is None:
            return None
        short_group, classes, times = placed_short
        sample_group = np.empty(rows.shape[0], dtype=np.int64)
        sample_group[long_idx] = long_group
        sample_group[short_idx] = short_group
        return Packing(ranks=ranks, micro_batch=micro_batch_of, sample_group=sample_group, classes=classes, times=times)

    def _pack_raising(self, target: float, n_micro_batches: int) -> Packing | None:
        """:meth:`pack` at ``target``, raised while the packing does not fit: the fluid count ignores
        that samples of one size may not share a group within the target, so the groups it opens can
        need more ranks than a micro-batch has; a longer target lets them share."""
        factor = 1.0
        while factor <= RETRY_LIMIT:
            packing = self.pack(target * factor, n_micro_batches)
            if packing is not None:
                return packing
            factor = RETRY_FACTOR if factor == 1.0 else factor * RETRY_GROWTH
        return None

    def pack_memory_first(self, n_micro_batches: int, spread: bool = True) -> Assignment | None:
        """Fallback when the time-targeted packing does not fit: best-fit-decreasing by tokens.

        Each sample joins the group (any micro-batch) with the least memory room that still holds it,
        or opens a group of its memory-minimal size in the micro-batch with the most free ranks
        (``spread``: every one of the ``n_micro_batches`` is opened first, so the longest samples are
        spread over them; else a micro-batch is opened only when no open one has the free ranks for the
        new group, so one pass finds its own count, at most ``n_micro_batches``).
        Time is left to the local search. The placement loop is compiled
        (:mod:`optimizer.heuristic.memory_first_kernels`).
        """
        n = self.lengths.shape[0]
        group_of = np.empty(n, dtype=np.int64)
        sizes = np.empty(n, dtype=np.int64)  # per group (at most one per sample): its size index
        places = np.empty(n, dtype=np.int64)  # per group: its micro-batch
        n_groups, opened = memory_first(
            self._longest_first,
            self.lengths,
            self.min_j,
            self.t.degrees,
            self.capacity,
            self.t.n_ranks,
            n_micro_batches,
            spread,
            group_of,
            sizes,
            places,
        )
        if n_groups < 0:
            return None
        # Each group's samples in placement order (longest first),
        # the groups of a micro-batch in the order they were opened.
        placed = group_of[self._longest_first]
        by_group = self._longest_first[np.argsort(placed, kind="stable")].tolist()
        ends = np.cumsum(np.bincount(placed, minlength=n_groups)).tolist()
        degree_of = self.t.degrees[sizes[:n_groups]].tolist()
        members: list[list[int]] = [[] for _ in range(opened)]
        for k, micro_batch in enumerate(places[:n_groups].tolist()):
            members[micro_batch].append(k)
        mbs: list[list[tuple[list[int] | tuple[int, ...], list[int] | tuple[int, ...]]]] = [[] for _ in range(opened)]
        layouts: dict[
            tuple[int, ...], list[tuple[int, ...]] | None
        ] = {}  # many micro-batches hold the same group sizes
        for micro_batch in range(opened):
            key = tuple(degree_of[k] for k in members[micro_batch])
            if key not in layouts:
                layouts[key] = place_groups(key, self.t.node_ranges)[0]
            ranks = layouts[key]
            if ranks is None:
                return None
            for k, rs in zip(members[micro_batch], ranks, strict=True):
                mbs[micro_batch].append((rs, by_group[ends[k - 1] if k else 0 : ends[k]]))
        return Assignment.of(mbs)

    @cached_property
    def _short_first(self) -> np.ndarray:
        """Every sample in the order the short ones are placed: longest in tokens first (then a group
        without memory room for one sample waits until the samples have become short enough, and never
        comes back for a longer one), then slowest on one rank, then by index; sorted once per planner."""
        rows = np.arange(self.lengths.shape[0])
        return np.lexsort((rows, -self.cost[:, 0], -self.lengths))

    @cached_property
    def _longest_first(self) -> np.ndarray:
        """The samples longest first, ties by index (the memory-first packing's order)."""
        return np.lexsort((np.arange(self.lengths.shape[0]), -self.lengths))

    def _fewest_memory_first(self, counts: list[int], deadline: float | None = None) -> Assignment | None:
        """The memory-first packing with the fewest micro-batches of ``counts``, found in a few tries.

        First one pass that opens micro-batches as it needs them (``spread=False``); it bounds the search
        to fewer micro-batches than it used. Then the spread packings (``spread=True``): the first four
        counts in order, then ever further (6, 10, 18, ... places in) until one packs, then the gap before
        it is halved (a count that packs leaves room at the next ones, so this is the count a scan in order
        finds; that scan took 33 tries of 30 ms on 8 ranks x 1,754 samples). Should no count tried so pack,
        every count not tried yet is tried in order: no packing is missed. The faster of the spread
        packing found and the first pass's is returned: at one count, either can be the faster (the bench
        grid's long-text batch of seed 2 on 64 ranks under ``stress-group-constant``, group-size floor 2: both
        6 micro-batches, 35.3 s by the first pass, 42.6 s spread).

        With a ``deadline`` the search stops there with the fewest micro-batches packed so far (each try
        costs a pass over the batch: 14 ms at 6 ranks x 1,362 samples, and such a batch needed 13 tries)."""
        tried: dict[int, Assignment | None] = {}
        quick = self.pack_memory_first(counts[-1], spread=False)
        if quick is not None:
            used = len(quick.micro_batches)
            counts = [c for c in counts if c < used]
            if not counts or (deadline is not None and time.perf_counter() > deadline):
                return quick

        def at(k: int) -> Assignment | None:
            if k not in tried:
                tried[k] = self.pack_memory_first(counts[k])
            return tried[k]

        def late() -> bool:
            return quick is not None and deadline is not None and time.perf_counter() > deadline

        failed, k, step = -1, 0, 1
        while k < len(counts) and at(k) is None:
            if late():
                return quick
            failed, k = k, k + step
            step *= 2 if k > 3 else 1
        if k >= len(counts):
            if quick is not None:
                return quick
            return next(
                (packing for k in range(len(counts)) if k not in tried and (packing := at(k)) is not None), None
            )
        while k - failed > 1 and not late():
            mid = (failed + k) // 2
            if at(mid) is None:
                failed = mid
            else:
                k = mid
        found = at(k)
        if quick is None or found is None:
            return found or quick
        return min((found, quick), key=lambda a: assignment_step_time(self.t, a))

    def _place(
        self, g_size: np.ndarray, g_load: np.ndarray, n_micro_batches: int
    ) -> tuple[list[tuple[int, ...]], np.ndarray, list[list[int]]] | None:
        """Spread groups over micro-batches (largest first, then most loaded, to the emptiest micro-batch) and
        place them on nodes (:mod:`optimizer.heuristic.placement`).

        Returns each group's ranks and micro-batch and each micro-batch's free ranks, or None if they do not fit."""
        n_ranks = self.t.n_ranks
        sizes = self.t.degrees[g_size]
        if int(sizes.sum()) > n_micro_batches * n_ranks:
            return None
        n_groups = sizes.shape[0]
        order = np.lexsort((np.arange(n_groups), -g_load, -sizes))
        micro_batch_of = np.empty(n_groups, dtype=np.int64)
        if not spread_over_micro_batches(sizes, order, n_micro_batches, n_ranks, micro_batch_of):
            return None
        ranks: list[tuple[int, ...]] = [()] * n_groups
        free_ranks = []
        for micro_batch in range(n_micro_batches):
            ks = order[micro_batch_of[order] == micro_batch].tolist()
            placed, free = place_groups(sizes[ks], self.t.node_ranges)
            if placed is None:
                return None
            for k, rs in zip(ks, placed, strict=True):
                ranks[k] = rs
            free_ranks.append(free)
        return ranks, micro_batch_of, free_ranks

    def _lpt(
        self,
        ranks: list[tuple[int, ...]],
        g_size: np.ndarray,
        long_idx: np.ndarray,
        long_group: np.ndarray,
        g_tokens: np.ndarray,
        order: np.ndarray,
        slack: float,
    ) -> tuple[np.ndarray, GroupClasses, np.ndarray] | None:
        """Longest first, each sample to the group where it would finish earliest (memory permitting);
        see :mod:`optimizer.heuristic.lpt_kernels`. Groups are the packed ones (holding ``long_idx``), then one per
        free rank. Returns the group of each sample of ``order``, or None when one fits nowhere."""
        n_long = g_size.shape[0]
        classes = classify(self.t, ranks)
        keys, group_class = classes.keys, classes.group_class
        times = class_times(self.t, keys)
        # A group's real load (its span may differ from the packing's assumption), summed in packing order.
        load = np.bincount(long_group, weights=times[long_idx, group_class[long_group]], minlength=len(ranks))
        if self.t.varying_group_constant:  # each group starts with its messages' time (b is every group's)
            load = load + np.array([self.t.group_constants(intra)[j] - self.b for j, intra, _ in keys])[group_class]
        tokens = np.zeros(len(ranks))
        tokens[:n_long] = g_tokens
        class_limit = np.array([self.capacity * self.degrees[j] for j, _, _ in keys], dtype=np.float64)
        class_unit = np.array([j == 0 for j, _, _ in keys], dtype=np.bool_)
        placed = np.empty(order.shape[0], dtype=np.int64)
        if not lpt_place(
            order, self.lengths, times, group_class, load, tokens, class_limit, class_unit, float(slack), placed
        ):
            return None
        return placed, classes, times

    # -- the whole plan ---------------------------------------------------------------------
    def plan(self, deadline: float | None = None, rounds: int = FAST_ROUNDS) -> Assignment:
        """Pack for the fewest micro-batches memory allows, more only while that may pay off; polish the best.
        Counts whose memory would be filled beyond MAX_FILL come last (while the deadline allows)."""
        best: LocalSearch | None = None
        best_time = math.inf
        floor = math.inf
        counts = self.micro_batch_counts()
        full: list[int] = []

        def attempt(n_micro_batches: int, target: float) -> None:
            nonlocal best, best_time
            candidates = [self._pack_raising(target, n_micro_batches)]
            if self.lengths.shape[0] <= SMALL_BATCH:
                # Few samples: granularity matters more than the fluid target; coarser targets
                # choose other group sizes and are cheap to try. Each is polished before comparing.
                candidates += [self.pack(target * f, n_micro_batches) for f in SMALL_BATCH_TARGETS]
            for candidate in candidates:
                if candidate is None:
                    continue
                search = LocalSearch.from_packing(self.t, candidate, max_rounds=rounds)
                if len(candidates) > 1:
                    search.run(deadline)
                step = search.step_time()
                if step < best_time - 1e-12:
                    best, best_time = search, step

        for n_micro_batches in counts:
            if self.memory_fill(n_micro_batches) > MAX_FILL and n_micro_batches != counts[-1]:
                full.append(n_micro_batches)
                continue
            target = self.target_time(n_micro_batches)
            estimate = n_micro_batches * target  # the fluid optimum for this count
            if estimate >= best_time:
                if n_micro_batches >= counts[0] + EXTRA_MICRO_BATCHES and best is not None:
                    break  # the fluid estimate grows with the count from here on (b per micro-batch)
                continue
            if best is None and n_micro_batches > counts[0] + EXTRA_MICRO_BATCHES + MAX_EMPTY_COUNTS:
                break  # no count has packed so far: the memory-first packing below takes over
            floor = min(floor, estimate)
            count_start = time.perf_counter()
            attempt(n_micro_batches, target)
            # Another count costs about what this one did: it starts only if it would end by the deadline.
            now = time.perf_counter()
            if best_time <= floor * (1 + GOOD_ENOUGH) or (
                deadline is not None and now + (now - count_start) > deadline
            ):
                break
        for n_micro_batches in full:
            if best_time <= floor * (1 + GOOD_ENOUGH) or (deadline is not None and time.perf_counter() > deadline):
                break
            target = self.target_time(n_micro_batches)
            if n_micro_batches * target < best_time:
                attempt(n_micro_batches, target)
        if best is None:
            fallback = self._fewest_memory_first(counts, deadline)
            if fallback is not None:
                best = LocalSearch(self.t, fallback, max_rounds=rounds)
        if best is None:
            raise InfeasibleError(
                "no packing of the batch fits the domain's memory",
                field="batch.samples",
                hint="allow more micro-batches (options.max_micro_batches), add ranks, or send a smaller batch.",
            )
        best.run(deadline)
        return best.assignment()
