"""Moving a plan's groups onto the communicators a job already has.

A request may list the rank groups the job already holds communicators for (``existing_groups``);
creating another costs time and device memory. ``options.group_reuse`` says what to do with them:

- ``ignore``: plan as if there were none (the new groups are still listed and costed);
- ``prefer``: after planning, move each group that is not an existing one onto an existing group of
  the same size when that is free in its micro-batch and does not make the micro-batch slower, or
  when the slowdown is smaller than ``options.new_group_cost_s`` saved by not creating the group;
  when no group of its size qualifies, onto an existing group of another size on the same terms
  (a larger one only while the micro-batch has that many ranks to spare);
  when new groups remain and they cost something, the planning layer also plans on the existing
  groups alone (as for ``only``) and keeps the one with the smaller step time plus group cost
  (:mod:`planning.existing_groups`);
- ``only``: every group of two or more ranks must be an existing group. The planners then only
  use the sizes the existing groups have (:func:`optimizer.problem.degrees.allowed_degrees`), and here every
  group is moved onto an existing group of its size; a group that finds none free in its
  micro-batch moves to another micro-batch that has one (or a new one, up to
  ``options.max_micro_batches``).

Single ranks need no communicator and are put on whichever ranks are left. The plan reports its new
groups and their cost (``new_communicators``, ``group_setup_s`` = cost x count); the verifier
recomputes both and checks the ``only`` rule.
"""

from __future__ import annotations

from collections.abc import Sequence

from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.group_sets import active, existing_set, new_communicators
from optimizer.plan.records import Assignment, GroupAssignment

Ranks = tuple[int, ...]


def objective(tables: CostTables, assignment: Assignment) -> float:
    """Step time plus the cost of the new communicators the assignment needs."""
    step = assignment_step_time(tables, assignment)
    groups = (r for mb in assignment.micro_batches for r, _ in mb)
    return step + tables.problem.options.new_group_cost_s * len(new_communicators(tables.problem, groups))


def adapt(tables: CostTables, assignment: Assignment) -> Assignment:
    """The assignment with its groups moved onto existing ones as ``options.group_reuse`` asks (for
    ``prefer`` only when that does not cost more; the planning layer may still compare a plan on the
    existing groups alone, :func:`planning.existing_groups.reuse_groups`)."""
    problem = tables.problem
    if not active(problem):
        return assignment
    only = problem.options.group_reuse == "only"
    have = existing_set(problem)
    by_size: dict[int, list[Ranks]] = {}
    for g in sorted(have):
        by_size.setdefault(len(g), []).append(g)
    paid: set[Ranks] = set()
    mbs: list[list[GroupAssignment]] = []
    leftovers: list[tuple[int, tuple[int, ...]]] = []
    for mb in assignment.micro_batches:
        groups, left = _remap(tables, mb, have, by_size, paid, only)
        mbs.append(groups)
        leftovers.extend(left)
    if leftovers:
        _place_leftovers(tables, mbs, leftovers, by_size)
    result = Assignment(tuple(tuple(mb) for mb in mbs if mb))
    if only:
        return result
    if objective(tables, result) > objective(tables, assignment) * (1 + 1e-12):
        result = assignment
    return result


def _fits(tables: CostTables, ranks: Ranks, samples: Sequence[int]) -> bool:
    _, _, capacity = tables.group_span(ranks)
    return float(tables.lengths[list(samples)].sum()) / len(ranks) <= capacity * (1 + 1e-9) if samples else True


def _remap(
    tables: CostTables,
    mb: Sequence[GroupAssignment],
    have: set[Ranks],
    by_size: dict[int, list[Ranks]],
    paid: set[Ranks],
    only: bool,
) -> tuple[list[GroupAssignment], list[tuple[int, tuple[int, ...]]]]:
    cost = tables.problem.options.new_group_cost_s
    out: list[GroupAssignment] = []
    used: set[int] = set()
    for ranks, samples in mb:
        if len(ranks) >= 2 and tuple(sorted(ranks)) in have:
            out.append((tuple(sorted(ranks)), samples))
            used.update(ranks)
    slowest = max((tables.group_time(list(s), r) for r, s in mb), default=0.0)
    spare = tables.n_ranks - sum(len(r) for r, _ in mb)  # ranks no group of the micro-batch holds
    movable = [(r, s) for r, s in mb if len(r) >= 2 and tuple(sorted(r)) not in have]
    movable.sort(key=lambda g: (-len(g[0]), -tables.group_time(list(g[1]), g[0])))
    singles = [(r, s) for r, s in mb if len(r) == 1]
    leftovers: list[tuple[int, tuple[int, ...]]] = []
    pending: list[GroupAssignment] = []
    for ranks, samples in movable:
        d = len(ranks)
        cands = [e for e in by_size.get(d, []) if used.isdisjoint(e) and _fits(tables, e, samples)]
        best = min(cands, key=lambda e: tables.group_time(list(samples), e)) if cands else None
        if only:
            if best is None:
                leftovers.append((d, samples))
                continue
            out.append((best, samples))
            used.update(best)
            continue
        key = tuple(sorted(ranks))
        keep_cost = max(slowest, tables.group_time(list(samples), ranks)) + (0.0 if key in paid else cost)
        if best is None or (used.isdisjoint(ranks) and tables.group_time(list(samples), best) > keep_cost):
            other = _other_size(tables, by_size, d, used, samples, spare, keep_cost)
            best = other if other is not None else (best if best is not None and not used.isdisjoint(ranks) else None)
        if best is not None:
            out.append((best, samples))
            used.update(best)
            spare -= len(best) - d
        else:
            pending.append((ranks, samples))
    # Groups that keep new ranks: their own ranks if still free, else free ranks placed together.
    for ranks, samples in pending:
        if used.isdisjoint(ranks):
            chosen = tuple(ranks)
        else:
            chosen = _free_block(tables, used, len(ranks))
        paid.add(tuple(sorted(chosen)))
        out.append((chosen, samples))
        used.update(chosen)
    for ranks, samples in singles:
        if ranks[0] in used:
            free = [r for r in range(tables.n_ranks) if r not in used]
            ranks = (min(free, key=lambda r: tables.group_time(list(samples), (r,))),)
        out.append((tuple(ranks), samples))
        used.update(ranks)
    return out, leftovers


