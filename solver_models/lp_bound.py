"""A linear-programming lower bound on the step time that sees micro-batches (levels).

The area bound of :mod:`optimizer.bounds.lower_bounds` pools all micro-batches: a long sample may take the
cheapest group size that finishes within the whole step S. In a real plan it must finish within its
own micro-batch, and the micro-batch times add up to S. This LP keeps that coupling.

Notation: N ranks, C the largest per-rank capacity, b the group constant, b_d >= b the least
constant of a group of size d (b plus its messages' latency when the profile has
``comm.group_messages``); e_i(T) the least rank-seconds sample i occupies when it must finish
within T (min of d t_i(d) over sizes d that hold it in memory with b_d + t_i(d) <= T; +inf if none);
levels 0 < th_0 < th_1 < ... < th_K = U (U the
incumbent's step time; an optimal plan has no micro-batch longer), th_-1 = 0. A micro-batch with
time T is in level k when th_k-1 < T <= th_k.

Variables (all continuous, >= 0): W_qk samples of bucket q in micro-batches of level k; n_k the
number of micro-batches in level k; A_k the sum of their times.

Objective: minimise sum_k A_k (= the step time of the plan the LP relaxes).

Constraints:

1. every sample in some level: sum_k W_qk = c_q, and W_qk = 0 unless q can finish within th_k;
2. rank-seconds per level (each micro-batch: N T >= sum of its groups' d (b + sum t)):
   N A_k >= sum_q W_qk (e_q(th_k) + b L_q / C);
3. memory per level: N C n_k >= sum_q W_qk L_q;
4. level times: th_k-1 n_k <= A_k <= th_k n_k;
5. micro-batch count: sum_k n_k <= max_micro_batches.

Validity: an optimal plan gives a feasible point with objective S* (e_i is non-increasing in T, so
e_i(th_k) <= e_i(T)); buckets join samples whose finishing time, area and tokens agree within
``BUCKET_STEP`` and use the smallest of each over their members, which only relaxes the LP. The
bound is therefore at most S*; it is at least the area bound up to the level width.

Measured (``bench/solver_bench.py --lp-check``): on the long-tail video and image-SFT batches
of 64 and 256 ranks this LP gives 0.996-0.998 of the area bound at the default level and bucket
widths, and exactly the area bound with 1-2% levels and per-sample buckets (3-15 s): the
micro-batch coupling does not bind there, the remaining gap of plans to the bound is integrality
(how samples pack into groups). The planner therefore does not pay for it; the exact backends'
own bounds (whole-problem models) are what certify small problems.
"""

from __future__ import annotations

import math

import numpy as np

from optimizer.costs.tables import CostTables

LEVEL_RATIO = 1.08
"""Consecutive levels differ by this factor."""
BUCKET_STEP = 0.02
"""Relative width of the sample buckets."""


