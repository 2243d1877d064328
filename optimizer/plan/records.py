"""The plan: micro-batches of rank groups with their samples, predicted times, bound and solver facts.

``Assignment`` is what planners produce (rank groups and sample indices per micro-batch);
:func:`optimizer.plan.evaluate.build_plan` turns one into a :class:`Plan` with times recomputed from the
cost tables. ``Plan.to_json`` is the wire form printed by ``dhp plan`` and returned by the service.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from typing import Any

import numpy as np

from optimizer.errors import ProblemError
from optimizer.plan.sharding import padded_length, token_ranges

# -- planner output ---------------------------------------------------------------------------

GroupAssignment = tuple[tuple[int, ...], tuple[int, ...]]
"""(ranks, sample indices) of one group in one micro-batch."""


@dataclass(frozen=True)
class FlatGroups:
    """The groups of an assignment as arrays, in order (micro-batch by micro-batch)."""

    micro_batch: np.ndarray  # [G] micro-batch of each group
    size: np.ndarray  # [G] ranks per group
    ranks: np.ndarray  # all groups' ranks, one group after the other
    rank_start: np.ndarray  # [G] where each group's ranks begin in ``ranks``
    samples: np.ndarray  # all groups' sample indices, one group after the other
    count: np.ndarray  # [G] samples per group
    first_rank: np.ndarray  # [G]

    @classmethod
    def of(
        cls, micro_batch: np.ndarray, ranks: Sequence[Sequence[int]], samples: np.ndarray, count: np.ndarray
    ) -> FlatGroups:
        """The arrays of groups with ranks ``ranks`` (one sequence per group, -1 as the first rank of a
        group without any) and samples ``samples`` (``count[g]`` for group g, one group after the other)."""
        n = len(ranks)
        size = np.fromiter(map(len, ranks), dtype=np.int64, count=n)
        flat = np.fromiter(chain.from_iterable(ranks), dtype=np.int64, count=int(size.sum()))
        rank_start = np.zeros(n, dtype=np.int64)
        np.cumsum(size[:-1], out=rank_start[1:])
        first_rank = (
            flat[rank_start] if n and size.min() > 0 else np.array([r[0] if r else -1 for r in ranks], dtype=np.int64)
        )
        return cls(micro_batch, size, flat, rank_start, samples, count, first_rank)


@dataclass(frozen=True)
class Assignment:
    """A candidate plan: for every micro-batch, its groups as (ranks, sample indices)."""

    micro_batches: tuple[tuple[GroupAssignment, ...], ...]

    @classmethod
    def of(
        cls, micro_batches: list[list[tuple[list[int] | tuple[int, ...], list[int] | tuple[int, ...]]]]
    ) -> Assignment:
        return cls(
            tuple(
                tuple((tuple(map(int, ranks)), tuple(map(int, samples))) for ranks, samples in mb if len(samples))
                for mb in micro_batches
                if any(len(s) for _, s in mb)
            )
        )

    def __getstate__(self) -> dict[str, Any]:
        """What pickling keeps: the groups and their flat arrays, not the group times kept for one
        set of cost tables (:func:`optimizer.plan.evaluate.group_times`: a weak reference)."""
        return {k: v for k, v in self.__dict__.items() if k != "_group_times"}

    @classmethod
    def with_flat(cls, micro_batches: tuple[tuple[GroupAssignment, ...], ...], flat: FlatGroups) -> Assignment:
        """An assignment whose :attr:`flat` arrays its maker already has (they must describe ``micro_batches``)."""
        out = cls(micro_batches)
        out.__dict__["flat"] = flat
        return out

    @cached_property
    def flat(self) -> FlatGroups:
        groups = [g for mb in self.micro_batches for g in mb]
        n = len(groups)
        count = np.fromiter(map(len, (s for _, s in groups)), dtype=np.int64, count=n)
        samples = np.fromiter(chain.from_iterable(s for _, s in groups), dtype=np.int64, count=int(count.sum()))
        micro_batch = np.repeat(np.arange(len(self.micro_batches)), [len(mb) for mb in self.micro_batches])
        return FlatGroups.of(micro_batch, [r for r, _ in groups], samples, count)


# -- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TracePoint:
    """One improving solution found by an anytime solver."""

    elapsed_ms: float
    objective_s: float
    bound_s: float | None = None


@dataclass(frozen=True)
class SolverStats:
    """How the plan was found. Status and bound are reported as they are, never asserted."""

    backend: str
    status: str
    """``heuristic``, ``optimal``, ``feasible``, ``fallback`` (solver gave nothing better) ..."""
    wall_ms: float
    objective_s: float | None = None
    bound_s: float | None = None
    trace: tuple[TracePoint, ...] = ()
    fallback_reason: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    budget_ms: float | None = None
    """The budget the plan was made under (``options.time_budget_ms``, or what ``"auto"`` came to)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "status": self.status, "wall_ms": round(self.wall_ms, 3)}
        if self.budget_ms is not None:
            out["budget_ms"] = self.budget_ms
        if self.objective_s is not None:
            out["objective_s"] = self.objective_s
        if self.bound_s is not None:
            out["bound_s"] = self.bound_s
        if self.trace:
            out["trace"] = [
                {"elapsed_ms": round(t.elapsed_ms, 3), "objective_s": t.objective_s, "bound_s": t.bound_s}
                for t in self.trace
            ]
        if self.fallback_reason:
            out["fallback_reason"] = self.fallback_reason
        if self.details:
            out["details"] = self.details
        return out


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """One group of a micro-batch: its ranks, its samples' ids and lengths, its predicted seconds and
    whether it lies within one node (slots: a plan holds one per group, thousands on large batches)."""

    ranks: tuple[int, ...]
    samples: tuple[str, ...]
    lengths: tuple[int, ...]
    predicted_time_s: float
    intra_node: bool

    @property
    def degree(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class MicroBatchPlan:
    groups: tuple[GroupPlan, ...]

    @property
    def predicted_time_s(self) -> float:
        return max((g.predicted_time_s for g in self.groups), default=0.0)


@dataclass(frozen=True)
class StaticBaseline:
    """The best static power-of-two layout for the same batch under the same cost model."""

    degree: int
    micro_batches: int
    predicted_step_time_s: float


@dataclass(frozen=True)
class Plan:
    micro_batches: tuple[MicroBatchPlan, ...]
    predicted_step_time_s: float
    lower_bound_s: float
    scheme: str
    domain_size: int
    solver: SolverStats
    static_baseline: StaticBaseline | None = None
    new_communicators: tuple[tuple[int, ...], ...] | None = None
    """Groups the plan needs that the request did not list as existing (None: not asked about)."""
    group_setup_s: float = 0.0
    """``options.new_group_cost_s`` times the number of new communicators (paid once, not per step)."""
    ulysses_sizes: tuple[tuple[int, int], ...] = ()
    """Under the hybrid scheme, (group size, Ulysses width) of every allowed size (see
    :func:`optimizer.costs.cp_schemes.ulysses_width`)."""
    scheme_reason: str | None = None
    """Why the scheme is not the profile's (a Ulysses profile planned as hybrid), None otherwise."""
    static_baseline_reason: str | None = None
    """Why there is no ``static_baseline``: the rule that ruled out every static layout, or why none was computed."""
    model: str | None = None
    """The name of the model the plan was made for (its costs, memory and heads)."""
    sample_indices: tuple[int, ...] | None = None
    """The batch index of every sample the groups list, group after group in the plan's order, as the
    planner knew them (None: not given). The verifier checks them against the ids and then reads them
    instead of looking every id up; a plan whose groups were changed without them is looked up id by id."""

    def ulysses_size(self, d: int) -> int:
        """The Ulysses width of a group of ``d`` ranks (1 outside the hybrid scheme)."""
        return dict(self.ulysses_sizes).get(d, 1) if self.scheme == "hybrid" else 1

    @property
    def gap(self) -> float:
        """Relative distance to the lower bound: (step - bound) / step."""
        return bound_gap(self.predicted_step_time_s, self.lower_bound_s)

    @property
    def ratio_to_bound(self) -> float:
        return bound_ratio(self.predicted_step_time_s, self.lower_bound_s)

    @property
    def communicators(self) -> list[tuple[int, ...]]:
        """Distinct rank groups (size >= 2) the plan needs, in first-use order."""
        return communicators_of(g.ranks for mb in self.micro_batches for g in mb.groups)

    @property
    def speedup_over_static(self) -> float | None:
        if self.static_baseline is None:
            return None
        return static_speedup(self.static_baseline.predicted_step_time_s, self.predicted_step_time_s)

    def to_json(self, shards: bool = True) -> dict[str, Any]:
        mbs = []
        for mb in self.micro_batches:
            groups = []
            for g in mb.groups:
                gj: dict[str, Any] = {
                    "ranks": list(g.ranks),
                    "degree": g.degree,
                    "samples": list(g.samples),
                    "predicted_time_s": g.predicted_time_s,
                    "intra_node": g.intra_node,
                }
                u = self.ulysses_size(g.degree)
                if self.scheme == "hybrid":
                    gj["ulysses_size"] = u
                if shards:
                    gj["shards"] = [
                        shard_json(sid, length, g.degree, self.scheme, u)
                        for sid, length in zip(g.samples, g.lengths, strict=True)
                    ]
                groups.append(gj)
            mbs.append({"predicted_time_s": mb.predicted_time_s, "groups": groups})
        out: dict[str, Any] = {
            "predicted_step_time_s": self.predicted_step_time_s,
            "lower_bound_s": self.lower_bound_s,
            "gap": self.gap,
            "ratio_to_bound": self.ratio_to_bound,
            "scheme": self.scheme,
            **({"scheme_reason": self.scheme_reason} if self.scheme_reason else {}),
            "domain_size": self.domain_size,
            "micro_batches": mbs,
            "communicators": [list(c) for c in self.communicators],
            "solver": self.solver.to_json(),
        }
        if self.new_communicators is not None:
            out["new_communicators"] = [list(c) for c in self.new_communicators]
            out["group_setup_s"] = self.group_setup_s
        if self.static_baseline is not None:
            out["static_baseline"] = {
                "degree": self.static_baseline.degree,
                "micro_batches": self.static_baseline.micro_batches,
                "predicted_step_time_s": self.static_baseline.predicted_step_time_s,
                "speedup": self.speedup_over_static,
            }
        elif self.static_baseline_reason:
            out["static_baseline_reason"] = self.static_baseline_reason
        if self.model is not None:
            out["model"] = self.model
        return out


# -- figures of the wire form, shared with the plan file's verification ----------------------------


def bound_gap(step_s: float, bound_s: float) -> float:
    """Relative distance to the lower bound: (step - bound) / step, 0 when the step is not positive."""
    if step_s <= 0:
        return 0.0
    return max(0.0, (step_s - bound_s) / step_s)


def bound_ratio(step_s: float, bound_s: float) -> float:
    """Step time over lower bound, 1 when the bound is not positive."""
    return step_s / bound_s if bound_s > 0 else 1.0


def static_speedup(static_s: float, step_s: float) -> float | None:
    """The static layout's step time over the plan's (None when the plan's is not positive)."""
    return static_s / step_s if step_s > 0 else None


def communicators_of(groups: Iterable[Sequence[int]]) -> list[tuple[int, ...]]:
    """Distinct rank groups (size >= 2) among ``groups``, in first-use order."""
    seen: dict[tuple[int, ...], None] = {}
    for ranks in groups:
        if len(ranks) > 1:
            seen.setdefault(tuple(ranks), None)
    return list(seen)


def shard_json(sample: str, length: int, d: int, scheme: str, ulysses: int = 1) -> dict[str, Any]:
    """One sample's entry of a group's ``shards``: its length, padded length and token ranges per rank
    position (``ulysses``: a hybrid group's Ulysses width)."""
    return {
        "sample": sample,
        "length": length,
        "padded_length": padded_length(length, d, scheme),
        "ranges": _ranges_json(length, d, scheme, ulysses),
    }


def _ranges_json(length: int, d: int, scheme: str, ulysses: int) -> list[list[list[int]]]:
    """Token ranges per rank position as JSON arrays (most groups have size 1: one range)."""
    if d == 1:
        return [[[0, length]]]
    return [[[a, b] for a, b in rs] for rs in token_ranges(length, d, scheme, ulysses)]


def assignment_from_json(doc: Any, sample_index: dict[str, int]) -> Assignment:
    """Read the groups of a plan document (``micro_batches[].groups[].ranks/.samples``)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("micro_batches"), list):
        raise ProblemError("has no list 'micro_batches'", field="plan", hint="pass a plan printed by 'dhp plan'.")
    mbs = []
    for m, mb in enumerate(doc["micro_batches"]):
        if not isinstance(mb, dict) or not isinstance(mb.get("groups"), list):
            raise ProblemError(
                "has no list 'groups'", field=f"plan.micro_batches[{m}]", hint="pass a plan printed by 'dhp plan'."
            )
        groups = []
        for k, g in enumerate(mb["groups"]):
            where = f"plan.micro_batches[{m}].groups[{k}]"
            if not isinstance(g, dict):
                raise ProblemError("is not an object", field=where, hint="each group needs 'ranks' and 'samples'.")
            ranks, samples = g.get("ranks"), g.get("samples")
            if (
                not isinstance(ranks, list)
                or not ranks
                or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
            ):
                raise ProblemError(
                    "must be a non-empty list of integers",
                    field=f"{where}.ranks",
                    hint="list the group's global ranks.",
                )
            if not isinstance(samples, list) or not all(isinstance(s, str) for s in samples):
                raise ProblemError(
                    "must be a list of sample ids",
                    field=f"{where}.samples",
                    hint="list the ids of the group's samples.",
                )
            unknown = [s for s in samples if s not in sample_index]
            if unknown:
                raise ProblemError(
                    f"names samples not in the batch: {unknown[:5]}",
                    field=f"{where}.samples",
                    hint="validate the plan against the batch it was made for.",
                )
            groups.append((tuple(ranks), tuple(sample_index[s] for s in samples)))
        mbs.append(tuple(groups))
    return Assignment(tuple(mbs))
