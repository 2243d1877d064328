"""Independent verification of a plan against its problem.

This module recomputes every time from the profile with the scalar formula
(:func:`optimizer.costs.tables.sample_time`, evaluated by the compiled loops of
:mod:`optimizer.verify.verify_kernels`), not from the planners' tables, and checks each invariant:

1. every sample of the batch appears exactly once, and no unknown sample appears;
2. ranks are in range, distinct within a group and disjoint between the groups of a micro-batch;
3. group sizes obey the degree rules (policy, maximum, Ulysses head divisibility);
4. memory: a group's tokens divided by its size fit the smallest capacity among its ranks (under
   ``options.memory = "sample"`` its longest sample's tokens: samples run one at a time); under
   ``degree_policy = "aligned"`` every group is one of the aligned blocks;
5. at most ``max_micro_batches`` micro-batches;
6. predicted group, micro-batch and step times match the recomputed ones (the step: the sum of the
   micro-batches plus the profile's per-step constant ``time.step_constant``);
7. the lower bound does not exceed the predicted step time;
8. with ``options.group_reuse`` ``only``, every group of two or more ranks is one of the request's
   ``existing_groups``; the plan's new communicators and their cost match the recomputed ones.

A plan's groups are checked as flat arrays (all ranks, all sample indices, with offsets), in time
linear in their size: one compiled pass recomputes every group, and invariants 1-5 are tested
with array operations. Only when one of those tests fails does a per-group pass in Python name
each violation, with its micro-batch and group. The batch indices of the samples come from the
plan's own ``sample_indices`` once one comparison shows that the batch's ids at those indices are
the ids the groups list; otherwise (absent, stale or wrong) each id is looked up.

A plan file (the JSON of ``Plan.to_json``, read back) is checked field by field by
:mod:`optimizer.verify.plan_document` with this module's recomputation; its violations name each
field by its path in the document (:func:`field_place`) instead of the group (:func:`group_place`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter

import numpy as np

from optimizer.costs.cp_schemes import exchange, pad_unit, ulysses_width
from optimizer.errors import VerificationError
from optimizer.plan.records import Assignment, Plan
from optimizer.problem.degrees import rank_set_problem, size_problem
from optimizer.problem.problem import Problem
from optimizer.verify.verify_kernels import recompute_groups, vision_seconds

REL_TOL = 1e-6

Groups = Sequence[Sequence[tuple[Sequence[int], Sequence[int]]]]
"""Groups as (ranks, sample indices), per micro-batch."""

Place = Callable[[int, int, str], str]
"""Names, in a violation, field ``field`` (``""``: the group itself) of group k of micro-batch m."""


def group_place(m: int, k: int, field: str = "") -> str:
    """Violations of a plan object name the group."""
    return f"micro-batch {m} group {k}"


def field_place(m: int, k: int, field: str = "") -> str:
    """Violations of a plan document name the field's path in it."""
    return f"micro_batches[{m}].groups[{k}]" + (f".{field}" if field else "")


@dataclass
class Report:
    """What verification found; ``ok`` when nothing was violated."""

    violations: list[str] = field(default_factory=list)
    step_time_s: float = 0.0
    """The whole step: the micro-batches and the profile's per-step constant."""
    micro_batches_s: float = 0.0
    """The micro-batches alone (the sum of each one's slowest group): what planners compare."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def raise_if_failed(self) -> None:
        if self.violations:
            shown = "; ".join(self.violations[:5])
            more = f" (and {len(self.violations) - 5} more)" if len(self.violations) > 5 else ""
            raise VerificationError(
                f"plan is invalid: {shown}{more}",
                field="plan",
                hint="this is a planner bug if the plan came from dhp-planner; report it with the request.",
            )


def _offsets(seqs: Sequence[Sized]) -> np.ndarray:
    """Where each of ``seqs`` starts once they are concatenated, and (last) their total length."""
    out = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs)), out=out[1:])
    return out


def _ints(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The integers of ``seqs`` concatenated, and their offsets (see :func:`_offsets`)."""
    start = _offsets(seqs)
    try:
        return np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=int(start[-1])), start
    except OverflowError:  # a value beyond 64 bits is out of range anyway: keep it out of range
        return np.array([v if -(2**63) <= v < 2**63 else -1 for v in chain.from_iterable(seqs)], dtype=np.int64), start


