"""What one rank does in each micro-batch of a plan.

:func:`apply_plan` reads a plan (a :class:`optimizer.plan.records.Plan` or its JSON form) and returns, for
every micro-batch, the rank's group, its position in the group and, for each of the group's samples,
the token ranges it holds (zig-zag for ring attention, contiguous for Ulysses, with the padded
length the split assumes; :mod:`optimizer.plan.sharding` is the single definition of the split). A rank
that no group of a micro-batch uses gets ``group=None`` there and waits for the next one.

With tensor or pipeline parallelism the plan's ranks are planner ranks; ``rank`` is the process's
global rank and groups are returned in global ranks (:mod:`trainer.ranks`, Megatron's order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optimizer.errors import ProblemError
from optimizer.plan.sharding import padded_length, token_ranges
from trainer.ranks import RankLayout


@dataclass(frozen=True)
class Shard:
    """The part of one sample a rank holds."""

    sample: str
    length: int
    padded_length: int
    ranges: tuple[tuple[int, int], ...]
    """Half-open token ranges into the unpadded sample (a range in the padding is empty)."""
    padded_ranges: tuple[tuple[int, int], ...]
    """The same ranges in the padded sequence (all of equal total size across the group)."""

    @property
    def tokens(self) -> int:
        return sum(b - a for a, b in self.ranges)


@dataclass(frozen=True)
class MicroBatchWork:
    """A rank's part in one micro-batch."""

    index: int
    group: tuple[int, ...] | None
    """Global ranks of the rank's group (in the plan's order), or None when the rank is idle."""
    position: int
    """The rank's index in ``group`` (ring order); -1 when idle."""
    shards: tuple[Shard, ...]
    predicted_time_s: float = 0.0

    @property
    def degree(self) -> int:
        return len(self.group) if self.group else 0


@dataclass(frozen=True)
class RankWork:
    rank: int
    scheme: str
    micro_batches: tuple[MicroBatchWork, ...]
    communicators: tuple[tuple[int, ...], ...]
    """Every group of size >= 2 the plan uses, in global ranks, at every tensor rank and stage, in the
    plan's order (every rank creates them in this order)."""
    predicted_step_time_s: float
    layout: RankLayout | None = None
    """How global ranks map to planner ranks (None: they are the same)."""
    total_labels: int | None = None
    """Label tokens of the whole batch (each sample's length minus one, summed over the plan): the
    loss's denominator, known to every rank without the other ranks' samples."""
    samples: tuple[str, ...] = ()
    """The samples this rank's groups hold, in the order it uses them (what its data loader loads)."""

    @property
    def reduce_ranks(self) -> tuple[int, ...] | None:
        """The ranks the data-parallel gradient reduction runs over (None: the whole job)."""
        if self.layout is None or self.layout.world_size == self.layout.domain_size:
            return None
        _, tp_rank, stage = self.layout.coordinates(self.rank)
        return self.layout.domain_ranks(tp_rank, stage)

    @property
    def reduce_groups(self) -> tuple[tuple[int, ...], ...]:
        """Every gradient-reduction group of the job (one per tensor rank and stage), the same list on every rank."""
        if self.reduce_ranks is None or self.layout is None:
            return ()
        return tuple(
            self.layout.domain_ranks(t, s)
            for s in range(self.layout.pipeline_parallel)
            for t in range(self.layout.tensor_parallel)
        )


def _plan_doc(plan: Any) -> Mapping[str, Any]:
    if isinstance(plan, Mapping):
        return plan
    to_json = getattr(plan, "to_json", None)
    if to_json is None:
        raise ProblemError(
            f"is a {type(plan).__name__}, not a plan",
            field="plan",
            hint="pass an optimizer.plan.records.Plan or the JSON printed by 'dhp plan'.",
        )
    return to_json(shards=True)


