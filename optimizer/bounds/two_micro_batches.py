"""A lower bound for a batch that memory fits in two micro-batches at the fewest: how its slowest samples split.

Notation as in :mod:`optimizer.bounds.long_sample`: N ranks, b the group constant, b_d >= b the least
constant of size d, t_h(d) sample h's best time on size d, a_h(d) = d t_h(d), phi_h(d) = b_d - b + t_h(d),
m_h its memory minimum, e_i the least area of sample i, Q the tokens all ranks hold at once.

Take a plan with exactly two micro-batches, lasting b + tau_1 and b + tau_2, and a set H of a few of the
slowest and longest samples, split into H_1 and H_2 between the two. For each micro-batch m:

1. A sample h of H_m on size d finishes within the micro-batch, phi_h(d) <= tau_m, so it takes at least
   the area A_h(tau_m) = min { a_h(d) : d >= m_h, phi_h(d) <= tau_m }; A_m(tau) is their sum over H_m.
2. Rank-time: the groups of m are disjoint and each keeps its ranks for tau_m at least as long as its
   samples' areas need, so N tau_m >= A_m(tau_m) + R_m, with R_m the least areas of m's samples outside H.
3. Memory: m's samples outside H hold at most Q - L(H_m) tokens, so R_m <= F_m, the fractional knapsack
   of the samples outside H by least area per token within that many tokens
   (:class:`optimizer.bounds.long_sample.OtherFill`).
4. R_1 + R_2 = E, the least areas of all samples outside H, and R_m >= 0.

So tau_1 + tau_2 is at least the least sum under 1-4; the part is 2 b plus the least over the splits of
H (the two micro-batches are interchangeable: the first holds H's first sample). A plan with three
micro-batches or more takes at least 3 b + sum_i e_i / N (bound 3 of :mod:`optimizer.bounds.lower_bounds`
with three), so the part is the lesser of the two. It sees what the fluid bounds pool away: the slow
samples' micro-batch lasts as long as they do or runs them wide, and memory caps the work the other
micro-batch can take off it.

**The least sum, exactly.** g_m(rho) = the least tau with N tau - A_m(tau) >= max(rho, 0), infinite past
F_m. A_m is a step function falling at the points phi_h(d): on the piece [p_j, p_{j+1}) where it is A_j,
the least tau is max(p_j, (max(rho, 0) + A_j) / N), when below p_{j+1}. So g_m is piecewise linear in rho
with slopes 1/N and 0 and kinks at rho = N p_j - A_j and N p_{j+1} - A_j, and g_1(rho) + g_2(E - rho)
is least at a kink of either or at an end of the range [max(0, E - F_2), min(E, F_1)].
"""

from __future__ import annotations

import numpy as np

from optimizer.bounds.long_sample import OtherFill
from optimizer.costs.tables import CostTables

HEADS = 5
"""Samples in H: the slowest (earliest finish) and the longest, alternately; 2^(HEADS-1) splits are tried
(on the 38 batches of two micro-batches at the fewest of the six-profile bench grid, six heads raised
the bound above five's on one, by 0.04%, at twice the time)."""
MAX_POINTS = 48
"""Most pieces of A_m: on clusters that allow every group size (hundreds of points phi_h(d)) the pieces
are coarsened, so that the part takes about a millisecond."""


def _least_tau(rho: np.ndarray, points: np.ndarray, areas: np.ndarray, cap: float, n_ranks: float) -> np.ndarray:
    """g_m of the module docstring at each of ``rho``; ``areas``: A_m on each piece [points_j, points_{j+1}),
    infinite before H_m fits. The piece that reaches N tau - A_j = rho first is the first whose end does
    (the ends N points_{j+1} - A_j rise with j), found by bisection."""
    need = np.maximum(rho, 0.0)
    ends = np.append(n_ranks * points[1:] - areas[:-1], np.inf)
    j = np.searchsorted(ends, need, side="right")
    tau = np.maximum(points[j], (need + areas[j]) / n_ranks)
    return np.where(rho <= cap, tau, np.inf)


def _kinks(points: np.ndarray, areas: np.ndarray, n_ranks: float) -> np.ndarray:
    """The kinks of g_m, where finite."""
    out = np.concatenate([n_ranks * points - areas, n_ranks * points[1:] - areas[:-1]])
    return out[np.isfinite(out)]


def _steps(phi: np.ndarray, area: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pieces every split's A_m is constant on, and each head's A_h on each (rows).

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


def three_or_more(tables: CostTables, least_area: np.ndarray) -> float:
    """What every plan of three micro-batches or more takes at least: 3 b + sum_i e_i / N."""
    return 3 * tables.group_constant + float(least_area.sum()) / float(tables.n_ranks)


def two_micro_batch_bound(tables: CostTables, fewest: int, fastest: np.ndarray, least_area: np.ndarray) -> float | None:
    """The bound of the module docstring when memory allows two micro-batches at the fewest (``fewest``);
    None otherwise. ``fastest`` and ``least_area``: each sample's
    earliest finish and least area e_i."""
    if fewest != 2:
        return None
    heads = _heads(tables, fastest)
    rest = np.setdiff1d(np.arange(tables.n_samples), heads)
    b = tables.group_constant
    n_ranks = float(tables.n_ranks)
    capacity = float(tables.rank_capacity.sum())
    lengths = tables.lengths.astype(np.float64)
    intra, inter, fits = tables.best_placements()
    time = np.where(fits[None, :] & (intra[heads] < inter[heads]), intra[heads], inter[heads])
    allowed = np.arange(len(tables.degrees))[None, :] >= tables.min_degree_index[heads][:, None]
    phi = np.where(allowed, tables.best_group_constants[None, :] - b + time, np.inf)
    area = np.where(allowed, tables.degrees.astype(np.float64)[None, :] * time, np.inf)
    work = float(least_area[rest].sum())
    others = OtherFill(lengths[rest], least_area[rest]) if rest.size else None
    more = three_or_more(tables, least_area)
    points, per_head = _steps(phi, area)
    k = len(heads)
    splits = np.arange(1 << (k - 1))[:, None]
    first = np.concatenate([np.ones((len(splits), 1), bool), (splits >> np.arange(k - 1)[None, :]) & 1 == 1], axis=1)
    held = np.stack([first @ lengths[heads], (~first) @ lengths[heads]], axis=1)
    fit = held.max(axis=1) <= capacity
    first, held = first[fit], held[fit]
    if first.shape[0] == 0:
        return more
    caps = others._all((capacity - held).ravel()).reshape(held.shape) if others is not None else np.zeros_like(held)
    low, high = np.maximum(0.0, work - caps[:, 1]), np.minimum(work, caps[:, 0])
    ok = low <= high * (1 + 1e-12)
    first, caps, low, high = first[ok], caps[ok], low[ok], high[ok]
    if first.shape[0] == 0:
        return more
    best = np.inf
    for row, cap, lo, hi in zip(first, caps, low, high, strict=True):
        a1, a2 = per_head[row].sum(axis=0), per_head[~row].sum(axis=0)
        rho = np.concatenate([_kinks(points, a1, n_ranks), work - _kinks(points, a2, n_ranks), [0.0, work, lo, hi]])
        rho = np.clip(rho, lo, hi)
        total = _least_tau(rho, points, a1, cap[0], n_ranks) + _least_tau(work - rho, points, a2, cap[1], n_ranks)
        best = min(best, float(total.min()))
    return min(2 * b + best, more)