@dataclass(frozen=True)
class _Flat:
    """Groups as flat arrays: group g holds ``ranks[rank_start[g]:rank_start[g + 1]]`` and likewise samples;
    micro-batch m holds groups ``mb_start[m]:mb_start[m + 1]``."""

    ranks: np.ndarray
    rank_start: np.ndarray
    samples: np.ndarray
    sample_start: np.ndarray
    mb_start: np.ndarray

    @classmethod
    def build(
        cls,
        micro_batches: Sequence[Sized],
        rank_seqs: Sequence[Sequence[int]],
        samples: np.ndarray,
        sample_start: np.ndarray,
    ) -> _Flat:
        ranks, rank_start = _ints(rank_seqs)
        return cls(ranks, rank_start, samples, sample_start, _offsets(micro_batches))

    @property
    def n_groups(self) -> int:
        return len(self.rank_start) - 1

    def position(self, g: int) -> tuple[int, int]:
        """(micro-batch, group within it) of group ``g``."""
        m = int(np.searchsorted(self.mb_start, g, side="right")) - 1
        return m, g - int(self.mb_start[m])

    def nested(self, rank_seqs: Sequence[Sequence[int]]) -> list[list[tuple[Sequence[int], tuple[int, ...]]]]:
        """The groups as (ranks, sample indices) per micro-batch, as :func:`check_assignment` reads them."""
        samples, bounds = self.samples.tolist(), self.sample_start.tolist()
        groups = [(rank_seqs[g], tuple(samples[bounds[g] : bounds[g + 1]])) for g in range(self.n_groups)]
        return [groups[a:b] for a, b in zip(self.mb_start[:-1].tolist(), self.mb_start[1:].tolist(), strict=True)]


@dataclass(frozen=True)
class _Recomputed:
    """Per group: seconds, tokens per rank, smallest capacity, intra-node (NaN / False where its ranks are invalid)."""

    step: float
    repeats: int
    seconds: np.ndarray
    per_rank: np.ndarray
    capacity: np.ndarray
    intra: np.ndarray


class _Facts:
    """Per-call arrays of what the checks read (sample lengths and vision work, rank nodes, speeds and capacities)."""

    def __init__(self, problem: Problem) -> None:
        profile = problem.cost_profile
        cluster = problem.cluster
        samples = problem.batch.samples
        self.profile = profile
        self.lengths = np.fromiter(problem.batch.lengths, dtype=np.int64, count=len(samples))
        self.vision = np.zeros(len(samples))
        if profile.vision_linear or profile.vision_quadratic:
            images = problem.batch.images
            vision_seconds(
                images.tokens, images.frames, images.start, profile.vision_linear, profile.vision_quadratic, self.vision
            )
        self.rank_node = np.asarray(cluster.rank_node, dtype=np.int64)
        names = [node.gpu.name for node in cluster.nodes]
        self.rank_speed = np.array([profile.speed_for(nm) for nm in names], dtype=np.float64)[self.rank_node]
        self.rank_capacity = np.array([profile.capacity_for(nm) for nm in names], dtype=np.float64)[self.rank_node]
        self.coef = np.array(
            [
                profile.quadratic,
                profile.linear,
                profile.sample_constant,
                profile.group_constant,
                profile.bytes_per_token,
                profile.messages_per_step,
                profile.latency(False),
                profile.latency(True),
                profile.sample_step,
                profile.group_messages_per_step,
                profile.group_messages_fixed,
                profile.messages_fixed,
                profile.ulysses_bytes_per_token,
            ],
            dtype=np.float64,
        )
        self.problem = problem
        self.pad_unit = pad_unit(profile)
        self.per_sample = problem.options.memory == "sample"

    def recompute(self, flat: _Flat) -> _Recomputed:
        """Every group of ``flat`` recomputed from the profile (see
        :func:`optimizer.verify.verify_kernels.recompute_groups`)."""
        sizes = np.diff(flat.rank_start)
        bandwidth = np.ones((2, int(sizes.max(initial=1)) + 1))
        listed = np.unique(sizes[sizes > 1])
        for d in listed.tolist():
            bandwidth[0, d] = self.profile.bandwidth(d, False)
            bandwidth[1, d] = self.profile.bandwidth(d, True)
        widths = np.array([ulysses_width(self.problem, d) for d in listed.tolist()], dtype=np.float64)
        ex = exchange(self.profile, listed.astype(np.float64), widths)
        shares = np.zeros((3, bandwidth.shape[1]))
        shares[:, listed] = np.stack([ex.share, ex.a2a_share, ex.steps])
        n = flat.n_groups
        seconds, per_rank, capacity, intra = np.empty(n), np.empty(n), np.empty(n), np.empty(n, dtype=np.bool_)
        step, repeats = recompute_groups(
            flat.ranks,
            flat.rank_start,
            flat.samples,
            flat.sample_start,
            flat.mb_start,
            self.rank_node,
            self.rank_speed,
            self.rank_capacity,
            self.lengths,
            self.vision,
            self.coef,
            shares,
            bool(self.profile.overlap_with_attention),
            bandwidth,
            self.pad_unit,
            self.per_sample,
            seconds,
            per_rank,
            capacity,
            intra,
        )
        return _Recomputed(float(step), int(repeats), seconds, per_rank, capacity, intra)


