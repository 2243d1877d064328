"""A lower bound from the micro-batch that holds a slow sample: ranks wait for it, or it runs wide.

Notation as in :mod:`optimizer.bounds.lower_bounds`: N ranks, b the group constant, b_d >= b the least
constant of size d, t_h(d) sample h's best time on size d (fastest GPU, best placement), a_h(d) =
d t_h(d) its area there, e_i = min_{d >= m_i} a_i(d) the least area of sample i, Q the tokens all ranks
hold at once (the sum of the per-rank capacities), M the fewest micro-batches memory allows.

Take any plan the verifier accepts, with K >= M micro-batches holding samples, micro-batch m lasting
T_m = b + tau_m (every group lasts at least its constant, so tau_m >= 0), and any sample h, placed on
a group of size d >= m_h in micro-batch m*. Three facts:

1. Rank-time: a group of size d_g in micro-batch m keeps its d_g ranks for tau_m >= sum of its
   samples' t_i(d_g), so N tau_m >= sum over m's samples of their areas a_i(d_i) (groups of a
   micro-batch are disjoint; sample_step, group messages, padding and slower GPUs only add time).
2. The micro-batch of h lasts at least as long as h: tau_{m*} >= phi_h(d) = b_d - b + t_h(d).
3. Memory: the samples X of m* (h included) hold at most Q tokens, so the other samples of m*
   carry at most F_h = max { sum_{j in Y} e_j : Y without h, sum_{j in Y} L_j <= Q - L_h } of least
   area, and F_h is at most the fractional knapsack of the other samples by area per token.

Summing fact 1 over the other micro-batches and using max(fact 1, fact 2) for m*:

    N sum_m tau_m >= sum_{i not in X} e_i + max(N phi_h(d), a_h(d) + sum_{j in X, j != h} e_j)
                   = sum_{i != h} e_i + a_h(d) + max(0, N phi_h(d) - a_h(d) - sum_{j in X, j != h} e_j)
                  >= sum_{i != h} e_i + a_h(d) + max(0, N phi_h(d) - a_h(d) - F_h)

(every actual area a_i replaced by its least e_i: the first line grows with each area). The plan
chose d; the bound takes the least over the sizes h may use, and S = sum_m T_m >= M b + sum tau_m:

    S >= M b + (sum_{i != h} e_i + min_{d >= m_h} [a_h(d) + max(0, N phi_h(d) - a_h(d) - F_h)]) / N.

It holds for every h; the part is the largest over a few candidates (the slowest samples and the
longest). It beats the micro-batch bound when a slow sample, at its least-area size, would keep the
whole domain waiting longer than memory lets the other samples fill (the ranks idle or the sample
runs on a larger, costlier group) -- long samples under a large per-micro-batch constant and tight
memory. With e_h in place of the minimum (no waiting term) it is M b + sum_i e_i / N, the micro-batch
bound of :mod:`optimizer.bounds.lower_bounds` before its finishing-time refinement.
"""

from __future__ import annotations

import numpy as np

from optimizer.costs.tables import CostTables

CANDIDATES = 4
"""Samples tried as h: this many of the slowest (earliest finish) and as many of the longest."""


class OtherFill:
    """Fractional knapsack of the samples by least area per token, sorted once: :meth:`within` is the
    most least-area the samples bring within token budgets, :meth:`without` the same for the samples
    other than h (an upper bound on F_h of the module docstring)."""

    def __init__(self, lengths: np.ndarray, area: np.ndarray) -> None:
        self.order = np.argsort(-(area / lengths), kind="stable")
        self.position = np.empty_like(self.order)
        self.position[self.order] = np.arange(self.order.shape[0])
        self.tokens = lengths[self.order]
        self.value = area[self.order]
        self.cum_tokens = np.cumsum(self.tokens)
        self.cum_value = np.cumsum(self.value)

    def within(self, budget: np.ndarray) -> np.ndarray:
        """The knapsack of every sample within each of ``budget``'s token budgets: the samples that fit
        whole, in order, and a share of the next."""
        n = self.order.shape[0]
        whole = np.searchsorted(self.cum_tokens, budget, side="right")
        before = np.maximum(whole - 1, 0)
        taken = np.where(whole > 0, self.cum_value[before], 0.0)
        room = budget - np.where(whole > 0, self.cum_tokens[before], 0.0)
        nxt = np.minimum(whole, n - 1)
        return taken + np.where(whole < n, self.value[nxt] * room / self.tokens[nxt], 0.0)

    def without(self, rows: np.ndarray, budget: np.ndarray) -> np.ndarray:
        """For each sample h of ``rows``, the knapsack of every sample but h within its entry of ``budget``
        tokens. When h comes after the last (partly) taken sample it changes nothing; else the others take
        what all samples take within the budget plus h's tokens, h (then taken whole) left out."""
        pos = self.position[rows]
        after = pos > np.searchsorted(self.cum_tokens, budget, side="right")
        fill = np.where(after, self.within(budget), self.within(budget + self.tokens[pos]) - self.value[pos])
        return np.where(budget > 0, fill, 0.0)


def long_sample_bound(tables: CostTables, fewest: int, fastest: np.ndarray, least_area: np.ndarray) -> float | None:
    """The bound of the module docstring, the largest over the candidate samples (``fewest``: M;
    ``fastest`` and ``least_area``: each sample's earliest finish and least area e_i); None when no
    candidate has to wait or run wider than its least-area size (the bound is then M b + sum e_i / N,
    which the micro-batch bound already gives)."""
    n = tables.n_samples
    b = tables.group_constant
    n_ranks = float(tables.n_ranks)
    capacity = float(tables.rank_capacity.sum())
    lengths = tables.lengths.astype(np.float64)
    k = min(CANDIDATES, n)
    candidates = np.unique(np.concatenate([np.argpartition(-fastest, k - 1)[:k], np.argpartition(-lengths, k - 1)[:k]]))
    times = tables.best_time_rows(candidates)
    constants = tables.best_group_constants
    degrees = tables.degrees.astype(np.float64)
    total = float(least_area.sum())
    others = OtherFill(lengths, least_area)
    best: float | None = None
    fills = others.without(candidates, capacity - lengths[candidates])
    for h, fill, row in zip(candidates.tolist(), fills.tolist(), times, strict=True):
        j0 = int(tables.min_degree_index[h])
        t = row[j0:]
        area = degrees[j0:] * t
        wait = n_ranks * (constants[j0:] - b + t)
        head = float(np.min(area + np.maximum(0.0, wait - area - fill)))
        if head > float(least_area[h]) * (1 + 1e-9):
            value = fewest * b + (total - float(least_area[h]) + head) / n_ranks
            best = value if best is None else max(best, value)
    return best
