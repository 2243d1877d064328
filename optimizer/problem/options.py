"""Planner options: what the caller may choose about the plan and the planning.

Each option is defined once, as the metadata of its :class:`PlanOptions` field: :data:`OPTION_SPECS` (the
options document, :data:`OPTIONS`) is read by the validation below, the document reader, the request schema
of the service and the command-line flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from optimizer.errors import ProblemError
from optimizer.problem.checks import Range
from optimizer.problem.fields import Document, FieldSpec

DEGREE_POLICIES = ("any", "pow2", "aligned")
MEMORY_RULES = ("micro_batch", "sample")
CP_SCHEMES = ("ring", "ulysses", "hybrid")
BACKENDS = ("auto", "heuristic", "cpsat", "highs", "cbc")
GROUP_REUSE = ("prefer", "only", "ignore")
AUTO_BUDGET = "auto"
"""The ``time_budget_ms`` that asks the planner to work the budget out from the previous step's time."""
BUDGET_HINT = 'give the planning budget in milliseconds, e.g. 200, or "auto" with previous_step_s.'
MICRO_BATCH_CEILING = 1 << 20
"""Largest cap a caller may set on the micro-batch count (a plan never needs more than one micro-batch per sample)."""


def _option(
    default: Any, *, low: float | None = None, high: float | None = None, unit: str | None = None, **spec: Any
) -> Any:
    """A field of :class:`PlanOptions` with its definition (a :class:`FieldSpec` less the name and default)."""
    span = Range(low, high, unit) if (low, high, unit) != (None, None, None) else None
    return field(default=default, metadata={"spec": {**spec, "range": span}})


