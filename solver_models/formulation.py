"""The slot model: data shared by every exact backend (CP-SAT and the PuLP MILPs).

A *slot* is a group that may be opened: a size d, a micro-batch m and a place (one node, or
"spanning": ranks of several nodes, charged with the inter-node bandwidth and the slowest speed).
Identical slots form a *class*; samples with the same cost row form an *item* (a bucket) with a count.
The model emits its variables, objective and rows once (:meth:`SlotModel.variables`,
:meth:`SlotModel.objective`, :meth:`SlotModel.rows`); each backend translates them into its library;
:meth:`SlotModel.decode` turns the values back into an :class:`Assignment`.

Notation (all times are integers of ``UNIT`` seconds, rounded up, so a model time is never below
the true time):

- m = 1..M micro-batches; P pools: the free ranks of one node in one micro-batch (R_p ranks), and
  F_m = all free ranks of micro-batch m;
- slots s with size d_s, token capacity K_s = C_s d_s, micro-batch m(s), pool p(s) (none when the
  slot spans nodes);
- items q with count c_q, tokens L_q, time t_qs on slot s (max over the bucket's members);
- b_s the group constant of slot s (the profile's b, plus the latency of the group's messages for
  its size and place when the profile has ``comm.group_messages``); T0_m the slowest group of
  micro-batch m that the model keeps fixed.

Variables: y_s in {0,1} (slot open), x_qs in {0..c_q} (members of q on s), T_m >= T0_m.

Objective: minimise sum_m T_m.

Constraints:

1. every sample in exactly one group: sum_s x_qs = c_q;
2. slot time within its micro-batch: b_s y_s + sum_q t_qs x_qs <= T_m(s);
3. memory per rank, and x only on open slots: sum_q L_q x_qs <= K_s y_s;
4. node capacity: sum_{s in p} d_s y_s <= R_p, and micro-batch capacity:
   sum_{s in m} d_s y_s <= |F_m| (spanning slots take any free ranks of their micro-batch);
5. symmetry breaking between identical slots of a class: y_s >= y_s' and load_s >= load_s'
   (s before s'), and between interchangeable micro-batches: T_m >= T_m+1;
6. area, in models without a tie-break (solved for a proof): sum_{s in m} d_s load_s <= |F_m| T_m,
   load_s = b_s y_s + sum_q t_qs x_qs. Implied by rows 2 and 4 for integer values (an open slot holds
   d_s free ranks for at most T_m), not for the LP relaxation, which without it spreads fractions of
   samples over many slots of tiny load: on a 16-sample video batch on 8 ranks (analytical profile, 8
   micro-batches) CP-SAT's bound after 110 s rose from 0.198 s to 1.387 s with it, the plan 1.390 s.

Pairs (q, s) exist only where the item fits the slot's memory (L_q <= K_s) and finishes within the
incumbent (b_s + t_qs <= the hint's step time): a better plan never uses the others.

Two builders share this data: :func:`full_model` frees every rank of every micro-batch, with every
allowed size inside each node and across nodes (exact on homogeneous clusters, up to the rounding
of times to units, see :func:`rounding_slack`; buckets hold identical samples only), and
:func:`neighbourhood_model` frees a few groups of an incumbent plan and keeps the rest
(the large-neighbourhood search of :mod:`solver_models.lns`; buckets join samples within 1%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from optimizer.costs.tables import CostTables
from optimizer.plan.records import Assignment

UNIT = 1e-7
"""Seconds per integer time unit of the models."""
BUCKET_TOLERANCE = 0.01
"""Samples whose time and tokens agree within this share join one bucket (neighbourhood models)."""

TIEBREAK = 64
"""K of the neighbourhood objective: one unit of step time outweighs K units of the slowest freed group."""

Group = tuple[tuple[int, ...], tuple[int, ...]]


def to_units(seconds: float) -> int:
    return int(math.ceil(seconds / UNIT - 1e-6))


@dataclass
class SlotClass:
    m: int
    pool: int  # index into SlotModel.pools, -1 for a spanning class
    j: int  # index into tables.degrees
    d: int
    intra: bool
    speed: float
    capacity: float  # tokens per rank
    slots: list[int] = field(default_factory=list)


@dataclass
class Pool:
    m: int
    node: int
    ranks: list[int]


Var = tuple  # ("y", s), ("x", q, s), ("T", m) or ("U", m)


@dataclass(frozen=True)
class Row:
    """One linear constraint: sum of coefficient x variable, ``sense`` (``<=``, ``>=``, ``==``), ``rhs``."""

    terms: tuple[tuple[Var, int], ...]
    sense: str
    rhs: int
    kind: str  # count, time, memory, ranks or order


@dataclass
class SlotModel:
    """Everything a backend needs to build the model of the module docstring."""

    n_mb: int
    b: int  # the profile's group constant b in units (the least b_s)
    classes: list[SlotClass]
    slot_class: list[int]
    slot_m: list[int]
    slot_d: list[int]
    slot_cap: list[int]  # K_s tokens
    pools: list[Pool]
    mb_ranks: list[list[int]]  # F_m
    items: list[list[int]]  # members of each item
    item_tokens: list[int]
    arcs: list[tuple[int, int, int]]  # (q, s, t_qs)
    floor: list[int]  # T0_m
    fixed: list[list[Group]]  # groups kept as they are, per micro-batch
    symmetric_mbs: bool
    exact: bool
    upper: int  # the incumbent's objective in units (for pruning and as a cutoff)
    hint_y: list[int] = field(default_factory=list)
    hint_x: dict[tuple[int, int], int] = field(default_factory=dict)
    hint_t: list[int] = field(default_factory=list)
    node_of_rank: list[int] = field(default_factory=list)
    offset: float = 0.0  # seconds of the micro-batches outside the model (added to its objective)
    tiebreak: int = 0  # K > 0: minimise K sum_m T_m + sum_m U_m, U_m the slowest freed slot (see neighbourhood_model)
    slot_b: list[int] = field(default_factory=list)  # b_s in units

    def b_of(self, s: int) -> int:
        """b_s: the group constant of slot s in units."""
        return self.slot_b[s] if self.slot_b else self.b

    @property
    def n_slots(self) -> int:
        return len(self.slot_class)

    def item_count(self, q: int) -> int:
        return len(self.items[q])

    def pairs_by_item(self) -> list[list[tuple[int, int]]]:
        """(slot, time) of each item's pairs (constraint 1)."""
        out: list[list[tuple[int, int]]] = [[] for _ in self.items]
        for q, s, t in self.arcs:
            out[q].append((s, t))
        return out

    def pairs_by_slot(self) -> list[list[tuple[int, int]]]:
        """(item, time) of each slot's pairs (constraints 2 and 3)."""
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.n_slots)]
        for q, s, t in self.arcs:
            out[s].append((q, t))
        return out

    def capacity_rows(self) -> list[tuple[list[int], int]]:
        """(slots, ranks) of constraint 4: sum of d_s y_s over the slots <= ranks, per pool and per micro-batch."""
        by_pool: list[list[int]] = [[] for _ in self.pools]
        by_mb: list[list[int]] = [[] for _ in range(self.n_mb)]
        for cls in self.classes:
            if cls.pool >= 0:
                by_pool[cls.pool].extend(cls.slots)
            by_mb[cls.m].extend(cls.slots)
        rows = [(slots, len(pool.ranks)) for slots, pool in zip(by_pool, self.pools, strict=True) if slots]
        rows += [(slots, len(self.mb_ranks[m])) for m, slots in enumerate(by_mb) if slots]
        return rows

    def identical_pairs(self) -> list[tuple[int, int]]:
        """Consecutive slots of one class (constraint 5: the first opens first and carries more)."""
        return [(a, b) for cls in self.classes for a, b in zip(cls.slots, cls.slots[1:], strict=False)]

    def variables(self) -> list[tuple[Var, int, int]]:
        """Every variable as (key, lower, upper) in model units: ``("y", s)`` binary, ``("x", q, s)``
        integer up to c_q, ``("T", m)`` and, with a tie-break, ``("U", m)``."""
        top = model_ceiling(self)
        out: list[tuple[Var, int, int]] = [(("y", s), 0, 1) for s in range(self.n_slots)]
        out += [(("x", q, s), 0, self.item_count(q)) for q, s, _ in self.arcs]
        out += [(("T", m), self.floor[m], top) for m in range(self.n_mb)]
        if self.tiebreak:
            out += [(("U", m), 0, top) for m in range(self.n_mb)]
        return out

    def objective(self) -> list[tuple[Var, int]]:
        """The objective's terms (minimised): sum_m T_m, or K sum_m T_m + sum_m U_m with a tie-break."""
        if self.tiebreak:
            return [(("T", m), self.tiebreak) for m in range(self.n_mb)] + [(("U", m), 1) for m in range(self.n_mb)]
        return [(("T", m), 1) for m in range(self.n_mb)]

    def rows(self) -> list[Row]:
        """Constraints 1-5 of the module docstring, in the order every backend adds them; coefficients
        are integers of model units. ``kind`` says what a row measures, so a backend can rescale it
        (``time`` rows in UNIT seconds, ``memory`` rows in tokens)."""
        out: list[Row] = []
        ceiling = "U" if self.tiebreak else "T"
        if self.tiebreak:
            out += [Row(((("U", m), 1), (("T", m), -1)), "<=", 0, "time") for m in range(self.n_mb)]
        # 1. every sample in exactly one group
        for q, pairs in enumerate(self.pairs_by_item()):
            out.append(Row(tuple((("x", q, s), 1) for s, _ in pairs), "==", self.item_count(q), "count"))
        loads: list[tuple[tuple[Var, int], ...]] = []
        for s, pairs in enumerate(self.pairs_by_slot()):
            load = ((("y", s), self.b_of(s)), *((("x", q, s), t) for q, t in pairs))
            loads.append(load)
            # 2. slot time within its micro-batch (through U_m in a neighbourhood model)
            out.append(Row((*load, ((ceiling, self.slot_m[s]), -1)), "<=", 0, "time"))
            # 3. memory per rank; x only on open slots
            out.append(
                Row(
                    (*((("x", q, s), self.item_tokens[q]) for q, _ in pairs), (("y", s), -self.slot_cap[s])),
                    "<=",
                    0,
                    "memory",
                )
            )
        # 4. node and micro-batch capacity
        for slots, ranks in self.capacity_rows():
            out.append(Row(tuple((("y", s), self.slot_d[s]) for s in slots), "<=", ranks, "ranks"))
        # 5. symmetry: identical slots open in order with falling loads; interchangeable micro-batches by time
        for a, b in self.identical_pairs():
            out.append(Row(((("y", a), 1), (("y", b), -1)), ">=", 0, "order"))
            out.append(Row((*loads[a], *((v, -c) for v, c in loads[b])), ">=", 0, "time"))
        if self.symmetric_mbs:
            out += [Row(((("T", m), 1), (("T", m + 1), -1)), ">=", 0, "time") for m in range(self.n_mb - 1)]
        if self.tiebreak:  # a neighbourhood: solved for a good answer fast, without the LP that row 6 tightens
            return out
        # 6. area: the rank-seconds of a micro-batch's slots fit in its free ranks for T_m
        by_mb: list[list[int]] = [[] for _ in range(self.n_mb)]
        for s, m in enumerate(self.slot_m):
            by_mb[m].append(s)
        for m, slots in enumerate(by_mb):
            if slots:
                area = tuple((v, self.slot_d[s] * c) for s in slots for v, c in loads[s])
                out.append(Row((*area, (("T", m), -len(self.mb_ranks[m]))), "<=", 0, "time"))
        return out

    def size(self) -> dict[str, int]:
        return {
            "slots": self.n_slots,
            "items": len(self.items),
            "samples": sum(len(m) for m in self.items),
            "pairs": len(self.arcs),
            "micro_batches": self.n_mb,
        }

    def decode(self, x: dict[tuple[int, int], int]) -> list[list[Group]]:
        """The groups of every micro-batch of the model for the values ``x`` (open slots are those with
        members), fixed groups included.

        A spanning slot was charged the inter-node time: it gets ranks of at least two nodes whenever the
        free ranks left allow it (the plan then costs what the model said; a group that still lands inside
        one node is evaluated as such, and the planner compares the plan with the bound itself).
        """
        members: dict[int, list[int]] = {}
        queues = [list(ms) for ms in self.items]
        for (q, s), v in sorted(x.items()):
            if v > 0:
                take, queues[q] = queues[q][:v], queues[q][v:]
                members.setdefault(s, []).extend(take)
        mbs: list[list[Group]] = [list(self.fixed[m]) for m in range(self.n_mb)]
        free_by_pool = [sorted(p.ranks) for p in self.pools]
        spanning: list[list[int]] = [[] for _ in range(self.n_mb)]
        # Intra-node slots take consecutive free ranks of their node, largest first.
        for c in sorted(range(len(self.classes)), key=lambda c: -self.classes[c].d):
            cls = self.classes[c]
            for s in cls.slots:
                if not members.get(s):
                    continue
                if cls.pool < 0:
                    spanning[cls.m].append(s)
                    continue
                free = free_by_pool[cls.pool]
                ranks, free_by_pool[cls.pool] = tuple(free[: cls.d]), free[cls.d :]
                mbs[cls.m].append((ranks, tuple(members[s])))
        # Spanning slots take the free ranks left, from the nodes with most free ranks first.
        for m in range(self.n_mb):
            if not spanning[m]:
                continue
            left = sorted(
                (p for p in range(len(self.pools)) if self.pools[p].m == m), key=lambda p: -len(free_by_pool[p])
            )
            rest = [r for p in left for r in free_by_pool[p]]
            rest += sorted(
                set(self.mb_ranks[m])
                - {r for p in range(len(self.pools)) if self.pools[p].m == m for r in self.pools[p].ranks}
            )
            for s in sorted(spanning[m], key=lambda s: -self.classes[self.slot_class[s]].d):
                d = self.classes[self.slot_class[s]].d
                take = _spanning_pick(rest, d, self.node_of_rank)
                rest = [r for r in rest if r not in take]
                mbs[m].append((tuple(sorted(take)), tuple(members[s])))
        return mbs


