"""Which form of the kernels a plan runs: the Python forms, or numba's compiled ones (:mod:`optimizer.jit`).

A process starts with the Python forms. Loading the compiled ones costs a fresh process about 0.3 s of
imports and 0.1 to 0.2 s of machine code loaded from the disk cache (the 2-core development machine),
once; after that every kernel runs many times faster. A process that warms up (the service, a client's
local fallback, an epoch job) loads them in its warm-up (:mod:`planning.warm`). A plan in a process that
has not loaded them (``dhp plan``, which plans once) keeps the Python forms when its batch is small and its
budget short, where they answer first, and loads the compiled forms otherwise. A deterministic plan always
runs compiled: its search is counted in steps, not time, and the wall-clock wait that guards it
(:data:`planning.budget_policy.DETERMINISTIC_WAIT_BUDGETS`) should never be what ends it.

Measured in fresh processes on the development machine on 2026-12-03 (``python -m bench.kernel_forms``),
video batches, the budget counted from the process's start:

- at 200 ms, 64 and 256 ranks, 256 to 1,024 samples: 282 to 441 ms with the Python forms against 451 to
  652 ms compiled, the same plans; 2,048 samples on 256 ranks 445 against 579 ms; 4,096 samples 1,025
  against 508 ms;
- at 1 s, 256 to 1,024 samples: wall 730 to 1,011 ms against 816 to 993 ms; the plans within 0.4% of
  each other either way (the Python forms' faster on 64 ranks x 512 and 1,024 samples, the compiled
  forms' on 256 samples); 2,048 and 4,096 samples on 256 ranks: 1,014 and 1,186 ms against 994 ms, the
  compiled plans up to 0.1% faster.
"""

from __future__ import annotations

import os

from optimizer import jit
from optimizer.problem.problem import Problem
from planning.budget_policy import PYTHON_KERNELS_MAX_BUDGET_MS

PYTHON_MAX_SAMPLES = 1024
"""The largest batch planned with the Python forms in a process that has not loaded the compiled ones."""
PYTHON_MAX_RANKS = 1024
"""The largest domain planned so (the time matrices grow with its allowed group sizes). Chosen: the
measurements above reach 256 ranks."""
ENV = "DHP_KERNELS"
"""``python`` or ``compiled`` forces one form for this process's plans; unset or ``auto``: the rule above."""


def wants_compiled(problem: Problem) -> bool:
    """Whether ``problem`` is to be planned with the compiled kernels (see the module docstring)."""
    forced = os.environ.get(ENV, "auto").strip().lower()
    if forced in ("python", "compiled"):
        return forced == "compiled"
    budget = problem.options.budget_ms
    return (
        problem.options.deterministic
        or len(problem.batch) > PYTHON_MAX_SAMPLES
        or problem.cluster.domain_size > PYTHON_MAX_RANKS
        or budget is None
        or float(budget) > PYTHON_KERNELS_MAX_BUDGET_MS
    )


def choose_kernels(problem: Problem) -> bool:
    """Load the compiled kernels where ``problem`` wants them and they are not loaded yet; whether the plan
    runs them."""
    if not jit.loaded() and wants_compiled(problem):
        jit.load()
    return jit.loaded()
