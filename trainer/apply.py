"""What one rank does in each micro-batch of a plan.

:func:`apply_plan` reads a plan (a :class:`optimizer.plan.records.Plan` or its JSON form) and returns, for
every micro-batch, the rank's group, its position in the group and, for each of the group's samples,
the token ranges it holds (zig-zag for ring attention, contiguous for Ulysses, zig-zag chunks cut
into u pieces for hybrid, with the padded length the split assumes; :mod:`optimizer.plan.sharding` is
the single definition of the split). A rank that no group of a micro-batch uses gets ``group=None``
there and waits for the next one.

A hybrid plan (``"scheme": "hybrid"``) gives every group its Ulysses width ``ulysses_size`` (u, dividing
the group size; 1 for a group of one rank). Its ranks then form Ulysses sub-groups (u consecutive
positions) and rings (the positions with the same index in their sub-group); ``RankWork.sub_groups``
lists all of them, the same list on every rank, so the trainer creates them collectively up front.

With tensor or pipeline parallelism the plan's ranks are planner ranks; ``rank`` is the process's
global rank and groups are returned in global ranks (:mod:`trainer.ranks`, Megatron's order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optimizer.errors import ProblemError
from optimizer.plan.sharding import padded_length, token_ranges
from trainer.ranks import RankLayout

SCHEMES = ("ring", "ulysses", "hybrid")


def hybrid_sub_groups(ranks: Sequence[int], ulysses_size: int) -> list[tuple[int, ...]]:
    """The sub-groups of size >= 2 of a hybrid group, in position order: its Ulysses sub-groups
    (``ranks[i u : (i + 1) u]``), then its rings (``ranks[j::u]``)."""
    ranks, u = tuple(ranks), ulysses_size
    if u < 1 or len(ranks) % u:
        raise ValueError(f"the Ulysses width {u} must divide the group size {len(ranks)}")
    ulysses = [ranks[a : a + u] for a in range(0, len(ranks), u)]
    rings = [ranks[j::u] for j in range(u)]
    return [g for g in ulysses + rings if len(g) >= 2]


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
    ulysses_size: int = 1
    """The group's Ulysses width u (hybrid plans; 1 otherwise)."""

    @property
    def degree(self) -> int:
        return len(self.group) if self.group else 0

    @property
    def ulysses_ranks(self) -> tuple[int, ...]:
        """The rank's Ulysses sub-group in a hybrid group: the u positions ``i u .. i u + u - 1`` holding its
        ring position i (empty when idle)."""
        if not self.group:
            return ()
        a = self.position // self.ulysses_size * self.ulysses_size
        return self.group[a : a + self.ulysses_size]

    @property
    def ring_ranks(self) -> tuple[int, ...]:
        """The rank's ring in a hybrid group: the positions ``j, u + j, 2u + j, ...`` with its Ulysses index j
        (the whole group when u = 1; empty when idle)."""
        if not self.group:
            return ()
        return self.group[self.position % self.ulysses_size :: self.ulysses_size]


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
    sub_groups: tuple[tuple[int, ...], ...] = ()
    """Every Ulysses sub-group and ring of size >= 2 of a hybrid plan's groups (:func:`hybrid_sub_groups`), in
    global ranks, at every tensor rank and stage, each once, in the plan's order (the same list on every
    rank, created after ``communicators``); empty for the other schemes."""

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
    if scheme not in SCHEMES:
        raise ProblemError(f"unknown scheme {scheme!r}", field="plan.scheme", hint="use 'ring', 'ulysses' or 'hybrid'.")
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
    subs: dict[tuple[int, ...], tuple[int, ...]] = {}
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
            u = 1
            if scheme == "hybrid":
                u = _ulysses_size(g, len(ranks), f"plan.micro_batches[{m}].groups[{k}]")
                for sub in hybrid_sub_groups(ranks, u):
                    subs.setdefault(tuple(sorted(sub)), sub)
            if rank in ranks:
                if mine is not None:
                    raise ProblemError(
                        f"rank {rank} is in two groups",
                        field=f"plan.micro_batches[{m}]",
                        hint="validate the plan with 'dhp validate'.",
                    )
                mine = (ranks, g, u)
        if mine is None:
            out.append(MicroBatchWork(m, None, -1, ()))
            continue
        ranks, g, u = mine
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
            real = token_ranges(length, d, scheme, u)[pos]
            full = token_ranges(padded, d, scheme, u)[pos]
            shards.append(Shard(sid, length, padded, tuple(real), tuple(full)))
        mapped = ranks if layout is None else layout.to_global(ranks, tp_rank, stage)
        out.append(MicroBatchWork(m, mapped, pos, tuple(shards), float(g.get("predicted_time_s", 0.0)), u))
    communicators = tuple(comms) if layout is None else tuple(layout.every_copy(comms))
    sub_groups = tuple(subs.values()) if layout is None else tuple(layout.every_copy(subs.values()))
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
        sub_groups,
    )


def _ulysses_size(group: Mapping[str, Any], d: int, where: str) -> int:
    """A hybrid group's Ulysses width, checked: a positive integer that divides the group size."""
    if "ulysses_size" not in group:
        raise ProblemError(
            "has no 'ulysses_size'",
            field=f"{where}.ulysses_size",
            hint="a hybrid plan gives every group its Ulysses width (1 for a group of one rank); "
            "pass the plan as 'dhp plan' printed it.",
        )
    u = group["ulysses_size"]
    if isinstance(u, bool) or not isinstance(u, int) or u < 1:
        raise ProblemError(
            f"must be a positive integer, got {u!r}",
            field=f"{where}.ulysses_size",
            hint="give the number of ranks of each Ulysses sub-group, a divisor of the group size.",
        )
    if d % u:
        raise ProblemError(
            f"{u} does not divide the group's {d} ranks",
            field=f"{where}.ulysses_size",
            hint=f"the group runs Ulysses over u ranks inside a ring of d / u: use a divisor of {d}.",
        )
    return u


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
