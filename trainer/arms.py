"""The four plan sources of the end-to-end comparison (``trainer.train_hf --arm``, ``bench.megatron_e2e``).

Each arm turns the same batch into a plan and says how the trainer runs it (:data:`ARMS`;
:mod:`trainer.step` for the two executions):

- ``static``: the best static power-of-two layout of the batch
  (:func:`optimizer.heuristic.static_layout.best_static`) under the packed profile, run packed;
- ``megatron``: Megatron-Core's own ``BalancedCPScheduler`` (its greedy with its cost estimate
  L^2 / cp, at the per-rank capacity), its schedule read as a plan
  (:func:`trainer.megatron.assignment_of`), run per sample as Megatron runs it;
- ``dhp-megatron``: :class:`trainer.megatron.PlannedCPScheduler`, dhp under Megatron's rules
  (aligned groups, memory per sample) with the per-sample profile, run per sample;
- ``dhp``: the planner under its own rules with the packed profile (the request as
  ``trainer.train_hf`` makes it), run packed.

Every plan is evaluated by :func:`optimizer.plan.evaluate.build_plan` under the profile of its
execution (the packed profile for ``static`` and ``dhp``, the per-sample one of
:mod:`trainer.per_sample_costs` for the other two), so their predicted step times compare. The
plans of ``static`` and ``megatron`` are also verified under the rules of their execution and the
findings are kept in the plan's ``verification`` (Megatron's greedy may start a group off the
aligned blocks its process groups are, which its real run could not do; the trainer here can).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from optimizer.errors import ProblemError

ARMS: dict[str, str] = {"static": "packed", "megatron": "per-sample", "dhp-megatron": "per-sample", "dhp": "packed"}
"""Each arm and the execution its plans run with."""


def _problem(
    request: Mapping[str, Any], profile: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None
) -> Any:
    """The planning problem of a request, with another profile or options where given."""
    from optimizer.problem.documents import problem_from_json

    doc = dict(request)
    if profile is not None:
        doc["profile"] = dict(profile)
    if options is not None:
        doc["options"] = dict(options)
    return problem_from_json(doc)


def evaluated(
    problem: Any, assignment: Any, backend: str, wall_ms: float, static: Any = None, rules: Any = None
) -> dict[str, Any]:
    """The plan document of ``assignment`` with every time from ``problem``'s profile, verified under
    ``rules`` (a problem with the rules its execution obeys; default ``problem``)."""
    from optimizer.bounds.lower_bounds import lower_bound
    from optimizer.costs.tables import CostTables
    from optimizer.plan.evaluate import build_plan
    from optimizer.plan.records import SolverStats
    from optimizer.verify.verifier import check_assignment

    tables = CostTables.build(problem)
    plan = build_plan(tables, assignment, SolverStats(backend, "given", wall_ms), lower_bound(tables), static)
    report = check_assignment(rules if rules is not None else problem, assignment)
    doc = plan.to_json()
    doc["verification"] = {"ok": report.ok, "violations": list(report.violations[:5]), "count": len(report.violations)}
    return doc


def static_plan(request: Mapping[str, Any]) -> dict[str, Any]:
    """The best static power-of-two layout of the request's batch under its (packed) profile."""
    from optimizer.costs.tables import CostTables
    from optimizer.heuristic.static_layout import best_static

    problem = _problem(request)
    t0 = time.perf_counter()
    found = best_static(CostTables.build(problem))
    if found is None:
        raise ProblemError(
            "no static power-of-two layout fits the batch in memory",
            field="batch",
            hint="raise --capacity-tokens or shorten --longest so that the longest sample fits.",
        )
    baseline, assignment = found
    return evaluated(problem, assignment, "static-best", (time.perf_counter() - t0) * 1000.0, baseline)


