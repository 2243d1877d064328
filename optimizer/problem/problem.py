"""The planning problem: cluster, model, batch, options and (optionally) a measured cost profile."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from optimizer.costs.analytical import analytical_profile, as_hybrid
from optimizer.costs.profile import CostProfile
from optimizer.errors import ProblemError
from optimizer.problem.batch import Batch
from optimizer.problem.cluster import Cluster
from optimizer.problem.model import ModelSpec
from optimizer.problem.options import PlanOptions


@dataclass(frozen=True)
class Problem:
    """Everything a planner needs; immutable. ``profile`` None means the analytical default."""

    cluster: Cluster
    model: ModelSpec
    batch: Batch
    options: PlanOptions = PlanOptions()
    profile: CostProfile | None = None
    existing_groups: tuple[tuple[int, ...], ...] = ()
    """Rank groups (sorted) the job already has communicators for; see ``options.group_reuse``."""
    budget_reason: str | None = None
    """How the planning layer worked out the budget of ``options.time_budget_ms: "auto"``
    (``planning.budget_policy.resolve_budget``); None for a budget given as a number."""

    def __post_init__(self) -> None:
        asked = self.options.cp_scheme
        if self.profile is not None and asked not in (None, "hybrid", self.profile.scheme):
            raise ProblemError(
                f"options ask for {asked!r} but the profile was measured with {self.profile.scheme!r}",
                field="options.cp_scheme",
                hint=(
                    "leave options.cp_scheme out to use the profile's scheme, ask for 'hybrid' (it plans with the "
                    "profile's measured volume), or send a profile measured with the same scheme."
                ),
            )

    @cached_property
    def _scheme_choice(self) -> tuple[str, str | None]:
        asked = self.options.cp_scheme
        given = self.profile.scheme if self.profile is not None else None
        if asked is not None:
            return asked, None
        if given != "ulysses":
            return given or "ring", None
        from optimizer.problem.degrees import ulysses_reach

        short = ulysses_reach(self)
        return ("hybrid", short) if short else ("ulysses", None)

    @property
    def scheme(self) -> str:
        """The context-parallel scheme of the plan: the caller's ``options.cp_scheme``, else the profile's,
        else ring; a Ulysses profile plans as hybrid when no Ulysses group holds the longest sample."""
        return self._scheme_choice[0]

    @property
    def scheme_reason(self) -> str | None:
        """Why the plan's scheme is not the profile's (None when it is, or when the caller chose it)."""
        return self._scheme_choice[1]

    @cached_property
    def ulysses_widths(self) -> dict[Any, Any]:
        """Memo of :func:`optimizer.costs.cp_schemes.ulysses_width` (hybrid groups' Ulysses width by size)."""
        return {}

    @cached_property
    def cost_profile(self) -> CostProfile:
        """The profile in force: the given one (as hybrid when the scheme is), else the analytical default."""
        if self.profile is None:
            return analytical_profile(self.model, self.cluster, self.scheme)
        if self.scheme == "hybrid":
            return as_hybrid(self.profile, self.model, self.cluster)
        return self.profile

    @property
    def domain_size(self) -> int:
        return self.cluster.domain_size

    def with_options(self, **changes: Any) -> Problem:
        from dataclasses import replace

        return replace(self, options=replace(self.options, **changes))
