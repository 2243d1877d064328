"""The default planner: polynomial time, memory-aware, topology-aware.

Outline (M micro-batches are treated as M layers of the domain; a group lives in one layer):

1. Micro-batch count. M starts at the least count that memory allows (total tokens over the
   capacity of the domain) and goes up only while that pays off (a few counts are tried).
2. Target time. For a per-layer target S, each sample takes the smallest allowed group size that
   holds it in memory and finishes it within S (its *degree*). A fluid count of the rank-seconds
   these degrees need, sum_i d_i t_i(d_i) / (S - b), must fit the M N ranks; S is found by
   bisection, and a few targets just above it are tried.
3. Packing. Samples with degree >= 2 are packed best-fit-decreasing into groups of their degree
   (time within S, tokens within capacity); the groups are spread over the layers and placed onto
   nodes (:mod:`optimizer.placement`); every rank left over becomes a group of size 1.
   The remaining short samples go, longest first, to the group where they finish earliest
   (LPT on related machines), filling the slack of the long groups as well.
4. Improvement (:mod:`optimizer.local_search`): moves and swaps of samples out of each layer's
   slowest group, and growing a slow group over idle neighbouring ranks, while the step time falls.

Everything is deterministic for a given input (ties break on index).
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from optimizer.costs import CostTables
from optimizer.errors import InfeasibleError
from optimizer.local_search import LocalSearch
from optimizer.lpt import lpt_place
from optimizer.placement import place_groups
from optimizer.plan import Assignment

EXTRA_MICRO_BATCHES = 2
"""Micro-batch counts tried beyond the least that memory allows."""
BEST_FIT_PROBES = 8
"""Groups a long sample tries (fullest first) before it opens a new one."""
FAST_ROUNDS = 12
"""Local-search rounds of the fast heuristic; :func:`polish` continues with a deadline."""
GOOD_ENOUGH = 0.03
"""Stop trying more micro-batches once within this fraction of the fluid optimum."""
RETRY_FACTOR = 1.05
"""Target raised by this factor when a packing does not fit."""
SMALL_BATCH = 64
"""Batches up to this many samples also try the coarser targets below."""
SMALL_BATCH_TARGETS = (1.25, 1.6, 2.2)
"""Factors of the target tried for small batches."""
MAX_FILL = 0.85
"""A micro-batch count whose memory would be filled beyond this share is skipped when a larger count is allowed."""


@dataclass
class _Group:
    degree_index: int
    samples: list[int] = field(default_factory=list)
    load: float = 0.0
    tokens: float = 0.0
    ranks: tuple[int, ...] = ()
    layer: int = -1


class HeuristicPlanner:
    """Plans one batch; build once per problem, call :meth:`plan`."""

    def __init__(self, tables: CostTables) -> None:
        self.t = tables
        self.b = tables.group_constant
        self.capacity = float(tables.rank_capacity.min())
        self.degrees = [int(d) for d in tables.degrees]
        self.node_size = tables.node_size
        speed = float(tables.rank_speed.min())
        intra = tables.time_matrix(True, speed)
        inter = tables.time_matrix(False, speed)
        fits = (tables.degrees <= self.node_size)[None, :]
        self.cost = np.where(fits, intra, inter)  # [n, D] time on a well-placed group of each size
        self.lengths = tables.lengths.astype(np.float64)
        self.min_j = self._min_degree_index()
        self.total_tokens = float(self.lengths.sum())

    def _min_degree_index(self) -> np.ndarray:
        fits = self.lengths[:, None] <= self.capacity * self.t.degrees[None, :]
        if not np.all(fits.any(axis=1)):
            i = int(np.argmin(fits.any(axis=1)))
            s = self.t.problem.batch.samples[i]
            need = math.ceil(s.length / self.capacity)
            raise InfeasibleError(
                f"sample {s.id!r} ({s.length} tokens) needs a group of {need} ranks at {self.capacity:.0f} tokens per rank, above the largest allowed size {self.degrees[-1]}",
                field="batch.samples",
                hint=f"raise options.max_degree to >= {need}, add ranks, or shorten the sample.",
            )
        return fits.argmax(axis=1)

    # -- 1. micro-batch counts --------------------------------------------------------------
    def micro_batch_counts(self) -> list[int]:
        n_ranks = self.t.n_ranks
        least = max(1, math.ceil(self.total_tokens / (self.capacity * n_ranks) - 1e-12))
        most = self.t.problem.options.max_micro_batches
        if least > most:
            raise InfeasibleError(
                f"the batch holds {self.total_tokens:.0f} tokens but {most} micro-batches of {n_ranks} ranks x {self.capacity:.0f} tokens hold only {most * n_ranks * self.capacity:.0f}",
                field="options.max_micro_batches",
                hint=f"allow at least {least} micro-batches, add ranks, or send a smaller batch.",
            )
        return list(range(least, min(most, least + EXTRA_MICRO_BATCHES) + 1))

    # -- 2. target time ---------------------------------------------------------------------
    @cached_property
    def _at_min(self) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        """Each sample's time and rank-seconds on its memory-minimal size, their total, and the
        fastest size of each sample (for targets no size meets)."""
        rows = np.arange(self.cost.shape[0])
        t_min = self.cost[rows, self.min_j]
        area_min = self.t.degrees[self.min_j] * t_min
        allowed = np.arange(self.cost.shape[1])[None, :] >= self.min_j[:, None]
        fastest = np.where(allowed, self.cost, np.inf).argmin(axis=1)
        return t_min, area_min, float(area_min.sum()), fastest

    def degrees_for(self, target: float) -> np.ndarray:
        """Index of each sample's degree for a per-layer target time: the smallest size that holds
        it in memory and finishes it within the target (its fastest size if none does)."""
        t_min, _, _, fastest = self._at_min
        j = self.min_j.copy()
        late = np.flatnonzero(t_min + self.b > target)  # only these need a larger size than memory asks
        if late.size:
            cost = self.cost[late]
            ok = (cost + self.b <= target) & (np.arange(cost.shape[1])[None, :] >= self.min_j[late, None])
            has = ok.any(axis=1)
            j[late] = np.where(has, ok.argmax(axis=1), fastest[late])
        return j

    def fluid_ranks(self, target: float) -> float:
        t_min, area_min, total, _ = self._at_min
        late = np.flatnonzero(t_min + self.b > target)
        work = total
        if late.size:
            j = self.degrees_for(target)[late]
            work += float((self.t.degrees[j] * self.cost[late, j]).sum() - area_min[late].sum())
        return work / max(target - self.b, 1e-12)

    def target_time(self, layers: int) -> float:
        avail = layers * self.t.n_ranks
        rows = np.arange(self.cost.shape[0])
        lo = self.b + float(np.where(np.arange(self.cost.shape[1])[None, :] >= self.min_j[:, None], self.cost, np.inf).min(axis=1).max())
        if self.fluid_ranks(lo) <= avail:
            return lo
        hi = self.b + float(self.cost[rows, self.min_j].max()) + float((self.cost[rows, self.min_j] * self.t.degrees[self.min_j]).sum()) / avail
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
    def pack(self, target: float, layers: int) -> Assignment | None:
        t = self.t
        j_of = self.degrees_for(target)
        degs = t.degrees
        cost = self.cost
        cap = self.capacity
        slack = target - self.b
        rows = np.arange(j_of.shape[0])
        t_of = cost[rows, j_of]
        is_long = degs[j_of] >= 2
        # Long samples: largest size first, then longest time first (ties by index).
        long_idx = rows[is_long][np.lexsort((rows[is_long], -t_of[is_long], -j_of[is_long]))].tolist()
        times = t_of.tolist()
        lengths = self.lengths.tolist()
        sizes = degs.tolist()
        js = j_of.tolist()
        groups: list[_Group] = []
        # Per size: open groups as a sorted list of (load, group); best fit is the fullest group
        # whose load still leaves room for the sample's time (bisect), memory permitting.
        open_by_j: dict[int, list[tuple[float, int]]] = {}
        for i in long_idx:
            j = js[i]
            ti = times[i]
            li = lengths[i]
            limit = cap * sizes[j]
            loads = open_by_j.setdefault(j, [])
            k = bisect.bisect_right(loads, (slack - ti, math.inf)) - 1
            best = -1
            for _ in range(BEST_FIT_PROBES):
                if k < 0:
                    break
                g = loads[k][1]
                if groups[g].tokens + li <= limit:
                    best = g
                    del loads[k]
                    break
                k -= 1
            if best < 0:
                groups.append(_Group(j))
                best = len(groups) - 1
            grp = groups[best]
            grp.samples.append(i)
            grp.load += ti
            grp.tokens += li
            bisect.insort(loads, (grp.load, best))
        if not self._place(groups, layers):
            return None
        # Every free rank becomes a group of size 1.
        for layer, free in enumerate(self._free):
            for r in free:
                groups.append(_Group(0, ranks=(r,), layer=layer))
        short = rows[~is_long]
        # Longest (in tokens) first: then a group without memory room for one sample waits until the
        # samples have become short enough, and never comes back for a longer one.
        short_idx = short[np.lexsort((short, -cost[short, 0], -self.lengths[short]))].tolist()
        if not self._lpt(groups, short_idx, slack):
            return None
        mbs: list[list[tuple[tuple[int, ...], list[int]]]] = [[] for _ in range(layers)]
        for g in groups:
            mbs[g.layer].append((g.ranks, g.samples))
        return Assignment.of(mbs)

    def pack_memory_first(self, layers: int) -> Assignment | None:
        """Fallback when the time-targeted packing does not fit: best-fit-decreasing by tokens.

        Each sample joins the group (any layer) with the least memory room that still holds it,
        or opens a group of its memory-minimal size in the layer with the most free ranks.
        Time is left to the local search.
        """
        n_ranks = self.t.n_ranks
        free = [n_ranks] * layers
        groups: list[_Group] = []
        rooms: list[float] = []
        for i in sorted(range(self.lengths.shape[0]), key=lambda i: (-self.lengths[i], i)):
            li = float(self.lengths[i])
            best, best_room = -1, math.inf
            for g, room in enumerate(rooms):
                if li <= room < best_room:
                    best, best_room = g, room
            if best < 0:
                j = int(self.min_j[i])
                d = self.degrees[j]
                layer = max(range(layers), key=lambda m: (free[m], -m))
                if free[layer] >= d:
                    free[layer] -= d
                    groups.append(_Group(j, layer=layer))
                    rooms.append(self.capacity * d)
                    best = len(groups) - 1
                else:
                    best = self._enlarge_for(groups, rooms, free, li)
                    if best < 0:
                        return None
            groups[best].samples.append(i)
            rooms[best] -= li
        members: list[list[int]] = [[] for _ in range(layers)]
        for k, g in enumerate(groups):
            members[g.layer].append(k)
        mbs: list[list[tuple[tuple[int, ...], list[int]]]] = [[] for _ in range(layers)]
        for layer in range(layers):
            ranks, _ = place_groups([self.degrees[groups[k].degree_index] for k in members[layer]], self.t.node_ranges)
            if ranks is None:
                return None
            for k, rs in zip(members[layer], ranks, strict=True):
                mbs[layer].append((rs, groups[k].samples))
        return Assignment.of(mbs)

    def _enlarge_for(self, groups: list[_Group], rooms: list[float], free: list[int], li: float) -> int:
        """Grow the group that needs the fewest extra free ranks of its layer to also hold ``li`` tokens; -1 if none can."""
        best, best_extra = -1, None
        for g, grp in enumerate(groups):
            d = self.degrees[grp.degree_index]
            need = math.ceil((self.capacity * d - rooms[g] + li) / self.capacity - 1e-9)
            j = next((k for k in range(grp.degree_index, len(self.degrees)) if self.degrees[k] >= need), None)
            if j is None:
                continue
            extra = self.degrees[j] - d
            if extra <= free[grp.layer] and (best_extra is None or extra < best_extra):
                best, best_extra = g, extra
        if best >= 0:
            grp = groups[best]
            d = self.degrees[grp.degree_index]
            j = next(k for k in range(grp.degree_index, len(self.degrees)) if self.degrees[k] - d == best_extra)
            free[grp.layer] -= best_extra
            rooms[best] += self.capacity * best_extra
            grp.degree_index = j
        return best

    def _place(self, groups: list[_Group], layers: int) -> bool:
        """Spread groups over layers (largest first, to the emptiest layer) and place them on nodes."""
        n_ranks = self.t.n_ranks
        if sum(self.degrees[g.degree_index] for g in groups) > layers * n_ranks:
            return False
        used = [0] * layers
        members: list[list[int]] = [[] for _ in range(layers)]
        for k in sorted(range(len(groups)), key=lambda k: (-self.degrees[groups[k].degree_index], -groups[k].load, k)):
            d = self.degrees[groups[k].degree_index]
            layer = min(range(layers), key=lambda m: (used[m] + d > n_ranks, used[m], m))
            if used[layer] + d > n_ranks:
                return False
            used[layer] += d
            members[layer].append(k)
            groups[k].layer = layer
        self._free = []
        for layer in range(layers):
            ks = members[layer]
            ranks, free = place_groups([self.degrees[groups[k].degree_index] for k in ks], self.t.node_ranges)
            if ranks is None:
                return False
            for k, rs in zip(ks, ranks, strict=True):
                groups[k].ranks = rs
            self._free.append(free)
        return True

    def _lpt(self, groups: list[_Group], order: list[int], slack: float) -> bool:
        """Longest first, each sample to the group where it would finish earliest (memory permitting);
        see :mod:`optimizer.lpt`."""
        t = self.t
        keys: dict[tuple[int, bool, float], int] = {}
        group_class = np.empty(len(groups), dtype=np.int64)
        for g, grp in enumerate(groups):
            intra, speed, _ = t.group_span(grp.ranks)
            key = (grp.degree_index, intra, speed)
            c = keys.get(key)
            if c is None:
                c = keys[key] = len(keys)
            group_class[g] = c
        times = np.empty((self.lengths.shape[0], len(keys)))
        for (j, intra, speed), c in keys.items():
            times[:, c] = t.time_matrix(intra, speed)[:, j]
        load = np.zeros(len(groups))
        for g, grp in enumerate(groups):  # a group's real load (its span may differ from the packing's assumption)
            if grp.samples:
                load[g] = float(times[grp.samples, group_class[g]].sum())
        tokens = np.array([grp.tokens for grp in groups], dtype=np.float64)
        class_limit = np.array([self.capacity * self.degrees[j] for j, _, _ in keys], dtype=np.float64)
        class_unit = np.array([j == 0 for j, _, _ in keys], dtype=np.bool_)
        order_arr = np.asarray(order, dtype=np.int64)
        placed = np.empty(order_arr.shape[0], dtype=np.int64)
        if not lpt_place(order_arr, self.lengths, times, group_class, load, tokens, class_limit, class_unit, float(slack), placed):
            return False
        for i, g in zip(order, placed.tolist(), strict=True):
            groups[g].samples.append(i)
        for g, grp in enumerate(groups):
            grp.load = float(load[g])
            grp.tokens = float(tokens[g])
        return True

    # -- the whole plan ---------------------------------------------------------------------
    def plan(self, deadline: float | None = None, rounds: int = FAST_ROUNDS) -> Assignment:
        """Pack for the fewest micro-batches memory allows, more only while that may pay off; polish the best."""
        best: LocalSearch | None = None
        best_time = math.inf
        floor = math.inf
        counts = self.micro_batch_counts()
        for layers in counts:
            fill = self.total_tokens / (layers * self.t.n_ranks * self.capacity)
            if fill > MAX_FILL and layers != counts[-1]:
                continue  # packings this full fail on fragmentation; the next count is the real candidate
            target = self.target_time(layers)
            estimate = layers * target  # the fluid optimum for this count
            if estimate >= best_time:
                continue
            floor = min(floor, estimate)
            # A packing that fails on memory fragmentation rarely succeeds a little higher up: one retry.
            candidates = [self.pack(target, layers) or self.pack(target * RETRY_FACTOR, layers)]
            if self.lengths.shape[0] <= SMALL_BATCH:
                # Few samples: granularity matters more than the fluid target; coarser targets
                # choose other group sizes and are cheap to try. Each is polished before comparing.
                candidates += [self.pack(target * f, layers) for f in SMALL_BATCH_TARGETS]
            for candidate in candidates:
                if candidate is None:
                    continue
                search = LocalSearch(self.t, candidate, max_rounds=rounds)
                if len(candidates) > 1:
                    search.run(deadline)
                step = search.step_time()
                if step < best_time - 1e-12:
                    best, best_time = search, step
            if best_time <= floor * (1 + GOOD_ENOUGH) or (deadline is not None and time.perf_counter() > deadline):
                break
        if best is None:
            for layers in counts:
                candidate = self.pack_memory_first(layers)
                if candidate is not None:
                    best = LocalSearch(self.t, candidate, max_rounds=rounds)
                    break
        if best is None:
            raise InfeasibleError(
                "no packing of the batch fits the domain's memory",
                field="batch.samples",
                hint="allow more micro-batches (options.max_micro_batches), add ranks, or send a smaller batch.",
            )
        best.run(deadline)
        return best.assignment()


def heuristic_plan(tables: CostTables, deadline: float | None = None) -> Assignment:
    return HeuristicPlanner(tables).plan(deadline)


def polish(tables: CostTables, assignment: Assignment, deadline: float, max_rounds: int = 100_000) -> Assignment:
    """Continue the local search on ``assignment`` until it converges or the deadline passes."""
    search = LocalSearch(tables, assignment, max_rounds=max_rounds)
    search.run(deadline)
    return search.assignment()
