"""Local search on an assignment: lower the step time by moving work out of slow groups.

The step time is the sum over micro-batches (micro-batches) of the slowest group's time. Each round takes
one micro-batch's slowest group g and evaluates:

- *move*: one sample of g to another group with memory room, in any micro-batch (on large problems, among
  the groups with the most time slack or memory room);
- *swap*: one sample of g for one sample of such a group;
- *merge*: g joins the group on the rank just below or above it (idle or busy) into one larger
  group, when that size is allowed (this is how a slow group grows over idle ranks).

The best candidate that lowers the step time is applied; rounds go on until no micro-batch improves, a
round limit or the deadline. The exact change of the step time is used, with each micro-batch's largest
three group times kept to know a micro-batch's new maximum without rescanning it. Moves and swaps are
evaluated by compiled loops (:mod:`optimizer.heuristic.search_kernels`); merges, which create new group
classes, here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import chain, pairwise

import numpy as np

from optimizer.costs.group_classes import ClassKey, GroupClasses, class_times, classify
from optimizer.costs.tables import CostTables
from optimizer.heuristic.search_kernels import EPS, best_move, micro_batch_tops, refresh_group
from optimizer.plan.records import Assignment, FlatGroups

POLISH_ROUNDS = 200
"""Rounds of the search polishing a whole plan that was built in parts (within the deadline)."""
SLACK_CANDIDATES = 48
"""On large problems a round looks at this many groups with the most time slack ..."""
ROOM_CANDIDATES = 16
"""... and this many with the most memory room (moves and swaps go only there)."""


@dataclass(frozen=True)
class Packing:
    """A packing as arrays, as the heuristic builds it: every rank of every micro-batch is in one group.

    ``ranks[g]`` and ``micro-batch[g]`` describe group g; ``sample_group[i]`` is sample i's group.
    """

    ranks: list[tuple[int, ...]]
    micro_batch: np.ndarray
    sample_group: np.ndarray
    classes: GroupClasses | None = None
    """The groups' classes, when the packer already knows them ..."""
    times: np.ndarray | None = None
    """... and the [samples x classes] times of those classes."""


