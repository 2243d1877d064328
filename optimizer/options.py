"""Planner options: what the caller may choose about the plan and the planning."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import ProblemError

DEGREE_POLICIES = ("any", "pow2")
CP_SCHEMES = ("ring", "ulysses")
BACKENDS = ("auto", "heuristic", "cpsat", "highs", "cbc")
GROUP_REUSE = ("prefer", "only", "ignore")
MICRO_BATCH_CEILING = 1 << 20
"""Largest cap a caller may set on the micro-batch count (a plan never needs more than one micro-batch per sample)."""


@dataclass(frozen=True)
class PlanOptions:
    """Validated planner options."""

    degree_policy: str = "any"
    """``any``: any integer group size; ``pow2``: powers of two only."""
    max_degree: int | None = None
    """Largest group size; None means min(domain, max(64, the smallest size that fits the longest sample))."""
    max_micro_batches: int | None = None
    """Most micro-batches a plan may use; None: as many as the batch needs (the planner decides)."""
    cp_scheme: str | None = None
    """``ring`` (point-to-point, zig-zag split) or ``ulysses`` (all-to-all); None takes the profile's, else ring."""
    time_budget_ms: float = 200.0
    """Wall-clock budget of the whole planning call, in milliseconds."""
    backend: str = "auto"
    """Which planner runs after the heuristic: auto, heuristic (none), cpsat, highs or cbc."""
    solver_workers: int = 1
    """Threads an exact solver may use."""
    deterministic: bool = False
    """Ask the exact solver for reproducible results (deterministic time limits)."""
    group_reuse: str = "prefer"
    """With a request's ``existing_groups``: ``prefer`` them, use ``only`` them (and single ranks), or ``ignore`` them."""
    new_group_cost_s: float = 0.0
    """Seconds one new communicator costs (weighed against step time when choosing between groups)."""

    def __post_init__(self) -> None:
        if self.degree_policy not in DEGREE_POLICIES:
            raise ProblemError(f"must be one of {DEGREE_POLICIES}, got {self.degree_policy!r}", field="options.degree_policy", hint="use 'any' for any group size or 'pow2' for powers of two.")
        if self.max_degree is not None and (not isinstance(self.max_degree, int) or isinstance(self.max_degree, bool) or self.max_degree < 1):
            raise ProblemError(f"must be an integer >= 1, got {self.max_degree!r}", field="options.max_degree", hint="give the largest group size, or leave it out.")
        if self.max_micro_batches is not None and (
                not isinstance(self.max_micro_batches, int) or isinstance(self.max_micro_batches, bool) or not 1 <= self.max_micro_batches <= MICRO_BATCH_CEILING):
            raise ProblemError(f"must be an integer from 1 to {MICRO_BATCH_CEILING}, got {self.max_micro_batches!r}", field="options.max_micro_batches",
                               hint="give the most micro-batches a step may use, e.g. 16, or leave it out to let the planner decide.")
        if self.cp_scheme is not None and self.cp_scheme not in CP_SCHEMES:
            raise ProblemError(f"must be one of {CP_SCHEMES}, got {self.cp_scheme!r}", field="options.cp_scheme", hint="use 'ring' or 'ulysses'.")
        if not isinstance(self.time_budget_ms, (int, float)) or isinstance(self.time_budget_ms, bool) or not 1 <= self.time_budget_ms <= 600_000:
            raise ProblemError(f"must be a number of milliseconds from 1 to 600000, got {self.time_budget_ms!r}", field="options.time_budget_ms", hint="give the planning budget in milliseconds, e.g. 200.")
        if self.backend not in BACKENDS:
            raise ProblemError(f"must be one of {BACKENDS}, got {self.backend!r}", field="options.backend", hint="use 'auto' to let the planner choose.")
        if not isinstance(self.solver_workers, int) or isinstance(self.solver_workers, bool) or not 1 <= self.solver_workers <= 64:
            raise ProblemError(f"must be an integer from 1 to 64, got {self.solver_workers!r}", field="options.solver_workers", hint="give the solver's thread count, e.g. 1.")
        if self.group_reuse not in GROUP_REUSE:
            raise ProblemError(f"must be one of {GROUP_REUSE}, got {self.group_reuse!r}", field="options.group_reuse", hint="use 'prefer' to favour the job's existing groups, 'only' to use nothing else.")
        if isinstance(self.new_group_cost_s, bool) or not isinstance(self.new_group_cost_s, (int, float)) or not 0 <= self.new_group_cost_s < float("inf"):
            raise ProblemError(f"must be a finite number of seconds >= 0, got {self.new_group_cost_s!r}", field="options.new_group_cost_s", hint="give the time to create one communicator, e.g. 2.0.")
        if not isinstance(self.deterministic, bool):
            raise ProblemError(f"must be true or false, got {self.deterministic!r}", field="options.deterministic", hint="use a JSON boolean.")

    @property
    def micro_batch_limit(self) -> int:
        """The cap on micro-batches as a number: the caller's, else :data:`MICRO_BATCH_CEILING` (no cap in practice)."""
        return MICRO_BATCH_CEILING if self.max_micro_batches is None else self.max_micro_batches
