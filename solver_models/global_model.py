"""A global model of the whole step: length buckets x group sizes x micro-batch time levels.

The neighbourhood search of :mod:`solver_models.lns` only reshuffles a few groups of the starting
plan; it cannot move to a plan with another micro-batch count or another set of group sizes. This
model chooses those globally, at the level of buckets of similar samples:

- samples are bucketed by their time on one rank (at most ``MAX_BUCKETS``); a bucket's time on a
  size is the *largest* of its members' (on the slowest GPU; intra-node where the size fits a node,
  spanning above), its tokens the largest member's, so a group the model accepts holds in time and
  memory whatever members it gets;
- micro-batch times are rounded up to levels th_0 < ... < th_K (geometric, the top one the
  starting plan's slowest micro-batch); a micro-batch of level k finishes within th_k.

Integer variables: M_k micro-batches at level k; G_kd groups of size d at level k (all micro-batches
of the level together); X_kqd samples of bucket q on groups of size d at level k (only where one
member finishes within th_k and fits in memory on d).

1. every sample placed: sum_kd X_kqd = c_q;
2. time of the level's groups of size d: sum_q t_qd X_kqd <= (th_k - b) G_kd;
3. their memory: sum_q L_q X_kqd <= floor(d C) G_kd;
4. ranks: sum_d d G_kd <= N M_k, and G_kd <= floor(N / d) M_k;
5. micro-batch count: M_min <= sum_k M_k <= M_max (M_min the memory minimum, M_max the starting
   plan's count plus a few, at most options.micro_batch_limit);

minimising sum_k th_k M_k. Constraints 2 and 3 pool the groups of one level and size, so a
solution is a plan only after packing: :func:`decode` deals each bucket's samples to the pools
(longest to the highest level), packs each pool's samples longest-first into its groups (the least
loaded group with memory room), gives samples that did not fit to the group where they lengthen
their micro-batch least (or to free ranks, or a new micro-batch), and places each micro-batch's
groups on ranks (:func:`optimizer.placement.place_groups`). The decoded plan's time is recomputed
from its real samples by the caller; the model's objective is only the search's guide.

The starting plan maps onto the model (each of its micro-batches on the lowest level above its
bucket-rounded time), so the solvers start from it when it satisfies the rounded memory rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from optimizer.costs import CostTables
from optimizer.placement import place_groups
from optimizer.plan import Assignment
from solver_models.level_milp import Milp

UNIT = 1e-4
"""Seconds per model time unit."""
MAX_BUCKETS = 24
"""Most sample buckets."""
MAX_LEVELS = 40
"""Most micro-batch time levels."""
MIN_LEVEL_RATIO = 1.02
"""Consecutive levels differ by at least this factor."""
AREA_SLACK = 1.6
"""A bucket may use a size at a level when its rank-seconds there are within this factor of the
least among the sizes that finish within the level (or when the starting plan uses it)."""
MAX_SIZES = 12
"""With more allowed sizes than this, the model offers powers of two, node multiples and the largest."""
EXTRA_MICRO_BATCHES = 4
"""The model may use this many micro-batches (or half the starting plan's count, if more) beyond the starting plan's."""


@dataclass
class GlobalModel:
    tables: CostTables
    sizes: np.ndarray  # [J] group sizes offered
    members: list[np.ndarray]  # sample indices per bucket, slowest first
    bucket_time: np.ndarray  # [Q, J] seconds (largest member)
    bucket_tokens: np.ndarray  # [Q] tokens (largest member)
    levels: np.ndarray  # [K] seconds
    sample_time: np.ndarray  # [n, J] seconds at the size's planned placement, slowest GPU
    capacity: float  # tokens per rank (smallest)
    milp: Milp
    m_var: list[int]  # [K]
    g_var: dict[tuple[int, int], int]  # (k, j) -> column
    x_var: dict[tuple[int, int, int], int]  # (k, q, j) -> column
    info: dict[str, object] = field(default_factory=dict)

    def size(self) -> dict[str, int]:
        return {"buckets": len(self.members), "levels": int(self.levels.shape[0]), "sizes": int(self.sizes.shape[0]),
                "columns": self.milp.n_vars, "rows": len(self.milp.rows)}


def offered_sizes(tables: CostTables) -> np.ndarray:
    """Group sizes the model offers (all allowed ones when few)."""
    degrees = [int(d) for d in tables.degrees]
    if len(degrees) <= MAX_SIZES:
        return np.asarray(degrees, dtype=np.int64)
    node = tables.node_size
    keep = {d for d in degrees if d & (d - 1) == 0 or d % node == 0 or d == node}
    keep.add(degrees[-1])
    return np.asarray(sorted(keep), dtype=np.int64)


def placed_times(tables: CostTables, sizes: np.ndarray) -> np.ndarray:
    """[n, J] each sample's seconds on each offered size: intra-node where the size fits a node, on the slowest GPU."""
    slow = float(tables.rank_speed.min())
    cols = [tables.degree_index[int(d)] for d in sizes]
    intra = tables.time_matrix(True, slow)[:, cols]
    inter = tables.time_matrix(False, slow)[:, cols]
    return np.where((sizes <= tables.node_size)[None, :], intra, inter)


def _greedy_buckets(lengths: np.ndarray, breaks: np.ndarray, waste: float) -> list[int]:
    """Starts of buckets over ``lengths`` (descending): a bucket ends where ``breaks`` says or where
    its tokens short of its longest member would pass ``waste``."""
    starts = [0]
    top = float(lengths[0])
    lost = 0.0
    for i in range(1, lengths.shape[0]):
        lost += top - float(lengths[i])
        if breaks[i] or lost > waste:
            starts.append(i)
            top, lost = float(lengths[i]), 0.0
    return starts


def bucket_samples(lengths: np.ndarray, first_size: np.ndarray, max_buckets: int = MAX_BUCKETS) -> np.ndarray:
    """[n] bucket of each sample. Samples sorted by length are cut into runs of one smallest
    fitting size each, with the least bound on tokens lost to rounding up (each run's length short
    of its longest member, summed) that keeps the count within ``max_buckets``, found by bisection."""
    order = np.lexsort((-lengths, -first_size))
    sl = lengths[order].astype(np.float64)
    breaks = np.zeros(sl.shape[0], dtype=bool)
    breaks[1:] = first_size[order][1:] != first_size[order][:-1]
    lo, hi = 0.0, float(sl.sum()) + 1.0
    if len(_greedy_buckets(sl, breaks, lo)) > max_buckets:
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if len(_greedy_buckets(sl, breaks, mid)) > max_buckets:
                lo = mid
            else:
                hi = mid
    else:
        hi = lo
    starts = _greedy_buckets(sl, breaks, hi)
    label = np.zeros(sl.shape[0], dtype=np.int64)
    label[starts[1:]] = 1
    out = np.empty_like(label)
    out[order] = np.cumsum(label)
    return out


def build(tables: CostTables, hint: Assignment, max_buckets: int = MAX_BUCKETS, max_levels: int = MAX_LEVELS) -> GlobalModel:
    """The global model of ``tables`` around nothing but the starting plan's size and slowest micro-batch."""
    sizes = offered_sizes(tables)
    n_ranks = tables.n_ranks
    b = tables.group_constant
    capacity = float(tables.rank_capacity.min())
    times = placed_times(tables, sizes)
    first_size = np.searchsorted(np.floor(sizes * capacity), tables.lengths, side="left")
    bucket = bucket_samples(tables.lengths, first_size, max_buckets)
    n_q = int(bucket.max()) + 1
    members = []
    for q in range(n_q):
        idx = np.flatnonzero(bucket == q)
        members.append(idx[np.argsort(-times[idx, 0], kind="stable")])
    bucket_time = np.stack([times[m].max(axis=0) for m in members])
    lengths = tables.lengths
    bucket_tokens = np.array([int(lengths[m].max()) for m in members], dtype=np.int64)
    fits = bucket_tokens[:, None] <= np.floor(sizes[None, :] * capacity)
    j_of = {int(d): j for j, d in enumerate(sizes)}

    t_units = np.ceil(bucket_time / UNIT - 1e-9).astype(np.int64)
    b_units = int(math.ceil(b / UNIT - 1e-9))
    # The starting plan in bucket terms: per micro-batch its rounded time (units), per group its size and bucket counts.
    hint_groups: list[list[tuple[int, np.ndarray]]] = []
    hint_units: list[int] = []
    usable = True
    for mb in hint.micro_batches:
        groups = []
        worst = 0
        for ranks, samples in mb:
            j = j_of.get(len(ranks))
            if j is None:
                usable = False
                break
            counts = np.bincount(bucket[list(samples)], minlength=n_q)
            groups.append((j, counts))
            worst = max(worst, b_units + int(t_units[:, j] @ counts))
        hint_groups.append(groups)
        hint_units.append(worst)
        if not usable:
            break
    hint_times = [(u + 1) * UNIT for u in hint_units]
    single = np.where(fits, b + bucket_time, np.inf).min(axis=1)
    top = max(max(hint_times), float(single.max()))
    bottom = max(min(hint_times) / 2.0, float(single.min()))
    ratio = max(MIN_LEVEL_RATIO, (top / bottom) ** (1.0 / max(1, max_levels - 1)))
    count = max(1, int(math.ceil(math.log(top / bottom) / math.log(ratio))) + 1)
    levels = np.unique(np.minimum(bottom * ratio ** np.arange(count), top))
    levels[-1] = top

    n_hint = len(hint.micro_batches)
    m_min = int(math.ceil(float(lengths.sum()) / (n_ranks * capacity) - 1e-9))
    m_max = min(tables.problem.options.micro_batch_limit, n_hint + max(EXTRA_MICRO_BATCHES, n_hint // 2))
    m_max = max(m_max, m_min)

    # Start values (0 where the starting plan puts nothing).
    start_m = np.zeros(levels.shape[0], dtype=np.int64)
    start_g: dict[tuple[int, int], int] = {}
    start_x: dict[tuple[int, int, int], int] = {}
    if usable:
        level_units = np.floor(levels / UNIT + 1e-9).astype(np.int64)
        for groups, u in zip(hint_groups, hint_units, strict=True):
            k = min(int(np.searchsorted(level_units, u, side="left")), levels.shape[0] - 1)
            start_m[k] += 1
            for j, counts in groups:
                start_g[(k, j)] = start_g.get((k, j), 0) + 1
                for q in np.flatnonzero(counts):
                    start_x[(k, int(q), j)] = start_x.get((k, int(q), j), 0) + int(counts[q])

    milp = Milp()
    m_var = [milp.add_var(0, m_max, int(round(th / UNIT))) for th in levels]
    g_var: dict[tuple[int, int], int] = {}
    x_var: dict[tuple[int, int, int], int] = {}
    counts_q = np.array([m.shape[0] for m in members], dtype=np.int64)
    area = bucket_time * sizes[None, :]
    for k, th in enumerate(levels):
        room = int(math.floor(th / UNIT + 1e-9)) - b_units
        finish = fits & (t_units <= room)
        for q in range(n_q):
            ok = np.flatnonzero(finish[q])
            if ok.shape[0] == 0:
                continue
            least = float(area[q, ok].min())
            for j in ok:
                if area[q, j] <= AREA_SLACK * least or (k, q, int(j)) in start_x:
                    x_var[(k, q, int(j))] = milp.add_var(0, int(counts_q[q]))
        for j in range(sizes.shape[0]):
            if any((k, q, j) in x_var for q in range(n_q)):
                g_var[(k, j)] = milp.add_var(0, (n_ranks // int(sizes[j])) * m_max)
    if any(key not in x_var for key in start_x) or any(key not in g_var for key in start_g):
        usable = False  # the starting plan needs a pair the levels exclude (cannot happen when it is valid)
    # 1. every sample placed
    by_q: dict[int, list[int]] = {}
    for (_k, q, _j), c in x_var.items():
        by_q.setdefault(q, []).append(c)
    for q in range(n_q):
        milp.add_row(by_q.get(q, []), [1] * len(by_q.get(q, [])), float(counts_q[q]), float(counts_q[q]))
    # 2, 3. time and memory of each level's groups of one size
    pool: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for (k, q, j), c in x_var.items():
        pool.setdefault((k, j), []).append((q, c))
    for (k, j), items in pool.items():
        room = int(math.floor(levels[k] / UNIT + 1e-9)) - b_units
        g = g_var[(k, j)]
        milp.add_row([c for _, c in items] + [g], [int(t_units[q, j]) for q, _ in items] + [-room], -math.inf, 0.0)
        milp.add_row([c for _, c in items] + [g], [int(bucket_tokens[q]) for q, _ in items] + [-int(math.floor(sizes[j] * capacity))], -math.inf, 0.0)
    # 4. ranks per micro-batch
    for k in range(levels.shape[0]):
        js = [j for j in range(sizes.shape[0]) if (k, j) in g_var]
        if not js:
            milp.ub[m_var[k]] = 0
            continue
        milp.add_row([g_var[(k, j)] for j in js] + [m_var[k]], [int(sizes[j]) for j in js] + [-n_ranks], -math.inf, 0.0)
        for j in js:
            if n_ranks // int(sizes[j]) < 4:
                milp.add_row([g_var[(k, j)], m_var[k]], [1, -(n_ranks // int(sizes[j]))], -math.inf, 0.0)
    # 5. micro-batch count
    milp.add_row(m_var, [1] * len(m_var), float(m_min), float(m_max))

    model = GlobalModel(tables, sizes, members, bucket_time, bucket_tokens, levels, times, capacity, milp, m_var, g_var, x_var,
                        info={"m_min": m_min, "m_max": m_max, "start_feasible": False})
    if usable:
        start = [0] * milp.n_vars
        for k, v in enumerate(start_m):
            start[m_var[k]] = int(v)
        for key, v in start_g.items():
            start[g_var[key]] = v
        for key, v in start_x.items():
            start[x_var[key]] = v
        if milp.feasible(start):
            milp.start = start
            model.info["start_feasible"] = True
            model.info["start_objective_s"] = milp.objective(start) * UNIT
    return model


@dataclass
class _Group:
    mb: int
    j: int
    size: int
    load: float = 0.0  # seconds of samples (without the group constant)
    tokens: int = 0
    samples: list[int] = field(default_factory=list)


def decode(model: GlobalModel, x: list[int]) -> Assignment | None:
    """A plan from a model solution (see the module docstring), or None when it cannot be made one."""
    tables = model.tables
    b = tables.group_constant
    n_ranks = tables.n_ranks
    sizes = [int(d) for d in model.sizes]
    times = model.sample_time
    lengths = tables.lengths
    cap_tokens = [int(math.floor(d * model.capacity)) for d in sizes]
    max_mbs = tables.problem.options.micro_batch_limit
    # Micro-batches and their groups, level by level (largest groups first, to the micro-batch with the most free ranks).
    free: list[int] = []
    level_of: list[int] = []
    groups: list[_Group] = []
    pools: dict[tuple[int, int], list[_Group]] = {}
    for k, mv in enumerate(model.m_var):
        count = x[mv]
        if count == 0:
            continue
        mbs = list(range(len(free), len(free) + count))
        free.extend([n_ranks] * count)
        level_of.extend([k] * count)
        wanted = sorted(((j, x[g]) for (kk, j), g in model.g_var.items() if kk == k and x[g] > 0), key=lambda p: -sizes[p[0]])
        for j, n in wanted:
            for _ in range(n):
                m = max(mbs, key=lambda m: free[m])
                if free[m] < sizes[j]:
                    mbs.append(len(free))
                    free.append(n_ranks)
                    level_of.append(k)
                    m = mbs[-1]
                free[m] -= sizes[j]
                g = _Group(m, j, sizes[j])
                groups.append(g)
                pools.setdefault((k, j), []).append(g)
    # Samples of each bucket to the pools: slowest members to the highest levels.
    pool_samples: dict[tuple[int, int], list[int]] = {}
    for q, members in enumerate(model.members):
        wants = sorted(((k, j, x[c]) for (k, qq, j), c in model.x_var.items() if qq == q and x[c] > 0), key=lambda p: (-p[0], p[1]))
        pos = 0
        for k, j, n in wants:
            pool_samples.setdefault((k, j), []).extend(members[pos:pos + n].tolist())
            pos += n
        if pos != members.shape[0]:
            return None
    leftover: list[int] = []
    for key, samples in pool_samples.items():
        pool = pools.get(key, [])
        j = key[1]
        for i in sorted(samples, key=lambda i: -times[i, j]):
            room = [g for g in pool if g.tokens + lengths[i] <= cap_tokens[j]]
            if not room:
                leftover.append(i)
                continue
            g = min(room, key=lambda g: g.load)
            g.load += float(times[i, j])
            g.tokens += int(lengths[i])
            g.samples.append(i)
    mb_time = [0.0] * len(free)
    for g in groups:
        if g.samples:
            mb_time[g.mb] = max(mb_time[g.mb], b + g.load)
    # Samples that did not fit their pool: where they lengthen a micro-batch least.
    for i in sorted(leftover, key=lambda i: -int(lengths[i])):
        best: tuple[float, float] | None = None
        choice: tuple[str, object] | None = None
        for g in groups:
            if g.tokens + lengths[i] > cap_tokens[g.j]:
                continue
            t = b + g.load + float(times[i, g.j])
            key = (max(0.0, t - mb_time[g.mb]), t)
            if best is None or key < best:
                best, choice = key, ("group", g)
        fitting = [j for j, d in enumerate(sizes) if lengths[i] <= cap_tokens[j]]
        for m in range(len(free)):
            for j in fitting:
                if sizes[j] <= free[m]:
                    t = b + float(times[i, j])
                    key = (max(0.0, t - mb_time[m]), t)
                    if best is None or key < best:
                        best, choice = key, ("free", (m, j))
        if choice is None:
            if len(free) >= max_mbs or not fitting:
                return None
            free.append(n_ranks)
            level_of.append(-1)
            mb_time.append(0.0)
            choice = ("free", (len(free) - 1, fitting[0]))
        if choice[0] == "group":
            g = choice[1]  # type: ignore[assignment]
        else:
            m, j = choice[1]  # type: ignore[misc]
            free[m] -= sizes[j]
            g = _Group(m, j, sizes[j])
            groups.append(g)
        g.load += float(times[i, g.j])
        g.tokens += int(lengths[i])
        g.samples.append(i)
        mb_time[g.mb] = max(mb_time[g.mb], b + g.load)
    used = sorted({g.mb for g in groups if g.samples})
    if len(used) > max_mbs:
        return None
    out = []
    for m in used:
        mine = [g for g in groups if g.mb == m and g.samples]
        ranks, _ = place_groups([g.size for g in mine], tables.node_ranges)
        if ranks is None:
            return None
        out.append([(r, g.samples) for r, g in zip(ranks, mine, strict=True)])
    return Assignment.of(out)