def apply_plan(plan: Any, rank: int, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> RankWork:
    """The work of global ``rank`` in every micro-batch of ``plan`` (see the module docstring)."""
    doc = _plan_doc(plan)
    scheme = doc.get("scheme", "ring")
    if scheme not in ("ring", "ulysses"):
        raise ProblemError(f"unknown scheme {scheme!r}", field="plan.scheme", hint="use 'ring' or 'ulysses'.")
    mbs = doc.get("micro_batches")
    if not isinstance(mbs, list):
        raise ProblemError("has no list 'micro_batches'", field="plan", hint="pass a plan printed by 'dhp plan'.")
    domain = doc.get("domain_size")
    layout = None
    global_rank = rank
    if tensor_parallel != 1 or pipeline_parallel != 1:
        if not isinstance(domain, int):
            raise ProblemError(
                "has no 'domain_size'",
                field="plan.domain_size",
                hint="pass the plan as 'dhp plan' printed it: mapping ranks under TP/PP needs it.",
            )
        layout = RankLayout(domain, tensor_parallel, pipeline_parallel)
        rank, tp_rank, stage = layout.coordinates(rank)
    elif isinstance(domain, int) and not 0 <= rank < domain:
        raise ProblemError(
            f"rank {rank} is outside the plan's domain of {domain} ranks",
            field="rank",
            hint=(
                f"use a rank from 0 to {domain - 1}, or pass tensor_parallel / pipeline_parallel when the job has them."
            ),
        )
    out = []
    comms: dict[tuple[int, ...], None] = {}
    total_labels = 0
    for m, mb in enumerate(mbs):
        groups = mb.get("groups") if isinstance(mb, Mapping) else None
        if not isinstance(groups, list):
            raise ProblemError(
                "has no list 'groups'", field=f"plan.micro_batches[{m}]", hint="pass a plan printed by 'dhp plan'."
            )
        mine = None
        for k, g in enumerate(groups):
            ranks = tuple(g.get("ranks", ())) if isinstance(g, Mapping) else ()
            total_labels += _labels(g, f"plan.micro_batches[{m}].groups[{k}]")
            if not ranks:
                raise ProblemError(
                    "has no ranks",
                    field=f"plan.micro_batches[{m}].groups[{k}].ranks",
                    hint="each group lists its global ranks.",
                )
            if len(ranks) > 1:
                comms.setdefault(tuple(ranks), None)
            if rank in ranks:
                if mine is not None:
                    raise ProblemError(
                        f"rank {rank} is in two groups",
                        field=f"plan.micro_batches[{m}]",
                        hint="validate the plan with 'dhp validate'.",
                    )
                mine = (ranks, g)
        if mine is None:
            out.append(MicroBatchWork(m, None, -1, ()))
            continue
        ranks, g = mine
        d = len(ranks)
        pos = ranks.index(rank)
        samples, lengths = g.get("samples", []), g.get("lengths")
        if lengths is None:
            shards_doc = g.get("shards")
            if not isinstance(shards_doc, list):
                raise ProblemError(
                    "gives neither 'lengths' nor 'shards'",
                    field=f"plan.micro_batches[{m}].groups",
                    hint="print the plan with shards (the default of 'dhp plan').",
                )
            lengths = [int(s["length"]) for s in shards_doc]
        if len(samples) != len(lengths):
            raise ProblemError(
                f"lists {len(samples)} samples but {len(lengths)} lengths",
                field=f"plan.micro_batches[{m}].groups",
                hint="pass the plan unchanged as 'dhp plan' printed it.",
            )
        shards = []
        for sid, length in zip(samples, lengths, strict=True):
            length = int(length)
            padded = padded_length(length, d, scheme) if d > 1 else length
            real = token_ranges(length, d, scheme)[pos]
            full = token_ranges(padded, d, scheme)[pos]
            shards.append(Shard(sid, length, padded, tuple(real), tuple(full)))
        mapped = ranks if layout is None else layout.to_global(ranks, tp_rank, stage)
        out.append(MicroBatchWork(m, mapped, pos, tuple(shards), float(g.get("predicted_time_s", 0.0))))
    communicators = tuple(comms) if layout is None else tuple(layout.every_copy(comms))
    mine_ids = tuple(dict.fromkeys(sh.sample for w in out for sh in w.shards))
    return RankWork(
        global_rank,
        scheme,
        tuple(out),
        communicators,
        float(doc.get("predicted_step_time_s", 0.0)),
        layout,
        total_labels,
        mine_ids,
    )


def _labels(group: Any, where: str) -> int:
    """Label tokens of one group's samples (0 when the group gives no lengths; the caller reports that)."""
    if not isinstance(group, Mapping):
        return 0
    lengths = group.get("lengths")
    if lengths is None and isinstance(group.get("shards"), list):
        lengths = [s.get("length", 0) for s in group["shards"] if isinstance(s, Mapping)]
    try:
        return sum(max(0, int(x) - 1) for x in lengths or ())
    except (TypeError, ValueError):
        raise ProblemError(
            f"has a length that is not an integer: {lengths!r}",
            field=where,
            hint="pass the plan unchanged as 'dhp plan' printed it.",
        ) from None
