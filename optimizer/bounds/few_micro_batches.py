"""A lower bound for a batch that memory fits in a few micro-batches at the fewest: how its slowest samples split.

Notation as in :mod:`optimizer.bounds.long_sample`: N ranks, b the group constant, b_d >= b the least
constant of size d, t_h(d) sample h's best time on size d, a_h(d) = d t_h(d), phi_h(d) = b_d - b + t_h(d),
m_h its memory minimum, e_i the least area of sample i, Q the tokens all ranks hold at once, M the
fewest micro-batches memory allows.

Take a plan with exactly K = M micro-batches, lasting b + tau_1, ..., b + tau_K, and a set H of a few of
the slowest and longest samples, split into H_1, ..., H_K among them. For each micro-batch m:

1. A sample h of H_m on size d finishes within the micro-batch, phi_h(d) <= tau_m, so it takes at least
   the area A_h(tau_m) = min { a_h(d) : d >= m_h, phi_h(d) <= tau_m }; A_m(tau) is their sum over H_m.
2. Rank-time: the groups of m are disjoint and each keeps its ranks for tau_m at least as long as its
   samples' areas need, so N tau_m >= A_m(tau_m) + R_m, with R_m the least areas of m's samples outside H.
3. Memory: m's samples outside H hold at most Q - L(H_m) tokens, so R_m <= F_m, the fractional knapsack
   of the samples outside H by least area per token within that many tokens
   (:class:`optimizer.bounds.long_sample.OtherFill`).
4. The R_m add up to E, the least areas of all samples outside H, and R_m >= 0.

So sum_m tau_m is at least the least sum under 1-4; the part is M b plus the least over the splits of H
(the micro-batches are interchangeable: the splits are the partitions of H into at most M parts). A
plan with more micro-batches takes at least (M + 1) b + sum_i e_i / N (bound 3 of
:mod:`optimizer.bounds.lower_bounds` with M + 1), so the part is the lesser of the two. It sees what the
fluid bounds pool away: a long sample's micro-batch lasts as long as it does or runs it wide, and memory
caps the work the other micro-batches can take off it.

**The least sum.** A_m is a step function falling at the points phi_h(d); on the piece that starts at
p_j it is A_j. Given rho_m = R_m, micro-batch m needs tau_m = min_j max(p_j, (rho_m + A_j) / N) (a piece
used past its end only gives more than the next piece). On piece j the rank-time up to p_j is free room
s_j = min(F_m, max(0, N p_j - A_j)) for the other samples, at a length c_j = max(p_j, A_j / N), and every
further unit of E costs 1/N wherever the knapsacks leave room (none when sum_m F_m < E: the split cannot
be). So for pieces chosen for every micro-batch the sum is sum_m c + max(0, E - sum_m s) / N, at least
the larger of sum_m c and sum_m (c - s / N) + E / N; the part takes, per split, the larger of
sum_m min_j c_j and sum_m min_j (c_j - s_j / N) + E / N, each minimum over a micro-batch's own pieces. On
the 45 batches of two and three micro-batches at the fewest of four profiles of the bench grid this is
the least sum itself (found by merging the micro-batches' Pareto fronts of (c, s)) on every one, at a
tenth of the time; on the oracle's tiny batches it is at most 0.18% below it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from optimizer.bounds.long_sample import OtherFill
from optimizer.costs.tables import CostTables

MOST = 4
"""Largest fewest micro-batch count the part is computed for (the splits grow as M^HEADS). With one
micro-batch at the fewest it adds nothing the other bounds lack (no split)."""
HEADS = 5
"""Samples in H: the slowest (earliest finish) and the longest, alternately (on the 38 batches of two
micro-batches at the fewest of the six-profile bench grid, six heads raised the bound above five's on one,
by 0.04%, at twice the time)."""
MAX_POINTS = 48
"""Most pieces of A_m: on clusters that allow every group size (hundreds of points phi_h(d)) the pieces
are coarsened, so that the part takes about a millisecond."""


def _steps(phi: np.ndarray, area: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pieces every split's A_m is constant on (their starts), and each head's A_h on each (rows).

    Exactly, the pieces run between the points phi_h(d), where some A_h falls. Past MAX_POINTS of them
    (many allowed sizes), a subset of the points is kept and each piece [q_j, q_{j+1}) takes A_h(q_{j+1}),
    the value where it ends: A_h never rises with tau, so that is below A_h on the whole piece and the
    bound stays a bound, a little lower."""
    points = np.unique(np.concatenate([[0.0], phi[np.isfinite(phi)]]))
    values = points
    if len(points) > MAX_POINTS:
        keep = np.unique(np.linspace(0, len(points) - 1, MAX_POINTS).round().astype(np.int64))
        points = points[keep]
        values = np.append(points[1:], points[-1])
    at = np.where(phi[:, None, :] <= values[None, :, None], area[:, None, :], np.inf).min(axis=2)
    return points, at


