"""Planner ranks and global ranks when tensor and pipeline parallelism share the job.

The planner plans a domain of N ranks (data x context parallel). A job with tensor-parallel size T
and P pipeline stages has N x T x P processes, numbered in Megatron-LM's order (its default
``tp-cp-ep-dp-pp``: tensor-parallel rank fastest, then the data/context domain, then the pipeline
stage; ``megatron/core/parallel_state.py``)::

    global = stage x (N x T) + planner_rank x T + tp_rank

So every planner group exists once per (tensor-parallel rank, stage): the ranks at the same tensor
rank and stage form one ring, and the gradient reduction of a stage's tensor shard runs over the N
ranks that share both. With T = P = 1 global and planner ranks are the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from optimizer.errors import ProblemError


@dataclass(frozen=True)
class RankLayout:
    """How a job's global ranks split into (planner rank, tensor-parallel rank, pipeline stage)."""

    domain_size: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    def __post_init__(self) -> None:
        for name in ("domain_size", "tensor_parallel", "pipeline_parallel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProblemError(
                    f"must be a positive integer, got {value!r}",
                    field=name,
                    hint="give the job's sizes as the cluster document does.",
                )

    @property
    def world_size(self) -> int:
        return self.domain_size * self.tensor_parallel * self.pipeline_parallel

    def global_rank(self, planner_rank: int, tp_rank: int = 0, stage: int = 0) -> int:
        return (stage * self.domain_size + planner_rank) * self.tensor_parallel + tp_rank

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(planner rank, tensor-parallel rank, pipeline stage) of a global rank."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ProblemError(
                f"rank {rank!r} is outside the job's {self.world_size} ranks ({self.domain_size} planned x TP "
                f"{self.tensor_parallel} x PP {self.pipeline_parallel})",
                field="rank",
                hint=f"use a global rank from 0 to {self.world_size - 1}.",
            )
        tp_rank = rank % self.tensor_parallel
        rest = rank // self.tensor_parallel
        return rest % self.domain_size, tp_rank, rest // self.domain_size

    def to_global(self, ranks: Sequence[int], tp_rank: int, stage: int) -> tuple[int, ...]:
        """A planner group's global ranks at one tensor rank and stage (same order)."""
        return tuple(self.global_rank(r, tp_rank, stage) for r in ranks)

    def every_copy(self, groups: Iterable[Sequence[int]]) -> list[tuple[int, ...]]:
        """Each planner group at every (stage, tensor rank), in an order that is the same on every rank."""
        copies = [(s, t) for s in range(self.pipeline_parallel) for t in range(self.tensor_parallel)]
        return [self.to_global(g, t, s) for g in groups for s, t in copies]

    def domain_ranks(self, tp_rank: int, stage: int) -> tuple[int, ...]:
        """The N global ranks holding the same tensor shard of the same stage (the gradient reduction's group)."""
        return self.to_global(range(self.domain_size), tp_rank, stage)
