"""Compiled inner loops of the local search (:mod:`optimizer.heuristic.local_search`).

Groups are arrays indexed by group id (time, micro-batch, memory limit and tokens, alive flag, class);
samples by sample id (group, time in that group, length). ``times[i, c]`` is sample i's time on a
group of class c. The step time is the sum over micro-batches of the slowest group; :func:`micro_batch_tops`
keeps each micro-batch's three largest group times so that the change of the step time caused by
changing two groups is known without rescanning (:func:`step_delta`). Ties break towards the lower
group or sample index, so the search is deterministic.
"""

from __future__ import annotations

import numpy as np

from optimizer.jit import compiled

EPS = 1e-12


@compiled
def micro_batch_tops(
    g_time: np.ndarray, g_micro_batch: np.ndarray, g_alive: np.ndarray, top: np.ndarray, top_id: np.ndarray
) -> None:
    """Per micro-batch m: ``top[m, 0..2]`` the three largest group times, ``top_id[m, 0..1]`` the groups of
    the first two (-1: none)."""
    top[:, :] = 0.0
    top_id[:, :] = -1
    for g in range(g_time.shape[0]):
        if not g_alive[g]:
            continue
        m = g_micro_batch[g]
        t = g_time[g]
        if top_id[m, 0] < 0 or t > top[m, 0]:
            top[m, 2] = top[m, 1]
            top[m, 1] = top[m, 0]
            top_id[m, 1] = top_id[m, 0]
            top[m, 0] = t
            top_id[m, 0] = g
        elif top_id[m, 1] < 0 or t > top[m, 1]:
            top[m, 2] = top[m, 1]
            top[m, 1] = t
            top_id[m, 1] = g
        elif t > top[m, 2]:
            top[m, 2] = t


@compiled
def step_delta(
    g: int, m: int, new_tg: float, h: int, hl: int, new_th: float, top: np.ndarray, top_id: np.ndarray
) -> float:
    """Change of the step time when group g (micro-batch m) takes time new_tg and group h (micro-batch hl) new_th."""
    if hl != m:
        ex_g = top[m, 1] if top_id[m, 0] == g else top[m, 0]
        other = top[hl, 1] if top_id[hl, 0] == h else top[hl, 0]
        return (max(ex_g, new_tg) - top[m, 0]) + (max(other, new_th) - top[hl, 0])
    if top_id[m, 0] == g:
        rest = top[m, 2] if top_id[m, 1] == h else top[m, 1]
    elif top_id[m, 0] == h:
        rest = top[m, 2] if top_id[m, 1] == g else top[m, 1]
    else:
        rest = top[m, 0]
    return max(max(rest, new_tg), new_th) - top[m, 0]


@compiled
def _top_k(score: np.ndarray, ids: np.ndarray, n: int, k: int, out: np.ndarray) -> int:
    """The k entries of ids[:n] with the largest score (ties: lower position first) into out; returns how many."""
    got = 0
    for p in range(n):
        s = score[p]
        if got == k and s <= score[out[got - 1]]:
            continue
        q = got if got < k else k - 1
        while q > 0 and s > score[out[q - 1]]:
            out[q] = out[q - 1]
            q -= 1
        out[q] = p
        if got < k:
            got += 1
    for q in range(got):
        out[q] = ids[out[q]]
    return got


@compiled
def candidates(
    g: int,
    top: np.ndarray,
    g_time: np.ndarray,
    g_micro_batch: np.ndarray,
    g_limit: np.ndarray,
    g_tokens: np.ndarray,
    g_alive: np.ndarray,
    n_slack: int,
    n_room: int,
) -> np.ndarray:
    """Groups a sample of g may go to, ascending: every other live group when few, else the n_slack
    with the most time slack below their micro-batch's maximum and the n_room with the most memory room."""
    n_groups = g_time.shape[0]
    ids = np.empty(n_groups, dtype=np.int64)
    n = 0
    for h in range(n_groups):
        if g_alive[h] and h != g:
            ids[n] = h
            n += 1
    if n <= n_slack + n_room:
        return ids[:n].copy()
    slack = np.empty(n)
    room = np.empty(n)
    for p in range(n):
        h = ids[p]
        slack[p] = top[g_micro_batch[h], 0] - g_time[h]
        room[p] = g_limit[h] - g_tokens[h]
    picked = np.empty(n_slack + n_room, dtype=np.int64)
    a = _top_k(slack, ids, n, n_slack, picked)
    b = _top_k(room, ids, n, n_room, picked[a:])
    return np.unique(picked[: a + b])


