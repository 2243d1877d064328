"""Integer-programming formulations of the planning problem, behind one backend interface.

Formulations read :class:`optimizer.costs.tables.CostTables` and never the model or the hardware; each
backend imports its solver library only when it is used, so the problem model and the heuristic
work without any solver installed.
"""

from solver_models.base import Backend, SolveResult, available_backends, builtin_backends, get_backend, register
from solver_models.lns import whole_model_fits

__all__ = [
    "Backend",
    "SolveResult",
    "available_backends",
    "builtin_backends",
    "get_backend",
    "register",
    "whole_model_fits",
]
