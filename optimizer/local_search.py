"""Local search on an assignment: lower the step time by moving work out of slow groups.

The step time is the sum over micro-batches (layers) of the slowest group's time. Each round takes
one layer's slowest group g and evaluates, with vectorised arithmetic over all groups and samples:

- *move*: one sample of g to any group with memory room, in any layer;
- *swap*: one sample of g for one sample of another group;
- *merge*: g joins the group on the rank just below or above it (idle or busy) into one larger
  group, when that size is allowed (this is how a slow group grows over idle ranks).

The best candidate that lowers the step time is applied; rounds go on until no layer improves, a
round limit or the deadline. The exact change of the step time is used, with each layer's largest
three group times kept to know a layer's new maximum without rescanning it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from optimizer.costs import CostTables
from optimizer.plan import Assignment

EPS = 1e-12
SLACK_CANDIDATES = 48
"""On large problems a round looks at this many groups with the most time slack ..."""
ROOM_CANDIDATES = 16
"""... and this many with the most memory room (moves and swaps go only there)."""


@dataclass(frozen=True)
class Packing:
    """A packing as arrays, as the heuristic builds it: every rank of every layer is in one group.

    ``ranks[g]`` and ``layer[g]`` describe group g; ``sample_group[i]`` is sample i's group;
    ``sequence`` lists the samples in the order they joined their groups (member lists keep it).
    """

    ranks: list[tuple[int, ...]]
    layer: np.ndarray
    sample_group: np.ndarray
    sequence: np.ndarray


class LocalSearch:
    def __init__(self, tables: CostTables, assignment: Assignment, max_rounds: int = 2000) -> None:
        ranks: list[tuple[int, ...]] = []
        layers: list[int] = []
        members: list[list[int]] = []
        for m, mb in enumerate(assignment.micro_batches):
            used: set[int] = set()
            for r, s in mb:
                ranks.append(tuple(r))
                layers.append(m)
                members.append(list(s))
                used.update(r)
            # Idle ranks become empty groups of size 1: moves can fill them and "grow" can absorb them.
            for r in range(tables.n_ranks):
                if r not in used:
                    ranks.append((r,))
                    layers.append(m)
                    members.append([])
        s_group = np.empty(tables.n_samples, dtype=np.int64)
        for g, ss in enumerate(members):
            s_group[ss] = g
        self._setup(tables, ranks, np.asarray(layers, dtype=np.int64), members, s_group, len(assignment.micro_batches), max_rounds)

    @classmethod
    def from_packing(cls, tables: CostTables, packing: Packing, max_rounds: int = 2000) -> LocalSearch:
        """The search over a packing: the same groups, in the order :class:`Assignment` would give
        them (per layer with samples: its busy groups, then its idle ranks), without building one."""
        n_groups = len(packing.ranks)
        busy = np.bincount(packing.sample_group, minlength=n_groups) > 0
        kept = np.bincount(packing.layer[busy], minlength=int(packing.layer.max()) + 1) > 0
        new_layer = np.cumsum(kept) - 1
        keep = kept[packing.layer]
        order = np.lexsort((np.arange(n_groups), ~busy, new_layer[packing.layer]))
        order = order[keep[order]]
        renumber = np.full(n_groups, -1, dtype=np.int64)
        renumber[order] = np.arange(order.shape[0])
        s_group = renumber[packing.sample_group]
        seq = packing.sequence
        joined = seq[np.argsort(s_group[seq], kind="stable")].tolist()
        ends = np.cumsum(np.bincount(s_group, minlength=order.shape[0])).tolist()
        members = [joined[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        ranks = [packing.ranks[g] for g in order.tolist()]
        search = cls.__new__(cls)
        search._setup(tables, ranks, new_layer[packing.layer[order]], members, s_group, int(kept.sum()), max_rounds)
        return search

    def _setup(self, tables: CostTables, ranks: list[tuple[int, ...]], layers: np.ndarray, members: list[list[int]],
               s_group: np.ndarray, n_layers: int, max_rounds: int) -> None:
        self.t = tables
        self.b = tables.group_constant
        self.max_rounds = max_rounds
        self.lengths = tables.lengths.astype(np.float64)
        self._cols: np.ndarray | None = None
        self.class_keys: list[tuple[int, bool, float]] = []
        self.class_rows: list[np.ndarray] = []
        self._class_index: dict[tuple[int, bool, float], int] = {}
        n_groups = len(ranks)
        sizes = np.fromiter(map(len, ranks), dtype=np.int64, count=n_groups)
        first = np.fromiter((r[0] for r in ranks), dtype=np.int64, count=n_groups)
        classes = np.empty(n_groups, dtype=np.int64)
        limits = np.empty(n_groups, dtype=np.float64)
        unit = np.flatnonzero(sizes == 1)
        speed = tables.rank_speed[first[unit]]
        for value in np.unique(speed).tolist():
            classes[unit[speed == value]] = self._class((0, True, value))
        limits[unit] = tables.rank_capacity[first[unit]]
        self.n_layers = n_layers
        self.rank_group = np.full((n_layers, tables.n_ranks), -1, dtype=np.int64)
        self.rank_group[layers[unit], first[unit]] = unit
        for g in np.flatnonzero(sizes > 1).tolist():
            r = ranks[g]
            intra, sp, cap = tables.group_span(r)
            classes[g] = self._class((tables.degree_index[len(r)], intra, sp))
            limits[g] = cap * len(r)
            self.rank_group[layers[g], list(r)] = g
        self.g_ranks = ranks
        self.g_layer = layers
        self.g_class = classes
        self.g_limit = limits
        self.g_alive = np.ones(n_groups, dtype=bool)
        self.samples_of = members
        self.s_group = s_group
        self._refresh()

    # -- bookkeeping ------------------------------------------------------------------------
    def _class(self, key: tuple[int, bool, float]) -> int:
        k = self._class_index.get(key)
        if k is None:
            j, intra, speed = key
            k = len(self.class_keys)
            self.class_keys.append(key)
            self.class_rows.append(self.t.time_matrix(intra, speed)[:, j])
            self._class_index[key] = k
            self._cols = None
        return k

    @property
    def cols(self) -> np.ndarray:
        """[classes, samples]: each sample's time on a group of each class."""
        if self._cols is None:
            self._cols = np.vstack(self.class_rows)
        return self._cols

    def _refresh(self) -> None:
        n_groups = len(self.g_ranks)
        self.s_cost = self.cols[self.g_class[self.s_group], np.arange(self.t.n_samples)]
        loads = np.bincount(self.s_group, weights=self.s_cost, minlength=n_groups)
        counts = np.bincount(self.s_group, minlength=n_groups)
        self.g_time = np.where(counts > 0, loads + self.b, 0.0)
        self.g_tokens = np.bincount(self.s_group, weights=self.lengths, minlength=n_groups)

    def _layer_tops(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per layer: the largest time and its group, the second and third largest times and the second's group."""
        L = self.n_layers
        top1 = np.zeros(L)
        top2 = np.zeros(L)
        top3 = np.zeros(L)
        id1 = np.full(L, -1)
        id2 = np.full(L, -1)
        times = self.g_time
        for m in range(L):
            idx = np.flatnonzero((self.g_layer == m) & self.g_alive)
            tm = times[idx]
            if tm.size == 0:
                continue
            k = min(3, tm.size)
            part = np.argpartition(-tm, k - 1)[:k]
            part = part[np.argsort(-tm[part], kind="stable")]
            top1[m], id1[m] = tm[part[0]], idx[part[0]]
            if k > 1:
                top2[m], id2[m] = tm[part[1]], idx[part[1]]
            if k > 2:
                top3[m] = tm[part[2]]
        return top1, top2, top3, np.stack([id1, id2])

    def step_time(self) -> float:
        times = np.where(self.g_alive, self.g_time, 0.0)
        return float(sum(times[self.g_layer == m].max(initial=0.0) for m in range(self.n_layers)))

    # -- moves ------------------------------------------------------------------------------
    def _candidates(self, g: int, tops: tuple) -> np.ndarray:
        """Groups a sample of g may go to: all of them when few, else those with the most time
        slack below their layer's maximum and those with the most memory room."""
        alive = np.flatnonzero(self.g_alive)
        alive = alive[alive != g]
        if alive.size <= SLACK_CANDIDATES + ROOM_CANDIDATES:
            return alive
        slack = tops[0][self.g_layer[alive]] - self.g_time[alive]
        room = self.g_limit[alive] - self.g_tokens[alive]
        pick = np.union1d(np.argpartition(-slack, SLACK_CANDIDATES - 1)[:SLACK_CANDIDATES], np.argpartition(-room, ROOM_CANDIDATES - 1)[:ROOM_CANDIDATES])
        return alive[pick]

    def _best_move(self, g: int, tops: tuple) -> tuple[float, tuple]:
        """Best move or swap of one sample of g; arrays are [members x candidate groups] and
        [members x samples of the candidate groups]."""
        best: tuple[float, tuple] = (-EPS, ())
        members = np.asarray(self.samples_of[g], dtype=np.int64)
        if members.size == 0:
            return best
        tg = self.g_time[g]
        len_a = self.lengths[members][:, None]
        cost_a = self.s_cost[members][:, None]
        alive = self._candidates(g, tops)
        if alive.size:
            time_h = self.g_time[alive]
            base_h = np.where(time_h > 0, time_h, self.b)[None, :]
            room = (self.g_limit[alive] - self.g_tokens[alive])[None, :]
            new_tg = tg - cost_a if members.size > 1 else np.zeros_like(cost_a)
            new_th = base_h + self.cols[self.g_class[alive][None, :], members[:, None]]
            delta = self._delta(g, new_tg, new_th, self.g_layer[alive][None, :], alive[None, :], tops)
            delta = np.where(room >= len_a, delta, np.inf)
            k = int(np.argmin(delta))
            if delta.flat[k] < best[0]:
                a, h = divmod(k, alive.size)
                best = (float(delta.flat[k]), ("move", int(members[a]), int(alive[h])))
        others = np.asarray([c for h in alive.tolist() for c in self.samples_of[h]], dtype=np.int64)
        if others.size:
            h_of_c = self.s_group[others]
            len_c = self.lengths[others][None, :]
            room_h = (self.g_limit[h_of_c] - self.g_tokens[h_of_c])[None, :] + len_c
            room_g = self.g_limit[g] - self.g_tokens[g]
            cost_a_in_h = self.cols[self.g_class[h_of_c][None, :], members[:, None]]
            new_tg = tg - cost_a + self.cols[self.g_class[g], others][None, :]
            new_th = self.g_time[h_of_c][None, :] - self.s_cost[others][None, :] + cost_a_in_h
            ok = (room_h >= len_a) & (room_g + len_a >= len_c)
            delta = self._delta(g, new_tg, new_th, self.g_layer[h_of_c][None, :], h_of_c[None, :], tops)
            delta = np.where(ok, delta, np.inf)
            k = int(np.argmin(delta))
            if delta.flat[k] < best[0]:
                a, c = divmod(k, others.size)
                best = (float(delta.flat[k]), ("swap", int(members[a]), int(others[c])))
        return best

    def _delta(self, g: int, new_tg: np.ndarray, new_th: np.ndarray, h_layer: np.ndarray, h_ids: np.ndarray, tops: tuple) -> np.ndarray:
        """Change of the step time when g's time becomes new_tg and each h's becomes new_th (broadcasting)."""
        top1, top2, top3, ids = tops
        m = int(self.g_layer[g])
        same = h_layer == m
        ex_g = top2[m] if ids[0, m] == g else top1[m]
        other = np.where(ids[0, h_layer] == h_ids, top2[h_layer], top1[h_layer])
        delta_other = (np.maximum(ex_g, new_tg) - top1[m]) + (np.maximum(other, new_th) - top1[h_layer])
        if ids[0, m] == g:
            rest = np.where(ids[1, m] == h_ids, top3[m], top2[m])
        else:
            rest = np.where(ids[0, m] == h_ids, np.where(ids[1, m] == g, top3[m], top2[m]), top1[m])
        delta_same = np.maximum(np.maximum(rest, new_tg), new_th) - top1[m]
        return np.where(same, delta_same, delta_other)

    def _best_merge(self, g: int, tops: tuple) -> tuple[float, tuple]:
        """Merge g with the group on the rank just below or above it (idle or not), when the size is allowed."""
        best: tuple[float, tuple] = (-EPS, ())
        ranks = self.g_ranks[g]
        lo, hi = ranks[0], ranks[-1]
        if hi - lo + 1 != len(ranks) or not self.samples_of[g]:
            return best
        m = int(self.g_layer[g])
        owner = self.rank_group[m]
        top1, top2, top3, ids = tops
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
            members = self.samples_of[g] + self.samples_of[h]
            col = self.t.time_matrix(intra, speed)[:, j_new]
            new_t = self.b + float(col[members].sum())
            rest = top2[m] if ids[1, m] != h else top3[m]
            delta = max(rest, new_t) - top1[m]
            if delta < best[0]:
                best = (delta, ("merge", g, h, new_ranks, (j_new, intra, speed), cap))
        return best

    def _apply(self, move: tuple) -> None:
        kind = move[0]
        if kind == "move":
            _, a, h = move
            g = int(self.s_group[a])
            self.samples_of[g].remove(a)
            self.samples_of[h].append(a)
            self.s_group[a] = h
            self._update_groups([g, h])
        elif kind == "swap":
            _, a, c = move
            g, h = int(self.s_group[a]), int(self.s_group[c])
            self.samples_of[g].remove(a)
            self.samples_of[h].remove(c)
            self.samples_of[g].append(c)
            self.samples_of[h].append(a)
            self.s_group[a], self.s_group[c] = h, g
            self._update_groups([g, h])
        else:
            _, g, h, new_ranks, key, cap = move
            for a in self.samples_of[h]:
                self.s_group[a] = g
            self.samples_of[g].extend(self.samples_of[h])
            self.samples_of[h] = []
            self.g_alive[h] = False
            self.g_ranks[h] = ()
            self.g_ranks[g] = new_ranks
            self.rank_group[int(self.g_layer[g])][list(new_ranks)] = g
            self.g_class[g] = self._class(key)
            self.g_limit[g] = cap * len(new_ranks)
            self._update_groups([g])

    def _update_groups(self, gs: list[int]) -> None:
        for g in gs:
            ss = self.samples_of[g]
            col = self.cols[self.g_class[g]]
            if ss:
                self.s_cost[ss] = col[ss]
                self.g_time[g] = self.b + float(col[ss].sum())
                self.g_tokens[g] = float(self.lengths[ss].sum())
            else:
                self.g_time[g] = 0.0
                self.g_tokens[g] = 0.0

    # -- driver -----------------------------------------------------------------------------
    def run(self, deadline: float | None = None) -> None:
        stale = 0
        rounds = 0
        m = 0
        while stale < self.n_layers and rounds < self.max_rounds:
            if deadline is not None and time.perf_counter() > deadline:
                break
            rounds += 1
            tops = self._layer_tops()
            g = int(tops[3][0, m])
            improved = False
            if g >= 0 and self.samples_of[g]:  # a layer whose groups are all empty has nothing to improve
                gain, move = self._best_move(g, tops)
                gain2, move2 = self._best_merge(g, tops)
                if gain2 < gain:
                    gain, move = gain2, move2
                if move:
                    self._apply(move)
                    improved = True
            if improved:
                stale = 0
            else:
                stale += 1
                m = (m + 1) % self.n_layers
        self.rounds = rounds

    def assignment(self) -> Assignment:
        mbs: list[list[tuple[tuple[int, ...], list[int]]]] = [[] for _ in range(self.n_layers)]
        for g in np.flatnonzero(self.g_alive):
            if self.samples_of[g]:
                mbs[int(self.g_layer[g])].append((self.g_ranks[g], sorted(self.samples_of[g])))
        return Assignment.of(mbs)