@compiled
def best_move(
    g: int,
    top: np.ndarray,
    top_id: np.ndarray,
    g_time: np.ndarray,
    g_micro_batch: np.ndarray,
    g_limit: np.ndarray,
    g_tokens: np.ndarray,
    g_alive: np.ndarray,
    g_class: np.ndarray,
    s_group: np.ndarray,
    s_cost: np.ndarray,
    lengths: np.ndarray,
    times: np.ndarray,
    class_b: np.ndarray,
    n_slack: int,
    n_room: int,
) -> tuple[float, int, int, int]:
    """Best move (one sample of g to another group) or swap (with a sample of another group); ``class_b[c]`` is the
    group constant of a group of class c (the time of an empty group that gets a sample, before it).

    Returns (change of the step time, kind, a, x): kind 1 moves sample a to group x, kind 2 swaps
    sample a with sample x, kind 0 found nothing that lowers the step time by more than EPS.
    """
    best, kind = -EPS, 0
    best_a: int = -1
    best_x: int = -1
    n = s_group.shape[0]
    members = np.flatnonzero(s_group == g)
    if members.shape[0] == 0:
        return best, kind, best_a, best_x
    m = g_micro_batch[g]
    tg = g_time[g]
    cand = candidates(g, top, g_time, g_micro_batch, g_limit, g_tokens, g_alive, n_slack, n_room)
    is_cand = np.zeros(g_time.shape[0], dtype=np.bool_)
    for h in cand:
        is_cand[h] = True
    single = members.shape[0] == 1
    for a in members:
        new_tg = 0.0 if single else tg - s_cost[a]
        la = lengths[a]
        for h in cand:
            if g_limit[h] - g_tokens[h] < la:
                continue
            base = g_time[h] if g_time[h] > 0 else class_b[g_class[h]]
            d = step_delta(g, m, new_tg, h, g_micro_batch[h], base + times[a, g_class[h]], top, top_id)
            if d < best:
                best, kind, best_a, best_x = d, 1, int(a), int(h)
    room_g = g_limit[g] - g_tokens[g]
    cg = g_class[g]
    for c in range(n):
        h = s_group[c]
        if not is_cand[h]:
            continue
        lc = lengths[c]
        room_h = g_limit[h] - g_tokens[h] + lc
        ch = g_class[h]
        hl = g_micro_batch[h]
        for a in members:
            la = lengths[a]
            if room_h < la or room_g + la < lc:
                continue
            d = step_delta(
                g, m, tg - s_cost[a] + times[c, cg], h, hl, g_time[h] - s_cost[c] + times[a, ch], top, top_id
            )
            if d < best:
                best, kind, best_a, best_x = d, 2, int(a), int(c)
    return best, kind, best_a, best_x


@compiled
def refresh_group(
    g: int,
    s_group: np.ndarray,
    s_cost: np.ndarray,
    lengths: np.ndarray,
    col: np.ndarray,
    b: float,
    g_time: np.ndarray,
    g_tokens: np.ndarray,
) -> None:
    """Recompute group g's sample times (from its class column ``col``), time and tokens."""
    total = 0.0
    tokens = 0.0
    count = 0
    for i in range(s_group.shape[0]):
        if s_group[i] == g:
            s_cost[i] = col[i]
            total += col[i]
            tokens += lengths[i]
            count += 1
    g_time[g] = b + total if count else 0.0
    g_tokens[g] = tokens
