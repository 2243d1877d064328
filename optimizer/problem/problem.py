"""The planning problem: cluster, model, batch, options and (optionally) a measured cost profile."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from optimizer.costs.analytical import analytical_profile
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

    def __post_init__(self) -> None:
        if (
            self.profile is not None
            and self.options.cp_scheme is not None
            and self.options.cp_scheme != self.profile.scheme
        ):
            raise ProblemError(
                f"options ask for {self.options.cp_scheme!r} but the profile was measured with {self.profile.scheme!r}",
                field="options.cp_scheme",
                hint=(
                    "leave options.cp_scheme out to use the profile's scheme, or send a profile measured with the "
                    "same scheme."
                ),
            )

    @property
    def scheme(self) -> str:
        if self.profile is not None:
            return self.profile.scheme
        return self.options.cp_scheme or "ring"

    @cached_property
    def cost_profile(self) -> CostProfile:
        """The profile in force: the given one, else the analytical default."""
        if self.profile is not None:
            return self.profile
        return analytical_profile(self.model, self.cluster, self.scheme)

    @property
    def domain_size(self) -> int:
        return self.cluster.domain_size

    def with_options(self, **changes: Any) -> Problem:
        from dataclasses import replace

        return replace(self, options=replace(self.options, **changes))