@dataclass(frozen=True)
class PlanOptions:
    """Validated planner options; each field's metadata is its definition (see :data:`OPTION_SPECS`)."""

    degree_policy: str = _option(
        "any",
        kind="str",
        choices=DEGREE_POLICIES,
        flag="--degree-policy",
        help="group sizes: any integer, powers of two, or aligned (powers of two up to half the domain on blocks "
        "that start at a multiple of their size, or the whole domain: the groups Megatron-Core creates)",
        hint="use 'any' for any group size, 'pow2' for powers of two, 'aligned' for Megatron-Core's hybrid CP groups.",
    )
    memory: str = _option(
        "micro_batch",
        kind="str",
        choices=MEMORY_RULES,
        flag="--memory",
        help="what a rank's memory holds at once: the tokens of all its group's samples in a micro-batch (they run "
        "packed, "
        "in one forward and backward), or one sample (each sample runs its own forward and backward, one after "
        "another, as Megatron-Core's hybrid context parallel runs sub-samples)",
        hint="use 'micro_batch' for packed micro-batches or 'sample' when samples run one at a time.",
    )
    max_degree: int | None = _option(
        None,
        kind="int",
        low=1,
        flag="--max-degree",
        help="largest group size (default: the whole domain)",
        hint="give the largest group size, or leave it out.",
    )
    max_micro_batches: int | None = _option(
        None,
        kind="int",
        low=1,
        high=MICRO_BATCH_CEILING,
        flag="--max-micro-batches",
        help="most micro-batches per step (default: as many as pay off; the planner decides)",
        hint="give the most micro-batches a step may use, e.g. 16, or leave it out to let the planner decide.",
    )
    cp_scheme: str | None = _option(
        None,
        kind="str",
        choices=CP_SCHEMES,
        flag="--cp-scheme",
        help="context-parallel scheme: ring (point-to-point, zig-zag split), ulysses (all-to-all over heads) or "
        "hybrid (Ulysses inside ring, any group size); default the profile's (hybrid where Ulysses cannot hold the "
        "longest sample), else ring",
        hint="use 'ring', 'ulysses' or 'hybrid'.",
    )
    time_budget_ms: float | str = _option(
        200.0,
        kind="number",
        low=1,
        high=600_000,
        unit="milliseconds",
        flag="--budget-ms",
        help="wall-clock budget of the whole planning call in milliseconds (the service counts it from the request's "
        "arrival, dhp plan from the process's start), or \"auto\": a share of the previous training step's time "
        "(previous_step_s), up to a cap, for a plan asked for one step ahead",
        hint=BUDGET_HINT,
        either=FieldSpec(
            "time_budget_ms",
            "str",
            "the planner works the budget out from previous_step_s",
            BUDGET_HINT,
            choices=(AUTO_BUDGET,),
        ),
    )
    previous_step_s: float | None = _option(
        None,
        kind="number",
        low=1e-3,
        unit="seconds",
        help='the previous training step\'s measured time, in seconds, that time_budget_ms "auto" takes its share '
        'of (without it, "auto" is the default budget); a numeric budget does not read it',
        hint="give the previous step's measured time in seconds, e.g. 1.8, or leave it out.",
    )
    backend: str = _option(
        "auto",
        kind="str",
        choices=BACKENDS,
        flag="--backend",
        help="planner after the heuristic: auto, heuristic (none), cpsat, highs or cbc",
        hint="use 'auto' to let the planner choose.",
    )
    solver_workers: int = _option(
        1,
        kind="int",
        low=1,
        high=64,
        help="threads an exact solver may use (capped by the service)",
        hint="give the solver's thread count, e.g. 1.",
    )
    deterministic: bool = _option(
        False,
        kind="bool",
        flag="--deterministic",
        help="the plan depends on the input alone: no planning step reads the clock (the heuristic runs all its "
        "strategies, CP-SAT works to deterministic limits derived from the budget), so every rank planning the "
        "same batch gets the same plan; a loaded machine may take longer than the budget. `auto` then picks only "
        "CP-SAT (or the heuristic alone); HiGHS and CBC, asked for by name, have no deterministic limits: their "
        "rounds still stop on the clock",
        hint="use a JSON boolean.",
    )
    tight_bound: bool = _option(
        False,
        kind="bool",
        flag="--tight-bound",
        help="raise the lower bound with the group-size LP (HiGHS) when the plan is more than 1% above it, with "
        "any backend and as long as the budget allows; without it the LP runs only before an exact backend, "
        "when it fits a fifth of the solver's time. Never in deterministic mode (a time-limited LP reads the clock)",
        hint="use a JSON boolean.",
    )
    group_reuse: str = _option(
        "prefer",
        kind="str",
        choices=GROUP_REUSE,
        help="how to treat existing_groups: prefer them, use only them (and single ranks), or ignore them",
        hint="use 'prefer' to favour the job's existing groups, 'only' to use nothing else.",
    )
    new_group_cost_s: float = _option(
        0.0,
        kind="number",
        low=0,
        unit="seconds",
        help="seconds charged for each communicator the job does not have yet",
        hint="give the time to create one communicator, e.g. 2.0.",
    )

    def __post_init__(self) -> None:
        for spec in OPTION_SPECS:
            spec.check(getattr(self, spec.name), f"options.{spec.name}")
        for spec in OPTION_SPECS:  # None is allowed only where it is the default
            if getattr(self, spec.name) is None and _DEFAULTS[spec.name] is not None:
                raise ProblemError("must be given", field=f"options.{spec.name}", hint=spec.hint)

    @property
    def budget_ms(self) -> float:
        """The budget as a number of milliseconds. ``time_budget_ms: "auto"`` is resolved to one by the planning
        layer (``planning.budget_policy.resolve_budget``) before any planning step reads the budget."""
        if isinstance(self.time_budget_ms, str):
            raise ValueError(
                f'options.time_budget_ms is still "{self.time_budget_ms}": '
                "planning.budget_policy.resolve_budget resolves it first"
            )
        return self.time_budget_ms

    @property
    def micro_batch_limit(self) -> int:
        """The cap on micro-batches as a number: the caller's, else :data:`MICRO_BATCH_CEILING` (no cap in practice)."""
        return MICRO_BATCH_CEILING if self.max_micro_batches is None else self.max_micro_batches

    @classmethod
    def checked(cls, **values: Any) -> PlanOptions:
        """Options of values already checked against :data:`OPTION_SPECS` (by the document reader, or by the
        service's request model, which is built from them), made without checking them again; the options left
        out take their defaults."""
        options = object.__new__(cls)
        options.__dict__.update(_DEFAULTS, **values)
        return options


OPTION_SPECS: tuple[FieldSpec, ...] = tuple(
    FieldSpec(name=f.name, default=f.default, **f.metadata["spec"]) for f in fields(PlanOptions)
)
"""Every option, in field order (the one definition the schema, the documents and the flags read)."""
OPTIONS = Document("Options", "Planner options (the options document); leave any out for its default.", OPTION_SPECS)
_DEFAULTS = {f.name: f.default for f in fields(PlanOptions)}


class CheckedOptions(dict[str, Any]):
    """An options document as it was sent, with the :class:`PlanOptions` its sender already read it into against
    :data:`OPTION_SPECS` (the service's request model): the document reader takes ``options`` instead of reading
    the document again. Stored, hashed or copied into a plain dict, it is the document alone."""

    def __init__(self, doc: Mapping[str, Any], options: PlanOptions) -> None:
        super().__init__(doc)
        self.options = options