def _other_size(
    tables: CostTables,
    by_size: dict[int, list[Ranks]],
    d: int,
    used: set[int],
    samples: Sequence[int],
    spare: int,
    limit: float,
) -> Ranks | None:
    """The fastest free existing group of a size other than d (larger by at most ``spare`` ranks)
    that holds ``samples`` within ``limit`` seconds, or None."""
    best, best_t = None, limit
    for size, groups in by_size.items():
        if size == d or size - d > spare or size not in tables.degree_index:
            continue
        for e in groups:
            if used.isdisjoint(e) and _fits(tables, e, samples):
                t = tables.group_time(list(samples), e)
                if t <= best_t:
                    best, best_t = e, t
    return best


def _free_block(tables: CostTables, used: set[int], d: int) -> Ranks:
    """d free ranks, inside one node where one has room, else from the nodes with most free ranks."""
    per_node = [[r for r in range(a, b) if r not in used] for a, b in tables.node_ranges]
    room = [free for free in per_node if len(free) >= d]
    if room:
        return tuple(min(room, key=len)[:d])
    ranks: list[int] = []
    for free in sorted(per_node, key=len, reverse=True):
        ranks.extend(free[: d - len(ranks)])
        if len(ranks) == d:
            break
    return tuple(sorted(ranks))


def _place_leftovers(
    tables: CostTables,
    mbs: list[list[GroupAssignment]],
    leftovers: list[tuple[int, tuple[int, ...]]],
    by_size: dict[int, list[Ranks]],
) -> None:
    """Put groups that found no free existing group where they cost least.

    First as a whole, on a free existing group of the same size in any micro-batch (or a new one, up
    to the limit); failing that, sample by sample: joining a group already in a micro-batch or taking
    a free existing group of any size or a single rank, wherever the step grows least.
    """
    limit = tables.problem.options.micro_batch_limit
    for d, samples in sorted(leftovers, key=lambda x: -x[0]):
        best = _best_slot(tables, mbs, by_size.get(d, []), samples, limit, join=False)
        if best is not None:
            _put(mbs, best, samples)
            continue
        targets = [g for size in sorted(by_size) for g in by_size[size]] + [(r,) for r in range(tables.n_ranks)]
        for i in sorted(samples, key=lambda i: -int(tables.lengths[i])):
            slot = _best_slot(tables, mbs, targets, (i,), limit, join=True)
            if slot is None:
                raise InfeasibleError(
                    (
                        f"sample {tables.problem.batch.samples[i].id!r} fits no existing group within {limit} "
                        "micro-batches"
                    ),
                    field="existing_groups",
                    hint=(
                        "raise options.max_micro_batches, add larger groups to existing_groups, "
                        "or use options.group_reuse 'prefer'."
                    ),
                )
            _put(mbs, slot, (i,))


def _best_slot(
    tables: CostTables,
    mbs: list[list[GroupAssignment]],
    targets: Sequence[Ranks],
    samples: tuple[int, ...],
    limit: int,
    join: bool,
) -> tuple[float, int, Ranks, int] | None:
    """(growth of the step, micro-batch, ranks, index of the group joined or -1) of the cheapest place."""
    best: tuple[float, int, Ranks, int] | None = None
    for m, mb in enumerate([*mbs, []]):
        if m == len(mbs) and len(mbs) >= limit:
            break
        used = {r for ranks, _ in mb for r in ranks}
        now = max((tables.group_time(list(s), r) for r, s in mb), default=0.0)
        options: list[tuple[Ranks, int, tuple[int, ...]]] = [(e, -1, samples) for e in targets if used.isdisjoint(e)]
        if join:
            options += [(tuple(r), k, tuple(s) + samples) for k, (r, s) in enumerate(mb)]
        for ranks, k, together in options:
            if not _fits(tables, ranks, together):
                continue
            grow = max(now, tables.group_time(list(together), ranks)) - now
            if best is None or grow < best[0]:
                best = (grow, m, ranks, k)
    return best


def _put(mbs: list[list[GroupAssignment]], slot: tuple[float, int, Ranks, int], samples: tuple[int, ...]) -> None:
    _, m, ranks, k = slot
    if m == len(mbs):
        mbs.append([])
    if k >= 0:
        r, s = mbs[m][k]
        mbs[m][k] = (r, tuple(s) + samples)
    else:
        mbs[m].append((ranks, samples))
