"""Independent verification of a plan against its problem.

This module recomputes every time from the profile with the scalar formula
(:func:`optimizer.costs.sample_time`), not from the planners' tables, and checks each invariant:

1. every sample of the batch appears exactly once, and no unknown sample appears;
2. ranks are in range, distinct within a group and disjoint between the groups of a micro-batch;
3. group sizes obey the degree rules (policy, maximum, Ulysses head divisibility);
4. memory: a group's tokens divided by its size fit the smallest capacity among its ranks;
5. at most ``max_micro_batches`` micro-batches;
6. predicted group, micro-batch and step times match the recomputed ones;
7. the lower bound does not exceed the predicted step time;
8. with ``options.group_reuse`` ``only``, every group of two or more ranks is one of the request's
   ``existing_groups``; the plan's new communicators and their cost match the recomputed ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from optimizer.costs import sample_time, vision_work
from optimizer.errors import VerificationError
from optimizer.plan import Assignment, Plan
from optimizer.problem import Problem

REL_TOL = 1e-6


@dataclass
class Report:
    """What verification found; ``ok`` when nothing was violated."""

    violations: list[str] = field(default_factory=list)
    step_time_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def raise_if_failed(self) -> None:
        if self.violations:
            shown = "; ".join(self.violations[:5])
            more = f" (and {len(self.violations) - 5} more)" if len(self.violations) > 5 else ""
            raise VerificationError(f"plan is invalid: {shown}{more}", field="plan", hint="this is a planner bug if the plan came from dhp-planner; report it with the request.")


def _degree_problems(problem: Problem, d: int) -> str | None:
    n = problem.cluster.domain_size
    if d > n:
        return f"size {d} exceeds the domain of {n} ranks"
    opts = problem.options
    if opts.max_degree is not None and d > opts.max_degree:
        return f"size {d} exceeds options.max_degree {opts.max_degree}"
    if opts.degree_policy == "pow2" and d & (d - 1):
        return f"size {d} is not a power of two"
    if problem.scheme == "ulysses":
        heads = problem.model.llm.heads // problem.cluster.tensor_parallel
        if heads % d:
            return f"size {d} does not divide the {heads} attention heads per rank (Ulysses)"
    return None


class _Facts:
    """Per-call caches of what the checks look up many times (sample lengths, rank GPUs)."""

    def __init__(self, problem: Problem) -> None:
        profile = problem.cost_profile
        cluster = problem.cluster
        self.profile = profile
        self.lengths = [s.length for s in problem.batch.samples]
        self.vision = [vision_work(profile, s) for s in problem.batch.samples]
        self.rank_node = list(cluster.rank_node)
        names = [cluster.nodes[k].gpu.name for k in self.rank_node]
        self.rank_speed = [profile.speed_for(nm) for nm in names]
        self.rank_capacity = [profile.capacity_for(nm) for nm in names]

    def group(self, ranks: tuple[int, ...], sample_indices: tuple[int, ...]) -> tuple[float, float, bool, float]:
        """(seconds, tokens per rank, intra-node, capacity) of one group, recomputed from the profile."""
        d = len(ranks)
        intra = len({self.rank_node[r] for r in ranks}) == 1
        speed = min(self.rank_speed[r] for r in ranks)
        total = self.profile.group_constant if sample_indices else 0.0
        tokens = 0
        for i in sample_indices:
            total += sample_time(self.profile, self.lengths[i], self.vision[i], d, intra, speed)
            tokens += self.lengths[i]
        return total, tokens / d, intra, min(self.rank_capacity[r] for r in ranks)


def group_time(problem: Problem, ranks: tuple[int, ...], sample_indices: tuple[int, ...]) -> tuple[float, float, bool]:
    """(seconds, tokens per rank, intra-node) of one group, recomputed from the profile."""
    t, per_rank, intra, _ = _Facts(problem).group(ranks, sample_indices)
    return t, per_rank, intra


def check_assignment(problem: Problem, assignment: Assignment, facts: _Facts | None = None, times: list[list[float]] | None = None) -> Report:
    """Check invariants 1-5 and compute the step time of a bare assignment (group times go to ``times``)."""
    report = Report()
    facts = facts or _Facts(problem)
    n_ranks = problem.cluster.domain_size
    n_samples = len(problem.batch.samples)
    seen = [0] * n_samples
    if len(assignment.micro_batches) > problem.options.max_micro_batches:
        report.violations.append(f"{len(assignment.micro_batches)} micro-batches exceed options.max_micro_batches {problem.options.max_micro_batches}")
    step = 0.0
    for m, mb in enumerate(assignment.micro_batches):
        used: set[int] = set()
        slowest = 0.0
        mb_times: list[float] = []
        if times is not None:
            times.append(mb_times)
        for k, (ranks, sample_indices) in enumerate(mb):
            where = f"micro-batch {m} group {k}"
            if not ranks:
                report.violations.append(f"{where}: has no ranks")
                mb_times.append(float("nan"))
                continue
            bad = [r for r in ranks if not 0 <= r < n_ranks]
            if bad:
                report.violations.append(f"{where}: ranks {bad[:5]} outside 0..{n_ranks - 1}")
                mb_times.append(float("nan"))
                continue
            if len(set(ranks)) != len(ranks):
                report.violations.append(f"{where}: repeats a rank")
            overlap = used.intersection(ranks)
            if overlap:
                report.violations.append(f"{where}: ranks {sorted(overlap)[:5]} already used in this micro-batch")
            used.update(ranks)
            why = _degree_problems(problem, len(ranks))
            if why:
                report.violations.append(f"{where}: {why}")
            for i in sample_indices:
                if 0 <= i < n_samples:
                    seen[i] += 1
                else:
                    report.violations.append(f"{where}: unknown sample index {i}")
            t, per_rank, _, capacity = facts.group(ranks, tuple(i for i in sample_indices if 0 <= i < n_samples))
            mb_times.append(t)
            if per_rank > capacity * (1 + REL_TOL):
                report.violations.append(f"{where}: {per_rank:.0f} tokens per rank exceed the capacity of {capacity:.0f}")
            slowest = max(slowest, t)
        step += slowest
    ids = problem.batch.samples
    missing = [ids[i].id for i, c in enumerate(seen) if c == 0]
    twice = [ids[i].id for i, c in enumerate(seen) if c > 1]
    if missing:
        report.violations.append(f"samples not planned: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if twice:
        report.violations.append(f"samples planned more than once: {twice[:5]}")
    report.step_time_s = step
    return report


def verify(plan: Plan, problem: Problem) -> Report:
    """Check every invariant of ``plan`` (see the module docstring)."""
    index = problem.batch.index
    facts = _Facts(problem)
    groups = []
    report = Report()
    for m, mb in enumerate(plan.micro_batches):
        gs = []
        for k, g in enumerate(mb.groups):
            unknown = [s for s in g.samples if s not in index]
            if unknown:
                report.violations.append(f"micro-batch {m} group {k}: unknown samples {unknown[:5]}")
            gs.append((g.ranks, tuple(index[s] for s in g.samples if s in index)))
        groups.append(tuple(gs))
    times: list[list[float]] = []
    base = check_assignment(problem, Assignment(tuple(groups)), facts, times)
    report.violations.extend(base.violations)
    report.step_time_s = base.step_time_s

    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)

    for m, mb in enumerate(plan.micro_batches):
        for k, g in enumerate(mb.groups):
            t = times[m][k]
            if math.isnan(t):
                continue
            if not close(t, g.predicted_time_s):
                report.violations.append(f"micro-batch {m} group {k}: predicted {g.predicted_time_s:.6g} s, recomputed {t:.6g} s")
            intra = len({facts.rank_node[r] for r in g.ranks}) == 1
            if intra != g.intra_node:
                report.violations.append(f"micro-batch {m} group {k}: intra_node says {g.intra_node}, ranks say {intra}")
    if not close(plan.predicted_step_time_s, base.step_time_s):
        report.violations.append(f"predicted step time {plan.predicted_step_time_s:.6g} s, recomputed {base.step_time_s:.6g} s")
    report.violations.extend(communicator_violations(problem, plan))
    if plan.lower_bound_s > plan.predicted_step_time_s * (1 + REL_TOL):
        report.violations.append(f"lower bound {plan.lower_bound_s:.6g} s exceeds the step time {plan.predicted_step_time_s:.6g} s")
    return report


def communicator_violations(problem: Problem, plan: Plan) -> list[str]:
    """Invariant 8: the ``only`` rule, and the new communicators and their cost as reported."""
    out: list[str] = []
    existing = {tuple(sorted(g)) for g in problem.existing_groups}
    needed: dict[tuple[int, ...], None] = {}
    for m, mb in enumerate(plan.micro_batches):
        for k, g in enumerate(mb.groups):
            key = tuple(sorted(g.ranks))
            if len(key) < 2 or key in existing:
                continue
            needed.setdefault(key, None)
            if problem.options.group_reuse == "only":
                out.append(f"micro-batch {m} group {k}: ranks {list(g.ranks)} are not an existing group (options.group_reuse 'only')")
    if plan.new_communicators is not None:
        if set(map(tuple, plan.new_communicators)) != set(needed):
            out.append(f"new_communicators lists {len(plan.new_communicators)} groups, the plan needs {len(needed)} not in existing_groups")
        cost = problem.options.new_group_cost_s * len(needed)
        if not math.isclose(plan.group_setup_s, cost, rel_tol=REL_TOL, abs_tol=1e-12):
            out.append(f"group_setup_s {plan.group_setup_s:.6g} s, recomputed {cost:.6g} s")
    return out