def level_bound(tables: CostTables, upper_s: float) -> tuple[float, dict[str, int]] | None:
    """The LP bound in seconds and the LP size, or None when HiGHS is missing or fails."""
    from solver_models.pulp_milp import highs_module

    highspy = highs_module()
    if highspy is None:
        return None
    b = tables.group_constant
    n_ranks = tables.n_ranks
    cap = float(tables.rank_capacity.max())
    t = tables.best_time
    deg = tables.degrees.astype(np.float64)[None, :]
    valid = np.arange(t.shape[1])[None, :] >= tables.min_degree_index[:, None]
    finish = np.where(valid, tables.best_group_constants[None, :] + t, np.inf)
    area = np.where(valid, t * deg, np.inf)
    tau = finish.min(axis=1)
    lo = float(tau.min())
    if not upper_s > lo:
        return None
    k_count = max(1, math.ceil(math.log(upper_s / lo) / math.log(LEVEL_RATIO)))
    theta = np.minimum(lo * LEVEL_RATIO ** np.arange(k_count + 1), upper_s)
    theta[-1] = upper_s
    theta = np.unique(theta)
    # e[i, k]: least area of sample i finishing within theta_k.
    e = np.stack([np.where(finish <= th, area, np.inf).min(axis=1) for th in theta], axis=1)
    lengths = tables.lengths.astype(np.float64)
    # Buckets: first feasible level, log area at the top level, log tokens.
    first = np.argmax(np.isfinite(e), axis=1)
    step = math.log1p(BUCKET_STEP)
    key = np.stack(
        [first, np.floor(np.log(e[:, -1]) / step), np.floor(np.log(np.maximum(lengths, 1.0)) / step)], axis=1
    ).astype(np.int64)
    _, bucket, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    bucket = bucket.ravel()
    n_q = counts.shape[0]
    n_k = theta.shape[0]
    e_q = np.full((n_q, n_k), np.inf)
    np.minimum.at(e_q, bucket, e)
    l_q = np.full(n_q, np.inf)
    np.minimum.at(l_q, bucket, lengths)

    # Columns: W (only finite e), then n_k, then A_k.
    qs, ks = np.nonzero(np.isfinite(e_q))
    n_w = qs.shape[0]
    col_n = n_w + np.arange(n_k)
    col_a = n_w + n_k + np.arange(n_k)
    n_cols = n_w + 2 * n_k
    cost = np.zeros(n_cols)
    cost[col_a] = 1.0
    rows_lo: list[float] = []
    rows_hi: list[float] = []
    entries: list[tuple[np.ndarray, np.ndarray]] = []
    inf = highspy.kHighsInf

    def row(cols: np.ndarray, vals: np.ndarray, low: float, high: float) -> None:
        entries.append((cols, vals))
        rows_lo.append(low)
        rows_hi.append(high)

    w_cols = np.arange(n_w)
    order = np.argsort(qs, kind="stable")
    bounds_q = np.searchsorted(qs[order], np.arange(n_q + 1))
    # 1. every sample in some level
    for q in range(n_q):
        sel = order[bounds_q[q] : bounds_q[q + 1]]
        row(w_cols[sel], np.ones(sel.shape[0]), float(counts[q]), float(counts[q]))
    order_k = np.argsort(ks, kind="stable")
    bounds_k = np.searchsorted(ks[order_k], np.arange(n_k + 1))
    for k in range(n_k):
        sel = order_k[bounds_k[k] : bounds_k[k + 1]]
        q_sel = qs[sel]
        # 2. rank-seconds per level
        row(
            np.concatenate([[col_a[k]], w_cols[sel]]),
            np.concatenate([[float(n_ranks)], -(e_q[q_sel, k] + b * l_q[q_sel] / cap)]),
            0.0,
            inf,
        )
        # 3. memory per level
        row(np.concatenate([[col_n[k]], w_cols[sel]]), np.concatenate([[float(n_ranks) * cap], -l_q[q_sel]]), 0.0, inf)
        # 4. level times
        lower = float(theta[k - 1]) if k else 0.0
        row(np.array([col_a[k], col_n[k]]), np.array([1.0, -lower]), 0.0, inf)
        row(np.array([col_a[k], col_n[k]]), np.array([-1.0, float(theta[k])]), 0.0, inf)
    # 5. micro-batch count
    row(col_n, np.ones(n_k), 0.0, float(tables.problem.options.micro_batch_limit))

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.addCols(
        n_cols,
        cost,
        np.zeros(n_cols),
        np.full(n_cols, inf),
        0,
        np.zeros(n_cols, dtype=np.int32),
        np.zeros(0, dtype=np.int32),
        np.zeros(0),
    )
    starts = np.cumsum([0] + [c.shape[0] for c, _ in entries[:-1]]).astype(np.int32)
    index = np.concatenate([c for c, _ in entries]).astype(np.int32)
    value = np.concatenate([v for _, v in entries]).astype(np.float64)
    h.addRows(len(entries), np.array(rows_lo), np.array(rows_hi), index.shape[0], starts, index, value)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    value_s = float(h.getInfo().objective_function_value)
    # The LP's own tolerance (1e-7 relative feasibility) is taken off so the bound stays a bound.
    return value_s * (1 - 1e-6), {"levels": int(n_k), "buckets": int(n_q), "columns": int(n_cols), "rows": len(entries)}