def group_time(problem: Problem, ranks: tuple[int, ...], sample_indices: tuple[int, ...]) -> tuple[float, float, bool]:
    """(seconds, tokens per rank, intra-node) of one group, recomputed from the profile."""
    samples, sample_start = _ints([sample_indices])
    rec = _Facts(problem).recompute(_Flat.build([(ranks,)], [ranks], samples, sample_start))
    return float(rec.seconds[0]), float(rec.per_rank[0]), bool(rec.intra[0])


def _clean(problem: Problem, flat: _Flat, rec: _Recomputed) -> bool:
    """Whether invariants 1-5 hold, tested on the arrays."""
    n_ranks = problem.cluster.domain_size
    n_samples = len(problem.batch.samples)
    if len(flat.mb_start) - 1 > problem.options.micro_batch_limit or rec.repeats:
        return False
    sizes = np.diff(flat.rank_start)
    if len(sizes) and sizes.min() == 0:
        return False
    if len(flat.ranks) and (flat.ranks.min() < 0 or flat.ranks.max() >= n_ranks):
        return False
    if any(size_problem(problem, d) for d in np.unique(sizes).tolist()):
        return False
    if problem.options.degree_policy == "aligned" and len(sizes) and not _aligned(flat, sizes, n_ranks):
        return False
    s = flat.samples
    if len(s) != n_samples or s.min() < 0 or s.max() >= n_samples or np.bincount(s, minlength=n_samples).min() != 1:
        return False
    return not np.any(rec.per_rank > rec.capacity * (1 + REL_TOL))


def _aligned(flat: _Flat, sizes: np.ndarray, n_ranks: int) -> bool:
    """Whether every group smaller than the domain is an aligned block (ranks are in range and
    distinct within a group when this is asked, so contiguity is max - min = size - 1)."""
    starts = flat.rank_start[:-1]
    low = np.minimum.reduceat(flat.ranks, starts)
    high = np.maximum.reduceat(flat.ranks, starts)
    block = (sizes == 1) | (sizes == n_ranks) | ((low % sizes == 0) & (high - low == sizes - 1))
    return bool(block.all())