def _heads(tables: CostTables, fastest: np.ndarray) -> np.ndarray:
    """H: the slowest and the longest samples, alternately, HEADS of them (fewer on small batches)."""
    slow = np.argsort(-fastest, kind="stable").tolist()
    long = np.argsort(-tables.lengths, kind="stable").tolist()
    out: list[int] = []
    for pair in zip(slow, long, strict=True):
        for i in pair:
            if i not in out and len(out) < HEADS:
                out.append(int(i))
        if len(out) >= HEADS:
            break
    return np.array(out, dtype=np.int64)


def partitions(k: int, parts: int) -> Iterator[list[int]]:
    """Every partition of k items into at most ``parts`` parts, once each: item i's part, numbered in the
    order the parts first appear."""
    labels = [0] * k

    def extend(i: int, used: int) -> Iterator[list[int]]:
        if i == k:
            yield list(labels)
            return
        for part in range(min(used + 1, parts)):
            labels[i] = part
            yield from extend(i + 1, max(used, part + 1))

    yield from extend(0, 0) if k else iter([[]])


def few_micro_batch_bound(tables: CostTables, fewest: int, fastest: np.ndarray, least_area: np.ndarray) -> float | None:
    """The bound of the module docstring when memory allows two to MOST micro-batches at the fewest
    (``fewest``); None otherwise. ``fastest`` and ``least_area``: each sample's earliest finish and least
    area e_i."""
    if not 2 <= fewest <= MOST:
        return None
    heads = _heads(tables, fastest)
    rest = np.setdiff1d(np.arange(tables.n_samples), heads)
    b = tables.group_constant
    n_ranks = float(tables.n_ranks)
    capacity = float(tables.rank_capacity.sum())
    lengths = tables.lengths.astype(np.float64)
    time = tables.best_time_rows(heads)
    allowed = np.arange(len(tables.degrees))[None, :] >= tables.min_degree_index[heads][:, None]
    phi = np.where(allowed, tables.best_group_constants[None, :] - b + time, np.inf)
    area = np.where(allowed, tables.degrees.astype(np.float64)[None, :] * time, np.inf)
    work = float(least_area[rest].sum())
    others = OtherFill(lengths[rest], least_area[rest]) if rest.size else None
    more = more_micro_batches(tables, fewest, least_area)
    points, per_head = _steps(phi, area)
    # Every set S of heads that a micro-batch can hold: its tokens, its knapsack F and the two minima.
    k = len(heads)
    sets = (np.arange(1, 1 << k)[:, None] >> np.arange(k)[None, :]) & 1 == 1
    held = sets @ lengths[heads]
    caps = others.within(np.maximum(capacity - held, 0.0)) if others is not None else np.zeros(len(sets))
    a = np.where(sets[:, :, None], per_head[None], 0.0).sum(axis=1)
    length = np.maximum(points[None, :], a / n_ranks)
    room = np.minimum(caps[:, None], np.maximum(0.0, n_ranks * points[None, :] - a))
    shortest = length.min(axis=1)
    waited = (length - room / n_ranks).min(axis=1)
    fits = (held <= capacity) & np.isfinite(shortest)
    empty_cap = float(others.within(np.array([capacity]))[0]) if others is not None else 0.0
    best = np.inf
    for labels in partitions(k, fewest):
        blocks = [sum(1 << i for i, part in enumerate(labels) if part == m) - 1 for m in range(max(labels) + 1)]
        if not all(fits[s] for s in blocks):
            continue
        if float(caps[blocks].sum()) + (fewest - len(blocks)) * empty_cap < work * (1 - 1e-12):
            continue
        best = min(best, max(float(shortest[blocks].sum()), float(waited[blocks].sum()) + work / n_ranks))
    return min(fewest * b + best, more)


def more_micro_batches(tables: CostTables, fewest: int, least_area: np.ndarray) -> float:
    """What every plan of more than ``fewest`` micro-batches takes at least: (fewest + 1) b + sum_i e_i / N."""
    return (fewest + 1) * tables.group_constant + float(least_area.sum()) / float(tables.n_ranks)
