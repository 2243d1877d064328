"""The pricing knapsack of :mod:`solver_models.column_bound`, compiled (see :mod:`optimizer.jit`).

Items have a profit and two whole weights (cells of a group's time and of its memory); the table
``value[r, q]`` is the best profit within r time cells and q memory cells, and ``taken[item, r, q]``
whether the item is in that best set, so the set can be read back from the full rooms.
"""

from __future__ import annotations

import numpy as np

from optimizer.jit import compiled


def _fill_numpy(profit: np.ndarray, a: np.ndarray, m: np.ndarray, value: np.ndarray, taken: np.ndarray) -> None:
    rows, cols = value.shape
    for item in range(profit.shape[0]):
        ai, mi, p = int(a[item]), int(m[item]), float(profit[item])
        shifted = value[: rows - ai, : cols - mi] + p
        target = value[ai:, mi:]
        better = shifted > target
        if better.any():
            taken[item, ai:, mi:] = better
            value[ai:, mi:] = np.where(better, shifted, target)


@compiled(python=_fill_numpy)
def fill(profit: np.ndarray, a: np.ndarray, m: np.ndarray, value: np.ndarray, taken: np.ndarray) -> None:
    """The 0/1 knapsack's table, item after item: ``value`` (zeros on entry) and ``taken`` (False on entry)
    are filled in place; ``a`` and ``m`` are each item's cells, at most the table's last index."""
    rows, cols = value.shape
    for item in range(profit.shape[0]):
        ai, mi, p = a[item], m[item], profit[item]
        # backwards, so each cell reads the table as it was before this item
        for r in range(rows - 1, ai - 1, -1):
            for q in range(cols - 1, mi - 1, -1):
                candidate = value[r - ai, q - mi] + p
                if candidate > value[r, q]:
                    value[r, q] = candidate
                    taken[item, r, q] = True