def _violations(problem: Problem, groups: Groups, rec: _Recomputed, place: Place = group_place) -> list[str]:
    """Invariants 1-5, group by group, each violation named by ``place``."""
    out: list[str] = []
    n_ranks = problem.cluster.domain_size
    n_samples = len(problem.batch.samples)
    seen = [0] * n_samples
    if len(groups) > problem.options.micro_batch_limit:
        out.append(f"{len(groups)} micro-batches exceed options.max_micro_batches {problem.options.max_micro_batches}")
    g = -1
    for m, mb in enumerate(groups):
        used: set[int] = set()
        for k, (ranks, sample_indices) in enumerate(mb):
            g += 1
            where = place(m, k, "ranks")
            if not ranks:
                out.append(f"{where}: has no ranks")
                continue
            bad = [r for r in ranks if not 0 <= r < n_ranks]
            if bad:
                out.append(f"{where}: ranks {bad[:5]} outside 0..{n_ranks - 1}")
                continue
            if len(set(ranks)) != len(ranks):
                out.append(f"{where}: repeats a rank")
            overlap = used.intersection(ranks)
            if overlap:
                out.append(f"{where}: ranks {sorted(overlap)[:5]} already used in this micro-batch")
            used.update(ranks)
            why = size_problem(problem, len(ranks)) or rank_set_problem(problem, ranks)
            if why:
                out.append(f"{where}: {why}")
            for i in sample_indices:
                if 0 <= i < n_samples:
                    seen[i] += 1
                else:
                    out.append(f"{place(m, k, 'samples')}: unknown sample index {i}")
            per_rank, capacity = float(rec.per_rank[g]), float(rec.capacity[g])
            if per_rank > capacity * (1 + REL_TOL):
                whose = "its longest sample's " if problem.options.memory == "sample" else ""
                out.append(
                    f"{place(m, k, '')}: {whose}{per_rank:.0f} tokens per rank exceed the capacity of {capacity:.0f}"
                )
    ids = problem.batch.samples
    missing = [ids[i].id for i, c in enumerate(seen) if c == 0]
    twice = [ids[i].id for i, c in enumerate(seen) if c > 1]
    if missing:
        out.append(f"samples not planned: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if twice:
        out.append(f"samples planned more than once: {twice[:5]}")
    return out


def _check(
    problem: Problem, facts: _Facts, flat: _Flat, groups: Callable[[], Groups], place: Place = group_place
) -> tuple[Report, _Recomputed]:
    """Invariants 1-5 and the recomputed step; ``groups`` gives the nested groups when violations must be named."""
    rec = facts.recompute(flat)
    # The per-step constant adds to every plan's step (see optimizer.costs.profile).
    report = Report(step_time_s=rec.step + problem.cost_profile.step_constant, micro_batches_s=rec.step)
    if not _clean(problem, flat, rec):
        report.violations = _violations(problem, groups(), rec, place)
    return report, rec


@dataclass(frozen=True)
class GroupClaims:
    """What a plan says of each group, in order: its predicted seconds and whether it lies within one
    node; ``timed`` / ``spanned`` are False where the plan says nothing that can be compared."""

    seconds: np.ndarray
    intra: np.ndarray
    timed: np.ndarray
    spanned: np.ndarray

    @classmethod
    def of(cls, seconds: Sequence[float | None], intra: Sequence[bool | None]) -> GroupClaims:
        return cls(
            np.array([np.nan if t is None else t for t in seconds], dtype=np.float64),
            np.array([bool(v) for v in intra], dtype=np.bool_),
            np.array([t is not None for t in seconds], dtype=np.bool_),
            np.array([v is not None for v in intra], dtype=np.bool_),
        )


def _claim_violations(flat: _Flat, rec: _Recomputed, claims: GroupClaims, place: Place) -> list[str]:
    """Invariant 6 for the groups: each claimed time and span against the recomputed one (groups with
    invalid ranks are left out)."""
    out: list[str] = []
    valid = ~np.isnan(rec.seconds)
    off = valid & claims.timed & ~_close(rec.seconds, claims.seconds)
    span = valid & claims.spanned & (rec.intra != claims.intra)
    for i in np.flatnonzero(off | span).tolist():
        m, k = flat.position(i)
        if off[i]:
            out.append(
                f"{place(m, k, 'predicted_time_s')}: predicted {float(claims.seconds[i]):.6g} s, "
                f"recomputed {float(rec.seconds[i]):.6g} s"
            )
        if span[i]:
            out.append(
                f"{place(m, k, 'intra_node')}: intra_node says {bool(claims.intra[i])}, ranks say {bool(rec.intra[i])}"
            )
    return out


def check_assignment(
    problem: Problem,
    assignment: Assignment,
    facts: _Facts | None = None,
    times: list[list[float]] | None = None,
    claims: GroupClaims | None = None,
    place: Place = group_place,
) -> Report:
    """Check invariants 1-5 and compute the step time of a bare assignment (group times go to ``times``),
    and with ``claims`` each group's claimed time and span; violations name groups by ``place``."""
    mbs = assignment.micro_batches
    pairs = [pair for mb in mbs for pair in mb]
    samples, sample_start = _ints([s for _, s in pairs])
    flat = _Flat.build(mbs, [r for r, _ in pairs], samples, sample_start)
    report, rec = _check(problem, facts or _Facts(problem), flat, lambda: mbs, place)
    if claims is not None:
        report.violations.extend(_claim_violations(flat, rec, claims, place))
    if times is not None:
        seconds = rec.seconds.tolist()
        times.extend(seconds[a:b] for a, b in zip(flat.mb_start[:-1].tolist(), flat.mb_start[1:].tolist(), strict=True))
    return report


def _close(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`math.isclose` with this module's tolerances, element by element."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(b - a)
        near = (diff <= np.abs(REL_TOL * b)) | (diff <= np.abs(REL_TOL * a)) | (diff <= 1e-12)
        return (a == b) | (np.isfinite(a) & np.isfinite(b) & near)


def _sample_indices(plan: Plan, problem: Problem, report: Report) -> tuple[np.ndarray, np.ndarray]:
    """The batch indices of every group's samples, concatenated, and their offsets; unknown ids are
    reported and left out."""
    ids = [g.samples for mb in plan.micro_batches for g in mb.groups]
    offsets = _offsets(ids)
    given = _given_indices(plan, problem, ids, int(offsets[-1]))
    if given is not None:
        return given, offsets
    index = problem.batch.index
    try:
        # One pass of dictionary look-ups; a KeyError sends the plan to the per-group pass that names unknown ids.
        looked_up = map(index.__getitem__, chain.from_iterable(ids))
        return np.fromiter(looked_up, dtype=np.int64, count=int(offsets[-1])), offsets
    except KeyError:
        pass
    known: list[list[int]] = []
    for m, mb in enumerate(plan.micro_batches):
        for k, g in enumerate(mb.groups):
            unknown = [s for s in g.samples if s not in index]
            if unknown:
                report.violations.append(f"{group_place(m, k)}: unknown samples {unknown[:5]}")
            known.append([index[s] for s in g.samples if s in index])
    return _ints(known)


def _given_indices(plan: Plan, problem: Problem, ids: list[tuple[str, ...]], total: int) -> np.ndarray | None:
    """The plan's own ``sample_indices`` when they name exactly the ids its groups list (each index in
    range, the batch's sample there having that id), else None."""
    if plan.sample_indices is None or len(plan.sample_indices) != total:
        return None
    given = np.array(plan.sample_indices, dtype=np.int64)
    if total and (given.min() < 0 or given.max() >= len(problem.batch)):
        return None
    listed = np.fromiter(chain.from_iterable(ids), dtype=object, count=total)
    return given if bool(np.all(problem.batch.ids[given] == listed)) else None


def verify(plan: Plan, problem: Problem) -> Report:
    """Check every invariant of ``plan`` (see the module docstring)."""
    report = Report()
    groups = [g for mb in plan.micro_batches for g in mb.groups]
    samples, sample_start = _sample_indices(plan, problem, report)
    rank_seqs = [g.ranks for g in groups]
    flat = _Flat.build([mb.groups for mb in plan.micro_batches], rank_seqs, samples, sample_start)
    base, rec = _check(problem, _Facts(problem), flat, lambda: flat.nested(rank_seqs))
    report.violations.extend(base.violations)
    report.step_time_s = base.step_time_s
    report.micro_batches_s = base.micro_batches_s

    n = len(groups)
    every = np.ones(n, dtype=np.bool_)  # a plan object states every group's time and span
    claims = GroupClaims(
        np.fromiter(map(attrgetter("predicted_time_s"), groups), dtype=np.float64, count=n),
        np.fromiter(map(attrgetter("intra_node"), groups), dtype=np.bool_, count=n),
        every,
        every,
    )
    report.violations.extend(_claim_violations(flat, rec, claims, group_place))
    if not close(plan.predicted_step_time_s, base.step_time_s):
        report.violations.append(
            f"predicted step time {plan.predicted_step_time_s:.6g} s, recomputed {base.step_time_s:.6g} s"
        )
    ranks = [[g.ranks for g in mb.groups] for mb in plan.micro_batches]
    report.violations.extend(communicator_violations(problem, ranks, plan.new_communicators, plan.group_setup_s))
    if plan.lower_bound_s > plan.predicted_step_time_s * (1 + REL_TOL):
        report.violations.append(
            f"lower bound {plan.lower_bound_s:.6g} s exceeds the step time {plan.predicted_step_time_s:.6g} s"
        )
    return report


def close(claimed: float, recomputed: float) -> bool:
    """Whether a claimed figure equals the recomputed one within this module's tolerances."""
    return math.isclose(claimed, recomputed, rel_tol=REL_TOL, abs_tol=1e-12)


def communicator_violations(
    problem: Problem,
    groups: Sequence[Sequence[Sequence[int]]],
    new: Sequence[Sequence[int]] | None,
    setup_s: float | None,
    place: Place = group_place,
) -> list[str]:
    """Invariant 8 for a plan whose groups have ``groups`` (ranks per group, per micro-batch): the ``only``
    rule, and the new communicators and their cost as reported (None: not reported, not checked)."""
    only = problem.options.group_reuse == "only"
    if new is None and not only:
        return []
    out: list[str] = []
    existing = {tuple(sorted(g)) for g in problem.existing_groups}
    needed: dict[tuple[int, ...], None] = {}
    for m, mb in enumerate(groups):
        for k, ranks in enumerate(mb):
            key = tuple(sorted(ranks))
            if len(key) < 2 or key in existing:
                continue
            needed.setdefault(key, None)
            if only:
                out.append(
                    f"{place(m, k, 'ranks')}: ranks {list(ranks)} are not an existing group "
                    "(options.group_reuse 'only')"
                )
    if new is not None:
        if set(map(tuple, new)) != set(needed):
            out.append(
                f"new_communicators: lists {len(new)} groups, the plan needs {len(needed)} not in existing_groups"
            )
        cost = problem.options.new_group_cost_s * len(needed)
        if setup_s is not None and not close(setup_s, cost):
            out.append(f"group_setup_s: {setup_s:.6g} s, recomputed {cost:.6g} s")
    return out