def megatron_plan(request: Mapping[str, Any], sample_profile: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron-Core's ``BalancedCPScheduler`` schedule of the batch, as a plan under the per-sample profile."""
    from trainer.megatron import MEGATRON_RULES, assignment_of

    capacity = int(sample_profile["capacity_tokens_per_rank"])
    # Its sizes are powers of two and the whole domain; the verifier checks Megatron's own rules.
    problem = _problem(request, sample_profile, {"degree_policy": "any", "memory": "sample"})
    rules = _problem(request, sample_profile, MEGATRON_RULES)
    n = problem.cluster.domain_size
    ids = [s.id for s in problem.batch.samples]
    lengths = [int(x) for x in problem.batch.lengths]
    scheduler = _balanced_scheduler(capacity, n)
    # Megatron gives a sample the power of two of ranks its capacity needs; more than the domain never places.
    needs = {sid: int(scheduler.gpus_needed(L)) for sid, L in zip(ids, lengths, strict=True)}
    too_long = [sid for sid in ids if needs[sid] > n]
    if too_long:
        sid = too_long[0]
        widest = 1 << (n.bit_length() - 1)
        raise ProblemError(
            f"sample {sid!r} of {lengths[ids.index(sid)]} tokens needs {needs[sid]} ranks of {capacity} "
            f"tokens, more than the {n} ranks Megatron's scheduler places it on",
            field="batch",
            hint=f"keep samples at most {widest * capacity} tokens (--longest) or raise the capacity.",
        )
    if len(ids) < n:
        raise ProblemError(
            f"{len(ids)} samples for {n} ranks: Megatron's scheduler needs a sample for every rank",
            field="batch",
            hint=f"give at least {n} samples per step (--samples).",
        )
    t0 = time.perf_counter()
    _, sample_id_groups = scheduler.get_groups_and_subsamples(list(zip(ids, lengths, strict=True)), None)
    wall = (time.perf_counter() - t0) * 1000.0
    assignment = assignment_of(sample_id_groups, problem.batch.index)
    return evaluated(problem, assignment, "megatron-core BalancedCPScheduler", wall, rules=rules)


def _balanced_scheduler(capacity: int, n: int) -> Any:
    from trainer.megatron import DomainGroup, balanced_scheduler_class

    try:
        scheduler = balanced_scheduler_class()
    except ImportError:
        raise ProblemError(
            "megatron-core is not installed",
            field="arm",
            hint="pip install 'dhp-planner[megatron]' (megatron-core) for the megatron arm.",
        ) from None
    return scheduler(capacity, DomainGroup(n))


class ArmPlanner:
    """Plans of one arm, batch by batch (``dhp-megatron`` keeps its scheduler, warmed once).

    ``request`` is the planning request of a batch with the packed profile (what
    ``trainer.train_hf`` makes); ``sample_profile`` is the per-sample profile, needed by the
    ``megatron`` and ``dhp-megatron`` arms.
    """

    def __init__(self, arm: str, sample_profile: Mapping[str, Any] | None = None) -> None:
        if arm not in ARMS:
            raise ProblemError(f"unknown arm {arm!r}", field="arm", hint=f"use one of {', '.join(ARMS)}.")
        if ARMS[arm] == "per-sample" and sample_profile is None:
            raise ProblemError(
                f"the {arm} arm needs the per-sample profile",
                field="sample_profile",
                hint="derive it with trainer.per_sample_costs.per_sample_profile.",
            )
        self.arm = arm
        self.execution = ARMS[arm]
        self.sample_profile = dict(sample_profile) if sample_profile is not None else None
        self._scheduler: Any = None

    def plan(self, request: Mapping[str, Any]) -> dict[str, Any]:
        if self.arm == "static":
            doc = static_plan(request)
        elif self.arm == "megatron":
            assert self.sample_profile is not None
            doc = megatron_plan(request, self.sample_profile)
        elif self.arm == "dhp-megatron":
            doc = self._dhp_megatron(request)
        else:
            from planning.planner import plan

            doc = plan(_problem(request)).to_json()
        doc["arm"] = self.arm
        doc["execution"] = self.execution
        return doc

    def _dhp_megatron(self, request: Mapping[str, Any]) -> dict[str, Any]:
        from trainer.megatron import MEGATRON_RULES, DomainGroup, PlannedCPScheduler, assignment_of

        assert self.sample_profile is not None
        capacity = int(self.sample_profile["capacity_tokens_per_rank"])
        problem = _problem(request, self.sample_profile, MEGATRON_RULES)
        if self._scheduler is None:
            budget = float(request.get("options", {}).get("time_budget_ms", 200.0))
            self._scheduler = PlannedCPScheduler(
                capacity,
                DomainGroup(problem.cluster.domain_size),
                profile=self.sample_profile,
                model=request["model"],
                cluster=request["cluster"],
                budget_ms=budget,
            )
        t0 = time.perf_counter()
        seqlens = [(s.id, int(L)) for s, L in zip(problem.batch.samples, problem.batch.lengths, strict=True)]
        _, sample_id_groups = self._scheduler.get_groups_and_subsamples(seqlens, None)
        wall = (time.perf_counter() - t0) * 1000.0
        return evaluated(problem, assignment_of(sample_id_groups, problem.batch.index), "dhp PlannedCPScheduler", wall)
