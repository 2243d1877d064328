"""The job's existing communicators as rank sets, and the new ones a plan needs.

A request may list the rank groups the job already holds communicators for (``existing_groups``).
These helpers read them; :mod:`optimizer.plan.group_reuse` moves a plan's groups onto them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from optimizer.problem.problem import Problem

Ranks = tuple[int, ...]


def existing_set(problem: Problem) -> set[Ranks]:
    return {tuple(sorted(g)) for g in problem.existing_groups if len(g) >= 2}


def new_communicators(problem: Problem, groups: Iterable[Sequence[int]]) -> list[Ranks]:
    """Groups of two or more ranks, in first-use order, that are not among the existing groups."""
    have = existing_set(problem)
    out: dict[Ranks, None] = {}
    for g in groups:
        key = tuple(sorted(g))
        if len(key) >= 2 and key not in have:
            out.setdefault(key, None)
    return list(out)


def reporting(problem: Problem) -> bool:
    """Whether plans of this problem report new communicators and their cost."""
    return (
        bool(problem.existing_groups) or problem.options.new_group_cost_s > 0 or problem.options.group_reuse == "only"
    )


def active(problem: Problem) -> bool:
    """Whether the planner should adapt its groups to the existing ones."""
    mode = problem.options.group_reuse
    return mode == "only" or (mode == "prefer" and bool(problem.existing_groups))
