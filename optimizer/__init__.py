"""dhp-planner's engine: the problem model, the cost model, the planners, the plan and its verification."""

from optimizer.errors import InfeasibleError, PlannerError, ProblemError, VerificationError

__all__ = ["InfeasibleError", "PlannerError", "ProblemError", "VerificationError"]
