"""Megatron-Core's own hybrid context-parallel scheduler (``BalancedCPScheduler``) as a benchmark baseline.

The scheduler is megatron-core's code (``megatron.core.pipeline_parallel.hybrid_cp_schedule``,
``pip install 'dhp-planner[megatron]'``), imported at run time; without it the planner is skipped
with that reason. It is run as Megatron's data-loader wrapper runs it: made with the per-rank
sub-sample capacity (``max_seq_len_per_rank``: the profile's tokens per rank, the smallest on a
mixed cluster, as one setting holds for every rank) and the data x context-parallel group (here a
stand-in whose ``size()`` is the domain), then asked for
``get_groups_and_subsamples([(sample id, length), ...], config)``; the sample ids are the batch
indices. Its schedule (per barrier group, the sample ids each rank runs) becomes an
:class:`~optimizer.plan.records.Assignment` with :func:`trainer.megatron.assignment_of`, which the
runner verifies and scores under Megatron's rules (:data:`trainer.megatron.MEGATRON_RULES`) like
every other plan. The scheduler only sees lengths: its estimate of a sample's work is
``length^2 / cp_size``, not the profile.

It can fail where the batch is beyond it: a sample whose CP size (the next power of two of
length / capacity) exceeds the domain, or one of its own assertions; that is a result without a
plan, with the reason.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import time
from dataclasses import dataclass, field
from typing import Any

from optimizer.plan.records import Assignment
from optimizer.problem.problem import Problem
from trainer.megatron import DomainGroup, balanced_scheduler_class


@dataclass
class MegatronResult:
    """The scheduler's answer: the assignment (None without one), why not, and the wall time of its call."""

    assignment: Assignment | None
    note: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    wall_ms: float | None = None
    """Milliseconds of ``get_groups_and_subsamples`` alone (None when it was not called)."""


def available() -> bool:
    """Whether megatron-core can be found (without importing it: that loads torch)."""
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        return False


def capacity(problem: Problem) -> int:
    """``max_seq_len_per_rank``: the profile's tokens of one sub-sample per rank, the smallest over the
    cluster's GPU types."""
    profile = problem.cost_profile
    return int(min(profile.capacity_for(node.gpu.name) for node in problem.cluster.nodes))


class MegatronScheduler:
    """Megatron-Core's scheduler on problems of one domain and capacity, made once (its caches kept)."""

    def __init__(self, max_seq_len_per_rank: int, ranks: int) -> None:
        cls = balanced_scheduler_class()
        start = time.perf_counter()
        self.scheduler = cls(max_seq_len_per_rank, DomainGroup(ranks))
        self.construct_ms = (time.perf_counter() - start) * 1000.0
        self.max_seq_len_per_rank = max_seq_len_per_rank
        self.ranks = ranks

    def schedule(self, lengths: list[int]) -> tuple[Any, float]:
        """Megatron's (groups, sample_id_groups) of the batch (sample ids = indices) and the call's milliseconds."""
        pairs = list(enumerate(lengths))
        start = time.perf_counter()
        out = self.scheduler.get_groups_and_subsamples(pairs, None)
        return out, (time.perf_counter() - start) * 1000.0

    def plan(self, problem: Problem) -> MegatronResult:
        """The scheduler's plan of the problem's batch, or why there is none (see the module docstring)."""
        from trainer.megatron import assignment_of

        lengths = [int(x) for x in problem.batch.lengths]
        cap = self.max_seq_len_per_rank
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        need = int(self.scheduler.gpus_needed(lengths[longest]))  # the next power of two of length / capacity
        if need > self.ranks:
            return MegatronResult(
                None,
                f"sample {longest} of {lengths[longest]} tokens needs CP size {need} at {cap} "
                f"tokens per rank, more than the {self.ranks}-rank domain",
            )
        try:
            (_, sample_id_groups), wall = self.schedule(lengths)
        except AssertionError as exc:
            return MegatronResult(None, f"BalancedCPScheduler failed: AssertionError: {exc}")
        assignment = assignment_of(sample_id_groups, {i: i for i in range(len(lengths))})
        details = {
            "max_seq_len_per_rank": cap,
            "barrier_groups": len(sample_id_groups),
            "construct_ms": self.construct_ms,
        }
        return MegatronResult(assignment, None, details, wall)


@functools.cache
def _scheduler(max_seq_len_per_rank: int, ranks: int) -> MegatronScheduler:
    """One scheduler per capacity and domain, as a job makes one (its caches kept across batches)."""
    return MegatronScheduler(max_seq_len_per_rank, ranks)


def megatron_plan(problem: Problem) -> MegatronResult:
    """The real scheduler's plan of ``problem`` (one scheduler per capacity and domain, made on first use),
    or a skipped result naming the install when megatron-core cannot be imported."""
    try:
        scheduler = _scheduler(capacity(problem), problem.domain_size)
    except ImportError as exc:
        return MegatronResult(None, f"skipped: {exc}", {"skipped": True})
    return scheduler.plan(problem)
