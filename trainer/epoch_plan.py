"""The trainer side of a planned epoch: read the plan file and give each rank, step by step, its
micro-batches, its group and its samples' shards, with no planner or service on the step's path.

``EpochPlan(path)`` reads ``plan.parquet`` (or its directory); ``work(step, rank)`` is the rank's
:class:`trainer.apply.RankWork` of that step (the single definition of how tokens are split);
``iter_rank(rank)`` walks the epoch. ``PlannedBatchSampler`` is a batch sampler for a PyTorch
``DataLoader``: for each step it yields the dataset indices of the rank's samples, micro-batch by
micro-batch, and keeps the step's work beside them (torch is imported only when it is created).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from jobs.planfile import INDEX_FILE, PLAN_FILE, read_plan_table
from optimizer.errors import ProblemError


@dataclass(frozen=True)
class StepWork:
    step: int
    rank: int
    work: Any
    """:class:`trainer.apply.RankWork`: per micro-batch the rank's group, position and shards."""
    sample_ids: tuple[str, ...]
    """The rank's samples, micro-batch by micro-batch (each once, in the order it meets them)."""


class EpochPlan:
    """A plan file opened for reading (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        self.path = p / PLAN_FILE if p.is_dir() else p
        table = read_plan_table(self.path, ["step", "status", "plan", "error", "predicted_step_time_s"])
        self._status = table.column("status").to_pylist()
        self._plan = table.column("plan").to_pylist()
        self._error = table.column("error").to_pylist()
        self.predicted = table.column("predicted_step_time_s").to_pylist()
        steps = table.column("step").to_pylist()
        if steps != list(range(len(steps))):
            raise ProblemError(
                "steps are not numbered 0, 1, ... in order",
                field="plan_file",
                hint="give a plan.parquet written by 'dhp plan-epoch'.",
            )
        index = self.path.parent / INDEX_FILE
        self.index: dict[str, Any] | None = json.loads(index.read_text()) if index.exists() else None
        self._doc = lru_cache(maxsize=4)(self._load)

    def __len__(self) -> int:
        return len(self._plan)

    @property
    def failed_steps(self) -> list[int]:
        return [s for s, st in enumerate(self._status) if st != "ok"]

    def _load(self, step: int) -> dict[str, Any]:
        return json.loads(self._plan[step])

    def plan(self, step: int) -> dict[str, Any]:
        """The plan document of ``step``; a step that failed to plan raises, naming the step and sample."""
        if not 0 <= step < len(self):
            raise ProblemError(
                f"step {step} is outside the epoch's {len(self)} steps",
                field="step",
                hint=f"use a step from 0 to {len(self) - 1}.",
            )
        if self._status[step] != "ok":
            err = json.loads(self._error[step] or "{}")
            sample = f" (sample {err['sample']!r})" if err.get("sample") else ""
            raise ProblemError(
                f"step {step} has no plan{sample}: {err.get('message', 'failed')}",
                field=f"steps[{step}]",
                hint=err.get("hint") or "fix the sample and plan the epoch again.",
            )
        return self._doc(step)

    def work(self, step: int, rank: int, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> StepWork:
        """``rank``: the global rank (with tensor or pipeline parallelism, as
        :func:`trainer.apply.apply_plan` maps it)."""
        from trainer.apply import apply_plan

        work = apply_plan(self.plan(step), rank, tensor_parallel, pipeline_parallel)
        ids: dict[str, None] = {}
        for mb in work.micro_batches:
            for shard in mb.shards:
                ids.setdefault(shard.sample, None)
        return StepWork(step, rank, work, tuple(ids))

    def iter_rank(
        self, rank: int, start: int = 0, skip_failed: bool = False, tensor_parallel: int = 1, pipeline_parallel: int = 1
    ) -> Iterator[StepWork]:
        """The rank's work in every step from ``start`` on; failed steps raise unless skipped."""
        for step in range(start, len(self)):
            if skip_failed and self._status[step] != "ok":
                continue
            yield self.work(step, rank, tensor_parallel, pipeline_parallel)


def planned_batch_sampler(
    plan: EpochPlan | str | Path,
    rank: int,
    index_of: Mapping[str, int] | Sequence[str],
    start: int = 0,
    skip_failed: bool = False,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> Any:
    """A ``torch.utils.data.Sampler`` for ``DataLoader(dataset, batch_sampler=...)``: per step the
    dataset indices of ``rank``'s samples (``index_of``: sample id -> dataset index, or the dataset's
    ids in order). ``sampler.current`` is the :class:`StepWork` of the step last yielded, and
    ``sampler.works`` yields the works in the same order for zipping with the loader."""
    from torch.utils.data import Sampler

    epoch = plan if isinstance(plan, EpochPlan) else EpochPlan(plan)
    lookup = index_of if isinstance(index_of, Mapping) else {sid: k for k, sid in enumerate(index_of)}

    class PlannedBatchSampler(Sampler[list[int]]):
        def __init__(self) -> None:
            self.current: StepWork | None = None

        def __len__(self) -> int:
            steps = range(start, len(epoch))
            return sum(1 for s in steps if not skip_failed or s not in set(epoch.failed_steps))

        def works(self) -> Iterator[StepWork]:
            return epoch.iter_rank(rank, start, skip_failed, tensor_parallel, pipeline_parallel)

        def __iter__(self) -> Iterator[list[int]]:
            for sw in self.works():
                missing = [s for s in sw.sample_ids if s not in lookup]
                if missing:
                    raise ProblemError(
                        f"step {sw.step} names samples not in the dataset: {missing[:5]}",
                        field="index_of",
                        hint="pass the ids of the dataset the epoch was planned from.",
                    )
                self.current = sw
                yield [lookup[s] for s in sw.sample_ids]

    return PlannedBatchSampler()