def _spanning_pick(free: list[int], d: int, node_of: list[int]) -> list[int]:
    """``d`` of the ``free`` ranks (kept in order), on at least two nodes when ``free`` has two."""
    take = list(free[:d])
    if len(take) == d and len({node_of[r] for r in take}) == 1:
        other = next((r for r in free[d:] if node_of[r] != node_of[take[0]]), None)
        if other is not None and d >= 2:
            take[-1] = other
    return take


# -- building ---------------------------------------------------------------------------------


class _Builder:
    def __init__(self, tables: CostTables, upper_s: float, exact: bool) -> None:
        self.t = tables
        self.b_s = tables.group_constant
        self.upper_s = upper_s
        self.exact = exact
        self.node_of = tables.rank_node.tolist()
        self.speed = tables.rank_speed.tolist()
        self.cap = tables.rank_capacity.tolist()
        self.degrees = [int(d) for d in tables.degrees]
        self.node_size = tables.node_size
        self.classes: list[SlotClass] = []
        self.slot_class: list[int] = []
        self.pools: list[Pool] = []

    def add_class(self, m: int, pool: int, j: int, ranks: list[int], count: int, intra: bool) -> int:
        d = self.degrees[j]
        speed = min(self.speed[r] for r in ranks)
        cap = min(self.cap[r] for r in ranks)
        cls = SlotClass(m, pool, j, d, intra, speed, cap)
        c = len(self.classes)
        for _ in range(count):
            cls.slots.append(len(self.slot_class))
            self.slot_class.append(c)
        self.classes.append(cls)
        return c

    def add_pools(self, m: int, free: list[int], sizes_for: dict[int, list[tuple[int, int]]] | None) -> None:
        """Pools of micro-batch m (one per node) and their intra-node classes.

        ``sizes_for`` maps a node to (degree index, count) pairs; None means every size that fits.
        """
        by_node: dict[int, list[int]] = {}
        for r in free:
            by_node.setdefault(self.node_of[r], []).append(r)
        for node, ranks in sorted(by_node.items()):
            p = len(self.pools)
            self.pools.append(Pool(m, node, ranks))
            if sizes_for is None:
                choice = [
                    (j, len(ranks) // d) for j, d in enumerate(self.degrees) if d <= min(len(ranks), self.node_size)
                ]
            else:
                choice = [(j, min(k, len(ranks) // self.degrees[j])) for j, k in sizes_for.get(node, [])]
            for j, count in choice:
                if count > 0:
                    self.add_class(m, p, j, ranks, count, True)

    def add_spanning(self, m: int, free: list[int], sizes: list[tuple[int, int]] | None) -> None:
        """Spanning classes of micro-batch m; None means every size from 2 when there are several nodes."""
        several = len({self.node_of[r] for r in free}) > 1
        if sizes is None:
            sizes = [(j, len(free) // d) for j, d in enumerate(self.degrees) if 2 <= d <= len(free) and several]
        for j, count in sizes:
            count = min(count, len(free) // self.degrees[j])
            if count > 0 and several:
                self.add_class(m, -1, j, free, count, False)

    def items(self, samples: list[int]) -> tuple[list[list[int]], list[int], np.ndarray]:
        """Buckets of ``samples``: identical rows (exact) or within BUCKET_TOLERANCE, and their tokens."""
        lengths = self.t.lengths
        base = self.t.time_matrix(True, 1.0)[:, 0]
        keys: dict[tuple, list[int]] = {}
        for i in samples:
            if self.exact:
                key: tuple = (int(lengths[i]), float(self.t.vision[i]))
            else:
                step = math.log1p(BUCKET_TOLERANCE)
                key = (int(math.log(max(base[i], 1e-12)) // step), int(math.log(max(int(lengths[i]), 1)) // step))
            keys.setdefault(key, []).append(i)
        items = [sorted(v) for v in keys.values()]
        items.sort(key=lambda v: v[0])
        tokens = [int(lengths[v].max()) for v in items]
        return items, tokens, np.array([v[0] for v in items])

    def finish(
        self,
        n_mb: int,
        mb_ranks: list[list[int]],
        samples: list[int],
        floor_s: list[float],
        fixed: list[list[Group]],
        symmetric: bool,
        offset: float,
    ) -> SlotModel:
        items, tokens, _ = self.items(samples)
        b = to_units(self.b_s)
        class_b = [to_units(float(self.t.group_constants(cls.intra)[cls.j])) for cls in self.classes]
        upper = to_units(self.upper_s)
        arcs: list[tuple[int, int, int]] = []
        columns: dict[tuple[bool, float], np.ndarray] = {}
        slot_m, slot_d, slot_cap = [], [], []
        for c in self.slot_class:
            cls = self.classes[c]
            slot_m.append(cls.m)
            slot_d.append(cls.d)
            slot_cap.append(
                int(math.floor(cls.capacity * cls.d * (1 + 1e-9)))
            )  # the verifier's tolerance: no plan it accepts is cut off
        for c, cls in enumerate(self.classes):
            key = (cls.intra, cls.speed)
            if key not in columns:
                columns[key] = self.t.time_matrix(*key)
            col = columns[key][:, cls.j]
            for q, members in enumerate(items):
                if tokens[q] > cls.capacity * cls.d * (1 + 1e-9):
                    continue
                tq = to_units(float(col[members].max()))
                if class_b[c] + tq > upper + 2:
                    continue
                for s in cls.slots:
                    arcs.append((q, s, tq))
        return SlotModel(
            n_mb=n_mb,
            b=b,
            classes=self.classes,
            slot_class=self.slot_class,
            slot_m=slot_m,
            slot_d=slot_d,
            slot_cap=slot_cap,
            pools=self.pools,
            mb_ranks=mb_ranks,
            items=items,
            item_tokens=tokens,
            arcs=arcs,
            floor=[to_units(f) if f > 0 else 0 for f in floor_s],
            fixed=fixed,
            symmetric_mbs=symmetric,
            exact=self.exact,
            upper=upper,
            offset=offset,
            node_of_rank=self.node_of,
            slot_b=[class_b[c] for c in self.slot_class],
        )


def model_ceiling(model: SlotModel) -> int:
    """Largest micro-batch time a model needs (the incumbent, its floors and the rounding of its items)."""
    return max([model.upper, *model.floor]) + sum(len(m) for m in model.items) + 2


def rounding_slack(model: SlotModel) -> float:
    """Seconds by which rounding up can raise a plan's model objective above its true step time.

    Each micro-batch's time is one slot's load: the group constant and its samples' times, each
    rounded up by less than a unit, so the sum over micro-batches gains less than (samples + micro-batches) units.
    """
    return (sum(len(m) for m in model.items) + model.n_mb) * UNIT


def full_model(tables: CostTables, hint: Assignment | None, upper_s: float) -> SlotModel:
    """Every rank of every micro-batch free, every allowed size, up to max_micro_batches (exact).

    ``hint`` may be None (no plan known; ``upper_s`` must then be above any group's time).
    """
    n = tables.n_samples
    n_mb = max(len(hint.micro_batches) if hint else 0, min(tables.problem.options.micro_batch_limit, n))
    bld = _Builder(tables, upper_s, exact=True)
    everything = list(range(tables.n_ranks))
    for m in range(n_mb):
        bld.add_pools(m, everything, None)
        bld.add_spanning(m, everything, None)
    model = bld.finish(n_mb, [everything] * n_mb, list(range(n)), [0.0] * n_mb, [[] for _ in range(n_mb)], True, 0.0)
    if hint is not None:
        by_time = sorted(hint.micro_batches, key=lambda mb: -max(tables.group_time(list(s), r) for r, s in mb))
        _hint_from_groups(model, tables, [list(mb) for mb in by_time])
    return model


def neighbourhood_model(
    tables: CostTables, current: list[list[Group]], free: list[list[int]], upper_s: float, resize: bool
) -> SlotModel:
    """Free the groups ``free[m]`` (indices into ``current[m]``) and keep the others.

    Objective: K sum_m T_m + sum_m U_m with U_m >= every freed slot's time in m and T_m >= U_m,
    T_m >= T0_m: the step time first, then the slowest freed group, so that a round also helps
    when other groups as slow as the freed one keep the step time where it is (a plateau).

    The freed ranks of each node form a pool whose candidate sizes are the freed groups' sizes,
    their neighbours in the allowed list, 1 and the powers of two (``resize``), or exactly the
    freed groups (not ``resize``). Micro-batches without freed groups stay outside the model
    (their time is the model's ``offset``).
    """
    bld = _Builder(tables, upper_s, exact=False)
    touched = [m for m in range(len(current)) if free[m]]
    fixed: list[list[Group]] = []
    floor: list[float] = []
    mb_ranks: list[list[int]] = []
    samples: list[int] = []
    freed_groups: list[list[Group]] = []
    offset = 0.0
    for m in range(len(current)):
        if m not in touched:
            offset += max((tables.group_time(list(s), r) for r, s in current[m]), default=0.0)
    pow2 = {j for j, d in enumerate(bld.degrees) if d & (d - 1) == 0}
    for k, m in enumerate(touched):
        keep = [g for i, g in enumerate(current[m]) if i not in free[m]]
        gone = [g for i, g in enumerate(current[m]) if i in free[m]]
        used = {rr for r, _ in keep for rr in r}
        ranks = [r for r in range(tables.n_ranks) if r not in used]
        fixed.append(keep)
        freed_groups.append(gone)
        floor.append(max((tables.group_time(list(s), r) for r, s in keep), default=0.0))
        mb_ranks.append(ranks)
        samples.extend(i for _, s in gone for i in s)
        sizes: dict[int, dict[int, int]] = {}
        span: dict[int, int] = {}
        for r, _ in gone:
            j = tables.degree_index[len(r)]
            intra, _, _ = tables.group_span(r)
            if not intra:
                span[j] = span.get(j, 0) + 1
            else:
                node = bld.node_of[r[0]]
                sizes.setdefault(node, {})
                sizes[node][j] = sizes[node].get(j, 0) + 1
        if resize:  # idle ranks of untouched nodes may take samples too
            for rank in ranks:
                sizes.setdefault(bld.node_of[rank], {})
        for node, counts in sizes.items():
            if resize:
                room = sum(1 for rank in ranks if bld.node_of[rank] == node)
                wanted = set(counts) | {0} | {j for j in pow2 if bld.degrees[j] <= room}
                for j in list(counts):
                    wanted |= {j - 1, j + 1}
                counts_r = {
                    j: counts.get(j, 0) + (room if j == 0 else 1)
                    for j in wanted
                    if 0 <= j < len(bld.degrees) and bld.degrees[j] <= min(room, bld.node_size)
                }
                sizes[node] = counts_r
        bld.add_pools(k, ranks, {node: sorted(c.items()) for node, c in sizes.items()})
        if span:
            wanted_span = dict(span)
            if resize:
                for j, _c in span.items():
                    for jj in (j - 1, j + 1):
                        if 0 <= jj < len(bld.degrees):
                            wanted_span[jj] = wanted_span.get(jj, 0) + 1
            bld.add_spanning(k, ranks, sorted(wanted_span.items()))
    model = bld.finish(len(touched), mb_ranks, samples, floor, fixed, False, offset)
    model.tiebreak = TIEBREAK
    _hint_from_groups(model, tables, freed_groups)
    return model


def _hint_from_groups(model: SlotModel, tables: CostTables, groups: list[list[Group]]) -> None:
    """Map the incumbent's groups onto slots (heaviest group to the first slot of its class)."""
    item_of = {i: q for q, ms in enumerate(model.items) for i in ms}
    pair_time = {(q, s): t for q, s, t in model.arcs}
    by_key: dict[tuple[int, int, int], list[int]] = {}
    pool_of = {(p.m, p.node): k for k, p in enumerate(model.pools)}
    for cls in model.classes:
        by_key[(cls.m, cls.pool, cls.d)] = list(cls.slots)
    y = [0] * model.n_slots
    x: dict[tuple[int, int], int] = {}
    t_mb = list(model.floor)
    complete = True
    for m, mb in enumerate(groups):
        loads = sorted(mb, key=lambda g: -tables.group_time(list(g[1]), g[0]))
        for ranks, samples in loads:
            if not samples:
                continue
            intra, _, _ = tables.group_span(ranks)
            if not intra:
                pool = -1
            else:
                pool = pool_of.get((m, int(tables.rank_node[ranks[0]])), -2)
            free_slots = by_key.get((m, pool, len(ranks)), [])
            if not free_slots:
                complete = False
                continue
            s = free_slots.pop(0)
            y[s] = 1
            load = model.b_of(s)
            for i in samples:
                q = item_of[i]
                if (q, s) not in pair_time:
                    complete = False
                    continue
                x[(q, s)] = x.get((q, s), 0) + 1
                load += pair_time[(q, s)]
            t_mb[m] = max(t_mb[m], load)
    model.hint_y, model.hint_x, model.hint_t = y, x, t_mb
    if not complete:
        model.hint_x = {}