class LocalSearch:
    def __init__(self, tables: CostTables, assignment: Assignment, max_rounds: int = 2000) -> None:
        """The search over ``assignment``: per micro-batch its groups in order, then each idle rank as
        an empty group of size 1 (moves can fill them and "grow" can absorb them)."""
        flat = assignment.flat
        n_micro_batches, n_ranks = len(assignment.micro_batches), tables.n_ranks
        used = np.zeros((n_micro_batches, n_ranks), dtype=bool)
        used[np.repeat(flat.micro_batch, flat.size), flat.ranks] = True
        idle_mb, idle_rank = np.nonzero(~used)  # by micro-batch, then rank
        busy_count = np.bincount(flat.micro_batch, minlength=n_micro_batches)
        idle_count = np.bincount(idle_mb, minlength=n_micro_batches)
        offset = np.zeros(n_micro_batches + 1, dtype=np.int64)
        np.cumsum(busy_count + idle_count, out=offset[1:])
        busy_start = np.zeros(n_micro_batches + 1, dtype=np.int64)
        np.cumsum(busy_count, out=busy_start[1:])
        idle_start = np.zeros(n_micro_batches + 1, dtype=np.int64)
        np.cumsum(idle_count, out=idle_start[1:])
        # The groups of a micro-batch are consecutive in ``flat``:
        # group k is the (k - busy_start[m])-th of its micro-batch m.
        busy_id = offset[flat.micro_batch] + np.arange(flat.micro_batch.shape[0]) - busy_start[flat.micro_batch]
        s_group = np.empty(tables.n_samples, dtype=np.int64)
        s_group[flat.samples] = np.repeat(busy_id, flat.count)
        busy_ranks = [tuple(group_ranks) for mb in assignment.micro_batches for group_ranks, _ in mb]
        idle_ranks = [(r,) for r in idle_rank.tolist()]
        bs, ids = busy_start.tolist(), idle_start.tolist()
        ranks: list[tuple[int, ...]] = []
        for m in range(n_micro_batches):
            ranks += busy_ranks[bs[m] : bs[m + 1]]
            ranks += idle_ranks[ids[m] : ids[m + 1]]
        group_micro_batch = np.repeat(np.arange(n_micro_batches), busy_count + idle_count)
        self._setup(tables, ranks, group_micro_batch, s_group, n_micro_batches, max_rounds)

    @classmethod
    def from_packing(cls, tables: CostTables, packing: Packing, max_rounds: int = 2000) -> LocalSearch:
        """The search over a packing: the same groups, in the order :class:`Assignment` would give
        them (per micro-batch with samples: its busy groups, then its idle ranks), without building one."""
        n_groups = len(packing.ranks)
        busy = np.bincount(packing.sample_group, minlength=n_groups) > 0
        kept = np.bincount(packing.micro_batch[busy], minlength=int(packing.micro_batch.max()) + 1) > 0
        new_micro_batch = np.cumsum(kept) - 1
        keep = kept[packing.micro_batch]
        order = np.lexsort((np.arange(n_groups), ~busy, new_micro_batch[packing.micro_batch]))
        order = order[keep[order]]
        renumber = np.full(n_groups, -1, dtype=np.int64)
        renumber[order] = np.arange(order.shape[0])
        ranks = [packing.ranks[g] for g in order.tolist()]
        search = cls.__new__(cls)
        known = None
        if packing.classes is not None and packing.times is not None:
            c = packing.classes
            known = (GroupClasses(c.keys, c.group_class[order], c.capacity[order]), packing.times)
        search._setup(
            tables,
            ranks,
            new_micro_batch[packing.micro_batch[order]],
            renumber[packing.sample_group],
            int(kept.sum()),
            max_rounds,
            known,
        )
        return search

    def _setup(
        self,
        tables: CostTables,
        ranks: list[tuple[int, ...]],
        group_micro_batch: np.ndarray,
        s_group: np.ndarray,
        n_micro_batches: int,
        max_rounds: int,
        known: tuple[GroupClasses, np.ndarray] | None = None,
    ) -> None:
        self.t = tables
        self.b = tables.group_constant
        self.max_rounds = max_rounds
        self.lengths = tables.lengths.astype(np.float64)
        classes = known[0] if known is not None else classify(tables, ranks)
        self.class_keys: list[ClassKey] = list(classes.keys)
        self._class_index = {key: k for k, key in enumerate(self.class_keys)}
        self.times = known[1] if known is not None else class_times(tables, self.class_keys)
        self.class_b = np.array([self._constant(key) for key in self.class_keys], dtype=np.float64)
        n_groups = len(ranks)
        sizes = np.fromiter(map(len, ranks), dtype=np.int64, count=n_groups)
        flat = np.fromiter(chain.from_iterable(ranks), dtype=np.int64, count=int(sizes.sum()))
        self.n_micro_batches = n_micro_batches
        self.rank_group = np.full((n_micro_batches, tables.n_ranks), -1, dtype=np.int64)
        self.rank_group[np.repeat(group_micro_batch, sizes), flat] = np.repeat(np.arange(n_groups), sizes)
        self.g_ranks = ranks
        self.g_micro_batch = group_micro_batch
        self.g_class = classes.group_class.copy()
        self.g_limit = classes.capacity * sizes
        self.g_alive = np.ones(n_groups, dtype=bool)
        self.s_group = s_group
        self.top = np.zeros((n_micro_batches, 3))
        self.top_id = np.full((n_micro_batches, 2), -1, dtype=np.int64)
        self._refresh()

    # -- bookkeeping ------------------------------------------------------------------------
    def _class(self, key: ClassKey) -> int:
        k = self._class_index.get(key)
        if k is None:
            k = len(self.class_keys)
            self.class_keys.append(key)
            self.times = np.hstack([self.times, class_times(self.t, [key])])
            self.class_b = np.append(self.class_b, self._constant(key))
            self._class_index[key] = k
        return k

    def _constant(self, key: ClassKey) -> float:
        """The group constant of a class: b, plus its messages' time when the profile has ``comm.group_messages``."""
        j, intra, _ = key
        return float(self.t.group_constants(intra)[j])

    def _refresh(self) -> None:
        n_groups = len(self.g_ranks)
        self.s_cost = self.times[np.arange(self.t.n_samples), self.g_class[self.s_group]]
        loads = np.bincount(self.s_group, weights=self.s_cost, minlength=n_groups)
        counts = np.bincount(self.s_group, minlength=n_groups)
        self.g_time = np.where(counts > 0, loads + self.class_b[self.g_class], 0.0)
        self.g_tokens = np.bincount(self.s_group, weights=self.lengths, minlength=n_groups)

    def _micro_batch_tops(self) -> None:
        """Refresh each micro-batch's three largest group times and the groups of the first two."""
        micro_batch_tops(self.g_time, self.g_micro_batch, self.g_alive, self.top, self.top_id)

    def step_time(self) -> float:
        self._micro_batch_tops()
        return float(self.top[:, 0].sum())

    def members(self, g: int) -> np.ndarray:
        return np.flatnonzero(self.s_group == g)

    # -- moves ------------------------------------------------------------------------------
    def _best_move(self, g: int) -> tuple[float, tuple]:
        """Best move or swap of one sample of g (see :func:`optimizer.heuristic.search_kernels.best_move`)."""
        delta, kind, a, x = best_move(
            g,
            self.top,
            self.top_id,
            self.g_time,
            self.g_micro_batch,
            self.g_limit,
            self.g_tokens,
            self.g_alive,
            self.g_class,
            self.s_group,
            self.s_cost,
            self.lengths,
            self.times,
            self.class_b,
            SLACK_CANDIDATES,
            ROOM_CANDIDATES,
        )
        if kind == 0:
            return -EPS, ()
        return float(delta), ("move" if kind == 1 else "swap", int(a), int(x))

    def _best_merge(self, g: int) -> tuple[float, tuple]:
        """Merge g with the group on the rank just below or above it (idle or not), when the size is allowed."""
        best: tuple[float, tuple] = (-EPS, ())
        ranks = self.g_ranks[g]
        lo, hi = ranks[0], ranks[-1]
        if hi - lo + 1 != len(ranks) or self.g_time[g] == 0.0:
            return best
        m = int(self.g_micro_batch[g])
        owner = self.rank_group[m]
        top, top_id = self.top, self.top_id
        mine = None
        for r in (hi + 1, lo - 1):
            if not 0 <= r < len(owner):
                continue
            h = int(owner[r])
            if h < 0 or h == g:
                continue
            other = self.g_ranks[h]
            new_ranks = tuple(sorted(ranks + other))
            if new_ranks[-1] - new_ranks[0] + 1 != len(new_ranks):
                continue
            j_new = self.t.degree_index.get(len(new_ranks))
            if j_new is None:
                continue
            intra, speed, cap = self.t.group_span(new_ranks)
            if self.g_tokens[g] + self.g_tokens[h] > cap * len(new_ranks):
                continue
            if mine is None:
                mine = self.members(g)
            members = np.concatenate([mine, self.members(h)]) if self.g_time[h] > 0 else mine
            col = self.t.time_matrix(intra, speed)[:, j_new]
            new_t = self._constant((j_new, intra, speed)) + float(col[members].sum())
            rest = top[m, 1] if top_id[m, 1] != h else top[m, 2]
            delta = max(rest, new_t) - top[m, 0]
            if delta < best[0]:
                best = (delta, ("merge", g, h, new_ranks, (j_new, intra, speed), cap))
        return best

    def _apply(self, move: tuple) -> None:
        kind = move[0]
        if kind == "move":
            _, a, h = move
            g = int(self.s_group[a])
            self.s_group[a] = h
            self._update_groups([g, h])
        elif kind == "swap":
            _, a, c = move
            g, h = int(self.s_group[a]), int(self.s_group[c])
            self.s_group[a], self.s_group[c] = h, g
            self._update_groups([g, h])
        else:
            _, g, h, new_ranks, key, cap = move
            self.s_group[self.s_group == h] = g
            self.g_alive[h] = False
            self.g_time[h] = 0.0
            self.g_tokens[h] = 0.0
            self.g_ranks[h] = ()
            self.g_ranks[g] = new_ranks
            self.rank_group[int(self.g_micro_batch[g])][list(new_ranks)] = g
            self.g_class[g] = self._class(key)
            self.g_limit[g] = cap * len(new_ranks)
            self._update_groups([g])

    def _update_groups(self, gs: list[int]) -> None:
        for g in gs:
            refresh_group(
                g,
                self.s_group,
                self.s_cost,
                self.lengths,
                self.times[:, self.g_class[g]],
                float(self.class_b[self.g_class[g]]),
                self.g_time,
                self.g_tokens,
            )

    # -- driver -----------------------------------------------------------------------------
    def run(self, deadline: float | None = None) -> None:
        stale = 0
        rounds = 0
        m = 0
        while stale < self.n_micro_batches and rounds < self.max_rounds:
            if deadline is not None and time.perf_counter() > deadline:
                break
            rounds += 1
            self._micro_batch_tops()
            g = int(self.top_id[m, 0])
            improved = False
            if g >= 0 and self.g_time[g] > 0.0:  # a micro-batch whose groups are all empty has nothing to improve
                gain, move = self._best_move(g)
                gain2, move2 = self._best_merge(g)
                if gain2 < gain:
                    gain, move = gain2, move2
                if move:
                    self._apply(move)
                    improved = True
            if improved:
                stale = 0
            else:
                stale += 1
                m = (m + 1) % self.n_micro_batches
        self.rounds = rounds

    def assignment(self) -> Assignment:
        """The current groups with samples, micro-batch by micro-batch, each group's samples ascending
        (with its flat arrays, :attr:`Assignment.flat`, made from the search's own)."""
        if self.s_group.shape[0] == 0:
            return Assignment(())
        order = np.argsort(self.s_group, kind="stable")  # samples by group, ascending within one
        groups = self.s_group[order]
        starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
        count = np.diff(np.r_[starts, groups.shape[0]])
        busy = groups[starts]  # the groups with samples, ascending
        mb_of = self.g_micro_batch[busy]
        by_micro_batch = np.argsort(mb_of, kind="stable")  # micro-batch by micro-batch, ascending ids within
        busy, count, starts, mb_of = (
            busy[by_micro_batch],
            count[by_micro_batch],
            starts[by_micro_batch],
            mb_of[by_micro_batch],
        )
        ends = np.cumsum(count)
        samples = order[np.repeat(starts - (ends - count), count) + np.arange(groups.shape[0])]
        micro_batch = np.cumsum(np.r_[True, mb_of[1:] != mb_of[:-1]]) - 1  # empty micro-batches are dropped
        ranks = [self.g_ranks[g] for g in busy.tolist()]
        flat = FlatGroups.of(micro_batch, ranks, samples, count)
        indices = tuple(samples.tolist())
        bounds = np.r_[0, ends].tolist()
        pairs = [(r, indices[a:b]) for r, (a, b) in zip(ranks, pairwise(bounds), strict=True)]
        cuts = np.r_[0, np.flatnonzero(micro_batch[1:] != micro_batch[:-1]) + 1, len(pairs)].tolist()
        return Assignment.with_flat(tuple(tuple(pairs[a:b]) for a, b in pairwise(cuts)), flat)
