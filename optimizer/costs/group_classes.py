"""Classes of rank groups: groups of one class give every sample the same time.

A class is (size index, intra-node?, slowest speed). Planners keep one time column per class (a
sample's time on any group of that class) instead of one per group. :func:`classify` finds the class
of many groups at once, from their ranks, with reductions over the flattened ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from optimizer.costs.tables import CostTables
from optimizer.costs.time_kernels import gather_columns

ClassKey = tuple[int, bool, float]


@dataclass(frozen=True)
class GroupClasses:
    keys: list[ClassKey]
    """Distinct classes, in order of first appearance."""
    group_class: np.ndarray
    """[G] class index of each group."""
    capacity: np.ndarray
    """[G] smallest per-rank capacity among each group's ranks."""


def group_spans(
    tables: CostTables, flat: np.ndarray, starts: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(size index, intra-node?, slowest speed, smallest capacity) of groups whose ranks lie one
    group after the other in ``flat`` (group g from ``starts[g]``, ``sizes[g]`` ranks, none empty).

    Raises KeyError for a group whose size is not an allowed degree."""
    node = tables.rank_node[flat]
    intra = np.minimum.reduceat(node, starts) == np.maximum.reduceat(node, starts)
    speed = np.minimum.reduceat(tables.rank_speed[flat], starts)
    capacity = np.minimum.reduceat(tables.rank_capacity[flat], starts)
    lut = np.full(tables.n_ranks + 1, -1, dtype=np.int64)
    lut[tables.degrees] = np.arange(tables.degrees.shape[0])
    j = lut[np.minimum(sizes, tables.n_ranks)]
    if (j < 0).any():
        raise KeyError(f"group size {int(sizes[int(np.argmax(j < 0))])} is not an allowed degree")
    return j, intra, speed, capacity


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct rows in lexicographic order, index of each one's first occurrence, index of each
    row's distinct row) of a 2-D float array: what ``np.unique(rows, axis=0, return_index=True,
    return_inverse=True)`` gives, by a lexsort of the columns (``np.unique`` sorts the rows as opaque
    records, which took most of the time of classifying a plan's groups)."""
    n = rows.shape[0]
    if n == 0:
        return rows[:0], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.lexsort(rows.T[::-1])  # stable: the first occurrence of each row comes first
    ordered = rows[order]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.any(ordered[1:] != ordered[:-1], axis=1, out=new[1:])
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], order[new], inverse


def classify(tables: CostTables, ranks: list[tuple[int, ...]]) -> GroupClasses:
    """Class of each group of ``ranks`` (every size must be an allowed degree)."""
    n = len(ranks)
    if n == 0:
        return GroupClasses([], np.zeros(0, dtype=np.int64), np.zeros(0))
    sizes = np.fromiter(map(len, ranks), dtype=np.int64, count=n)
    flat = np.fromiter(chain.from_iterable(ranks), dtype=np.int64, count=int(sizes.sum()))
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    j, intra, speed, capacity = group_spans(tables, flat, starts, sizes)
    rows = np.stack([j.astype(np.float64), intra.astype(np.float64), speed], axis=1)
    uniq, first, inverse = unique_rows(rows)
    number = np.empty(uniq.shape[0], dtype=np.int64)
    number[np.argsort(first, kind="stable")] = np.arange(uniq.shape[0])
    keys: list[ClassKey] = [(0, True, 0.0)] * uniq.shape[0]
    for u, (jj, ii, sp) in enumerate(uniq.tolist()):
        keys[number[u]] = (int(jj), bool(ii), float(sp))
    return GroupClasses(keys, number[inverse], capacity)


def class_times(tables: CostTables, keys: list[ClassKey]) -> np.ndarray:
    """[n_samples, classes]: each sample's time on a group of each class.

    Columns are gathered from each time matrix at once (a pass over its rows, not one per column). A
    class across nodes whose size is wider than every node reads the intra-node matrix, which holds
    the same spanning times for such sizes, so most batches gather from one matrix only."""
    node = tables.node_size
    degrees = tables.degrees.tolist()
    sources: dict[tuple[bool, float], tuple[list[int], list[int]]] = {}
    for c, (j, intra, speed) in enumerate(keys):
        cs, js = sources.setdefault((intra or degrees[j] > node, speed), ([], []))
        cs.append(c)
        js.append(j)
    times = np.empty((tables.n_samples, len(keys)))
    if len(sources) == 1:
        (((intra, speed), (_, js)),) = sources.items()
        gather_columns(tables.time_matrix(intra, speed), np.array(js, dtype=np.int64), times)
        return times
    for (intra, speed), (cs, js) in sources.items():
        times[:, cs] = tables.time_matrix(intra, speed)[:, js]
    return times
