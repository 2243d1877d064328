"""Non-negative least squares: the fits of cost profiles (``dhp profile``, refits from feedback) use it.

Lawson and Hanson's active-set method ("Solving Least Squares Problems", 1974, chapter 23): it
returns the exact minimiser of ``|A x - b|`` over ``x >= 0`` in finitely many steps.
"""

from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """The x >= 0 minimising ``|a x - b|_2`` (``a`` of shape (m, n), ``b`` of shape (m,)).

    Scale the columns of ``a`` to comparable norms first: the tolerances are relative to the largest entries."""
    m, n = a.shape
    x = np.zeros(n)
    if n == 0 or m == 0:
        return x
    passive = np.zeros(n, dtype=bool)
    scale = float(np.abs(a).max()) * float(np.abs(b).max()) or 1.0
    tol = 10.0 * np.finfo(float).eps * max(m, n) * scale
    limit = max_iter if max_iter is not None else 3 * n + 30
    for _ in range(limit):
        w = a.T @ (b - a @ x)
        free = ~passive & (w > tol)
        if not free.any():
            break
        passive[int(np.argmax(np.where(free, w, -np.inf)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            shrinking = passive & (z <= 0)
            alpha = float(np.min(x[shrinking] / (x[shrinking] - z[shrinking])))
            x = x + alpha * (z - x)
            passive &= x > 1e-12 * float(x.max(initial=0.0))
            x[~passive] = 0.0
    return np.maximum(x, 0.0)
