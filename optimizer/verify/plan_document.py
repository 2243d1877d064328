"""Verification of a plan document: the JSON of :meth:`optimizer.plan.records.Plan.to_json`, read back from a file.

A plan file comes from outside, so no number in it is believed. Each is checked for its type (a JSON
number, not a string or a boolean; an integer where a count is meant; the fields ``Plan.to_json`` always
writes present), for being finite and in range, and against what :mod:`optimizer.verify.verifier`
recomputes from the batch, cluster and profile:

- the ranks and samples of every group: invariants 1-5 and 8 of the verifier;
- each group's ``predicted_time_s`` and ``intra_node``, each micro-batch's ``predicted_time_s`` (its
  slowest group) and ``predicted_step_time_s``, equal to the recomputed ones within the verifier's tolerance;
- ``degree`` equal to the group's number of ranks; ``domain_size`` equal to the cluster's ranks, and
  ``scheme`` to the profile's; ``communicators`` the plan's distinct groups of two or more ranks;
- each shard's sample, length, padded length and token ranges as the batch and the scheme give them
  (and ``lengths``, which plan files of jobs carry instead of shards);
- ``lower_bound_s`` not above the step time nor the static baseline's, ``gap`` and ``ratio_to_bound``
  as the step time and the bound give them, ``static_baseline`` counts in range and its speedup
  consistent, the solver's figures finite.

Each problem is one line naming the field's path (``micro_batches[3].groups[1].predicted_time_s: is
NaN``); a figure that fails its own check is not compared again. Fields that only some producers
write (``degree``, ``shards``, ``lengths``, ``static_baseline``, ``solver``, ``new_communicators``,
``group_setup_s``) are checked when present.

A plan made for other inputs is said so first, in one line that names what differs and the fix
(:func:`leading_line`), before the field lines it causes: a plan for another number of ranks is that
line alone (none of its groups can be judged on this cluster), as is a plan that names sample ids the
batch does not have (a plan for another batch; one line per such group follows); a plan for another
context-parallel scheme, or whose group times are mostly not this cluster's, model's and profile's, is
that line and then its details. A document that is not a plan object, or whose groups have no readable
ranks and sample ids, is bad input (:class:`optimizer.errors.ProblemError`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from optimizer.costs.cp_schemes import ulysses_width
from optimizer.plan.records import (
    assignment_from_json,
    bound_gap,
    bound_ratio,
    communicators_of,
    shard_json,
    static_speedup,
)
from optimizer.problem.options import CP_SCHEMES
from optimizer.problem.problem import Problem
from optimizer.verify.document_fields import Fields, describe, same_json
from optimizer.verify.verifier import (
    REL_TOL,
    GroupClaims,
    Report,
    check_assignment,
    close,
    communicator_violations,
    field_place,
)


def check_plan_document(problem: Problem, doc: Any) -> Report:
    """Every problem of the plan document ``doc`` for ``problem`` (see the module docstring)."""
    foreign = _foreign_samples(doc, problem.batch.index)
    if foreign:
        return Report(violations=foreign)
    assignment = assignment_from_json(doc, problem.batch.index)
    fields = Fields()
    leads: list[str] = []
    n_ranks = problem.cluster.domain_size
    domain = fields.integer(doc, "domain_size", "domain_size", low=1)
    if domain is not None and domain != n_ranks:
        return Report(
            violations=[
                leading_line(
                    f"this plan is for {domain} ranks, the cluster has {n_ranks}",
                    "domain_size",
                    "validate it against the cluster it was planned for, or plan the batch again for this one",
                )
            ]
        )
    scheme, want_scheme = fields.text(doc, "scheme", "scheme"), problem.cost_profile.scheme
    if scheme is not None and scheme != want_scheme:
        if scheme in CP_SCHEMES:  # a plan for another scheme: its shards and times follow from that
            leads.append(
                leading_line(
                    f"this plan is for {scheme} context parallelism, the profile's scheme is {want_scheme}",
                    "scheme",
                    "validate it against the profile and options.cp_scheme it was planned with",
                )
            )
        else:
            fields.fail("scheme", f"is {scheme!r}, the profile's scheme is {want_scheme!r}")
    mbs: list[Mapping[str, Any]] = doc["micro_batches"]
    seconds, intra = [], []
    for m, mb in enumerate(mbs):
        for k, group in enumerate(mb["groups"]):
            seconds.append(fields.number(group, "predicted_time_s", field_place(m, k, "predicted_time_s")))
            intra.append(fields.flag(group, "intra_node", field_place(m, k, "intra_node")))
            _group_figures(fields, problem, group, field_place(m, k))
    times: list[list[float]] = []
    report = check_assignment(
        problem, assignment, times=times, claims=GroupClaims.of(seconds, intra), place=field_place
    )
    found = report.violations
    if not leads:
        leads += _foreign_lengths(doc, problem) or _foreign_times(seconds, [t for mb in times for t in mb])
    for m, (mb, recomputed) in enumerate(zip(mbs, times, strict=True)):
        claimed = fields.number(mb, "predicted_time_s", f"micro_batches[{m}].predicted_time_s")
        slowest = max(recomputed, default=0.0)
        if claimed is not None and not any(map(math.isnan, recomputed)) and not close(claimed, slowest):
            found.append(
                f"micro_batches[{m}].predicted_time_s: {claimed:.6g} s, its slowest group's recomputed time is "
                f"{slowest:.6g} s"
            )
    # A group with ranks out of range (NaN, named above) has no time: the step cannot be recomputed.
    whole = not any(math.isnan(t) for mb in times for t in mb)
    figures, step, bound = _step_figures(fields, doc, report.step_time_s if whole else None)
    found += figures + _static_figures(fields, problem, doc, step, bound)
    rank_groups = [[g["ranks"] for g in mb["groups"]] for mb in mbs]
    listed = fields.rank_lists(doc, "communicators", "communicators")
    if listed is not None and not same_json(
        listed, [list(c) for c in communicators_of(r for mb in rank_groups for r in mb)]
    ):
        found.append("communicators: are not the plan's distinct groups of two or more ranks in first-use order")
    new = fields.rank_lists(doc, "new_communicators", "new_communicators", required=False)
    setup = fields.number(doc, "group_setup_s", "group_setup_s", required=False)
    found.extend(communicator_violations(problem, rank_groups, new, setup if new is not None else None, field_place))
    _solver_figures(fields, doc)
    report.violations = leads + fields.problems + found
    return report


def leading_line(what: str, field: str, fix: str) -> str:
    """The line that leads a report on a plan made for other inputs: what differs, the field that shows it, the fix."""
    return f"{what} ({field}): {fix}"


def _foreign_samples(doc: Any, index: Mapping[str, int]) -> list[str]:
    """When the plan names sample ids the batch does not have: the leading line, then one line per such group;
    else nothing. Only readable groups are looked at (:func:`assignment_from_json` judges the rest)."""
    micro_batches = doc.get("micro_batches") if isinstance(doc, Mapping) else None
    lines, unknown, named = [], [], 0
    for m, mb in enumerate(micro_batches if isinstance(micro_batches, list) else []):
        groups = mb.get("groups") if isinstance(mb, Mapping) else None
        for k, group in enumerate(groups if isinstance(groups, list) else []):
            samples = group.get("samples") if isinstance(group, Mapping) else None
            ids = [s for s in samples if isinstance(s, str)] if isinstance(samples, list) else []
            named += len(ids)
            missing = [s for s in ids if s not in index]
            if missing:
                unknown += missing
                more = " ..." if len(missing) > 5 else ""
                lines.append(f"{field_place(m, k, 'samples')}: names samples not in the batch: {missing[:5]}{more}")
    if not unknown:
        return []
    lead = leading_line(
        f"{len(unknown)} of the plan's {named} sample ids are not in the batch, e.g. {unknown[:3]}",
        "samples",
        "validate the plan against the batch it was planned for",
    )
    return [lead, *lines]


def _foreign_lengths(doc: Mapping[str, Any], problem: Problem) -> list[str]:
    """The leading line when most samples' lengths in the shards (at least two) are not the batch's: the plan was
    made for another batch with the same sample ids; else nothing."""
    lengths, index = problem.batch.lengths, problem.batch.index
    judged = off = 0
    for mb in doc["micro_batches"]:
        for group in mb["groups"]:
            shards = group.get("shards") if isinstance(group, Mapping) else None
            for shard in shards if isinstance(shards, list) else []:
                sample = shard.get("sample") if isinstance(shard, Mapping) else None
                length = shard.get("length") if isinstance(shard, Mapping) else None
                if isinstance(sample, str) and sample in index and isinstance(length, int):
                    judged += 1
                    off += length != lengths[index[sample]]
    if off < 2 or 2 * off < judged:
        return []
    return [
        leading_line(
            f"{off} of the plan's {judged} samples have other lengths than the batch's samples of the same ids",
            "shards.length",
            "validate the plan against the batch it was planned for",
        )
    ]


def _foreign_times(claimed: list[float | None], recomputed: list[float]) -> list[str]:
    """The leading line when most groups' claimed times (at least two) are not the recomputed ones: the plan was
    made for another batch, cluster, model or profile; else nothing."""
    judged = [(c, r) for c, r in zip(claimed, recomputed, strict=True) if c is not None and not math.isnan(r)]
    off = sum(not close(c, r) for c, r in judged)
    if off < 2 or 2 * off < len(judged):
        return []
    return [
        leading_line(
            f"{off} of the plan's {len(judged)} group times are not what this batch, cluster, model and profile give",
            "predicted_time_s",
            "validate the plan against the batch, cluster, model and profile it was planned with",
        )
    ]


def _group_figures(fields: Fields, problem: Problem, group: Mapping[str, Any], where: str) -> None:
    """A group's degree, and its shards or lengths against the batch and the profile's scheme."""
    ranks, samples = group["ranks"], group["samples"]
    n_ranks = problem.cluster.domain_size
    if not all(0 <= r < n_ranks for r in ranks):  # named by the verifier; its degree and shards cannot be judged
        return
    degree = fields.integer(group, "degree", f"{where}.degree", required=False)
    if degree is not None and degree != len(ranks):
        fields.fail(
            f"{where}.degree",
            f"is {degree}, the group has {len(ranks)} ranks"
            + (f" and the cluster {n_ranks}" if degree > n_ranks else ""),
        )
    lengths = [problem.batch.lengths[problem.batch.index[s]] for s in samples]
    listed = fields.array(group, "lengths", f"{where}.lengths", required=False)
    if listed is not None and not same_json(listed, lengths):
        fields.fail(
            f"{where}.lengths",
            f"are not the batch's lengths of the group's samples ({lengths[:5]}{' ...' if len(lengths) > 5 else ''})",
        )
    if problem.cost_profile.scheme == "hybrid":
        width = fields.integer(group, "ulysses_size", f"{where}.ulysses_size")
        want_width = ulysses_width(problem, len(ranks))
        if width is not None and width != want_width:
            fields.fail(
                f"{where}.ulysses_size",
                f"is {width}, a hybrid group of {len(ranks)} ranks runs Ulysses over {want_width} "
                "(optimizer.costs.cp_schemes.ulysses_width)",
            )
    shards = fields.array(group, "shards", f"{where}.shards", required=False)
    if shards is None:
        return
    if len(shards) != len(samples):
        fields.fail(f"{where}.shards", f"has {len(shards)} entries, the group has {len(samples)} samples")
        return
    scheme, d = problem.cost_profile.scheme, len(ranks)
    u = ulysses_width(problem, d) if scheme == "hybrid" else 1
    for i, (shard, sid, length) in enumerate(zip(shards, samples, lengths, strict=True)):
        path = f"{where}.shards[{i}]"
        if not isinstance(shard, Mapping):
            fields.fail(path, f"is {describe(shard)}, not an object")
            continue
        want = shard_json(sid, length, d, scheme, u)
        for key in want:
            if key not in shard:
                fields.fail(f"{path}.{key}", "is missing")
            elif not same_json(shard[key], want[key]):
                fields.fail(f"{path}.{key}", _shard_mismatch(key, shard[key], want, i, d, scheme))


def _shard_mismatch(key: str, value: Any, want: Mapping[str, Any], i: int, d: int, scheme: str) -> str:
    """Why field ``key`` of shard ``i`` of a group of ``d`` ranks is not ``want[key]``."""
    length = want["length"]
    if key == "ranges":
        return f"are not the {scheme} split of {length} tokens over {d} ranks"
    why = {
        "sample": f"the group's sample {i} is {want['sample']!r}",
        "length": f"the batch's sample {want['sample']!r} has {length} tokens",
        "padded_length": f"{length} tokens over {d} ranks pad to {want['padded_length']} ({scheme})",
    }[key]
    return f"is {describe(value)}, {why}"


def _step_figures(
    fields: Fields, doc: Mapping[str, Any], step_s: float | None
) -> tuple[list[str], float | None, float | None]:
    """The step time, the lower bound and the gap and ratio derived from them, against the recomputed
    step ``step_s`` (None: not recomputed; the bound is then held to the claimed step). Returns the
    problems, and the step time and the bound where they passed."""
    out: list[str] = []
    step = fields.number(doc, "predicted_step_time_s", "predicted_step_time_s")
    if step is not None and step_s is not None and not close(step, step_s):
        out.append(f"predicted_step_time_s: {step:.6g} s, recomputed {step_s:.6g} s")
        step = None
    bound = fields.number(doc, "lower_bound_s", "lower_bound_s")
    limit, which = (step_s, "recomputed") if step_s is not None else (step, "predicted")
    if bound is not None and limit is not None and bound > limit * (1 + REL_TOL):
        out.append(f"lower_bound_s: {bound:.6g} s exceeds the {which} step time {limit:.6g} s")
        bound = None
    gap = fields.number(doc, "gap", "gap")
    ratio = fields.number(doc, "ratio_to_bound", "ratio_to_bound")
    if step is not None and bound is not None:
        for name, claimed, want in (
            ("gap", gap, bound_gap(step, bound)),
            ("ratio_to_bound", ratio, bound_ratio(step, bound)),
        ):
            if claimed is not None and not close(claimed, want):
                out.append(f"{name}: is {claimed:.6g}, the step time and the lower bound give {want:.6g}")
    return out, step, bound


def _static_figures(
    fields: Fields, problem: Problem, doc: Mapping[str, Any], step: float | None, bound: float | None
) -> list[str]:
    """The static baseline, when given: its counts in range, its step time not below the lower bound,
    its speedup the ratio of its step time to the plan's (``step`` and ``bound``: None where they failed)."""
    out: list[str] = []
    static = fields.mapping(doc, "static_baseline", "static_baseline", required=False)
    if static is None:
        return out
    n_ranks, n_samples = problem.cluster.domain_size, len(problem.batch.samples)
    fields.integer(
        static, "degree", "static_baseline.degree", low=1, high=n_ranks, what=f"the cluster's {n_ranks} ranks"
    )
    fields.integer(
        static,
        "micro_batches",
        "static_baseline.micro_batches",
        low=1,
        high=n_samples,
        what=f"the batch's {n_samples} samples",
    )
    static_s = fields.number(static, "predicted_step_time_s", "static_baseline.predicted_step_time_s")
    if static_s is not None and bound is not None and bound > static_s * (1 + REL_TOL):
        out.append(f"static_baseline.predicted_step_time_s: {static_s:.6g} s is below the lower bound {bound:.6g} s")
    speedup = fields.number(static, "speedup", "static_baseline.speedup", required=False, nullable=True)
    readable = speedup is not None or static.get("speedup", 0) is None  # a number that passed, or null
    if static_s is not None and step is not None and "speedup" in static and readable:
        expected = static_speedup(static_s, step)
        agrees = speedup is None if expected is None else speedup is not None and close(speedup, expected)
        if not agrees:
            out.append(
                f"static_baseline.speedup: is {describe(static['speedup'])}, the static and the plan's step times give "
                + ("null" if expected is None else f"{expected:.6g}")
            )
    return out


def _solver_figures(fields: Fields, doc: Mapping[str, Any]) -> None:
    """The solver's figures, when given, are finite and not negative (they are reported as found, never recomputed)."""
    solver = fields.mapping(doc, "solver", "solver", required=False)
    if solver is None:
        return
    for key in ("wall_ms", "budget_ms", "objective_s", "bound_s"):
        fields.number(solver, key, f"solver.{key}", required=False, nullable=key not in ("wall_ms", "budget_ms"))
    trace = fields.array(solver, "trace", "solver.trace", required=False) or []
    for i, point in enumerate(trace):
        if not isinstance(point, Mapping):
            fields.fail(f"solver.trace[{i}]", f"is {describe(point)}, not an object")
            continue
        for key in ("elapsed_ms", "objective_s", "bound_s"):
            fields.number(point, key, f"solver.trace[{i}].{key}", required=key != "bound_s", nullable=key == "bound_s")
