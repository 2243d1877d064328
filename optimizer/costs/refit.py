"""A cost profile refitted from what a training run measured.

Every group of every step a trainer ran is a profiling point of the run itself: its samples' lengths
and images, its size d, its span (one node or several), its slowest GPU, its Ulysses width, and the
seconds it took (``group_times_s`` of ``POST /v1/plans/{id}/feedback``). Once the form of the
profile is fixed (its scheme, bytes per token, messages per step, padding and the GPUs' relative
speeds, :func:`structure`: those of the profiles the plans were made with, which must agree: a profile
and the profiles refitted from it; the newest plan's profile is the *base*), the formula of
:mod:`optimizer.costs.profile` is linear in its coefficients, so the fit is a non-negative least
squares over :data:`TERMS`: the compute terms, the per-sample and per-group constants, the seconds per
byte inside a node and between nodes (the bandwidths' inverses) and the latency of a message on each
span. ``time.step_constant`` is what a step took beyond its micro-batches' slowest groups (the median
over the steps that sent both).

- Relative error: each point is weighted by 1/measured, so short groups count as much as long ones.
- Robust: the weights are refined by Huber's rule on the residuals (scale from their median absolute
  deviation, 1.345 of it the usual 95%-efficiency constant) and a point more than
  :data:`STRAGGLER_SCALES` scales slower or faster than the fit is dropped as a straggler.
- A term the measurements cannot tell apart from the terms before it in :data:`TERMS` (no group spans
  nodes: the inter-node bandwidth; no sample has images: the vision terms) keeps the base's value, and
  the fit says so.
- ``comm.overlap_with_attention``: which samples' ring transfer shows past their attention is decided
  with the current coefficients, and the fit is repeated until that set stops changing.
- Held out: every :data:`HOLD_OUT_EVERY`-th plan is left out of the fit and its groups, micro-batches and
  steps are predicted with the profile each was made with (*before*) and with the fitted one (*after*);
  those errors are the fit's report.

A fit that cannot be trusted is refused with the reason (:class:`optimizer.errors.ProblemError`): too
few group times for its terms, times that do not grow with the lengths, R^2 or the worst training error
past the caller's thresholds, a transfer rate below :data:`BANDWIDTH_RANGE`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from optimizer.costs.cp_schemes import exchange
from optimizer.costs.nnls import nnls
from optimizer.costs.profile import Bandwidth, CostProfile
from optimizer.errors import ProblemError
from optimizer.plan.sharding import padded_length
from optimizer.problem.problem import Problem

TERMS = (
    "quadratic",
    "linear",
    "sample_constant",
    "group_constant",
    "intra_seconds_per_byte",
    "inter_seconds_per_byte",
    "intra_latency",
    "inter_latency",
    "sample_step",
    "vision_linear",
    "vision_quadratic",
)
"""The coefficients fitted, in the order a term is kept when the measurements cannot separate it from
those before it (the compute and constants first, then the transfers, then the rarer terms)."""
(Q, LIN, A0, B, BYTE_INTRA, BYTE_INTER, LAT_INTRA, LAT_INTER, STEP, V1, V2) = range(len(TERMS))

UNSEEN = {
    "inter_seconds_per_byte": "no measured group spans nodes",
    "intra_seconds_per_byte": "no measured group of two or more ranks stays inside a node",
    "intra_latency": "the profile's messages are not exercised inside a node by the measured groups",
    "inter_latency": "the profile's messages are not exercised between nodes by the measured groups",
    "sample_step": "no measured group has two or more ranks",
    "vision_linear": "no measured sample has images",
    "vision_quadratic": "no measured sample has images",
}
"""Why a term keeps the base's value when no measured group exercises it."""

HOLD_OUT_EVERY = 5
"""Every this-many-th plan (the 5th, 10th, ...) is held out; with 2 to 4 plans, the last one."""
STRAGGLER_SCALES = 4.0
"""Residuals past this many robust scales (1.4826 x median absolute deviation) are stragglers."""
HUBER = 1.345
SEPARABLE = 1e-3
"""A term whose (weighted, normalised) column lies within this relative distance of the span of the
columns before it cannot be told apart from them."""
BANDWIDTH_RANGE = (1e6, 1e13)
"""Transfer rates (bytes/s) a fit may give. Below: the times grew with the bytes as no link is that slow
(refused). Above: the transfers did not show in the times; the rate is capped and the fit says so."""
SPANS = {"intra": "between ranks of one node", "inter": "between ranks of different nodes"}
MIN_POINTS_PER_TERM = 3
DEFAULT_MIN_R2 = 0.9
DEFAULT_MAX_ERROR = 0.25


@dataclass(frozen=True)
class MeasuredGroup:
    """One group of a step as it ran: its ranks, its samples (indices into the batch), its Ulysses width
    and the seconds it took."""

    ranks: tuple[int, ...]
    samples: tuple[int, ...]
    ulysses: int
    seconds: float


@dataclass(frozen=True)
class MeasuredPlan:
    """A plan's problem and one step's measurements of it (``groups`` per micro-batch, in plan order)."""

    key: str
    problem: Problem
    groups: tuple[tuple[MeasuredGroup, ...], ...]
    step_seconds: float | None = None


def measured_plan(
    key: str, problem: Problem, plan_doc: Mapping[str, Any], group_times: Sequence[Sequence[float]], step: float | None
) -> MeasuredPlan:
    """The measurements of one step of a plan document (the body the planner returned) run for ``problem``."""
    index = problem.batch.index
    mbs = plan_doc.get("micro_batches") or []
    if len(mbs) != len(group_times):
        raise ProblemError(
            f"plan {key}: {len(group_times)} micro-batches of group times for a plan of {len(mbs)}",
            field="group_times_s",
            hint="send one list of group times per micro-batch of the plan.",
        )
    out = []
    for m, (mb, times) in enumerate(zip(mbs, group_times, strict=True)):
        groups = mb.get("groups") or []
        if len(groups) != len(times):
            raise ProblemError(
                f"plan {key}: micro-batch {m} has {len(groups)} groups and {len(times)} times",
                field=f"group_times_s[{m}]",
                hint="send one time per group of the micro-batch, in plan order.",
            )
        out.append(
            tuple(
                MeasuredGroup(
                    tuple(int(r) for r in g["ranks"]),
                    tuple(index[s] for s in g["samples"]),
                    int(g.get("ulysses_size", 1)),
                    float(t),
                )
                for g, t in zip(groups, times, strict=True)
                if g.get("samples")
            )
        )
    return MeasuredPlan(key, problem, tuple(out), step)


# -- the design matrix ------------------------------------------------------------------------


def _base_values(profile: CostProfile, d: int, intra: bool) -> np.ndarray:
    """The base profile's value of every term for a group of d ranks on this span."""
    v = np.zeros(len(TERMS))
    v[[Q, LIN, A0, B, STEP, V1, V2]] = [
        profile.quadratic,
        profile.linear,
        profile.sample_constant,
        profile.group_constant,
        profile.sample_step,
        profile.vision_linear,
        profile.vision_quadratic,
    ]
    v[BYTE_INTRA] = 1.0 / profile.bandwidth(max(d, 2), True)
    v[BYTE_INTER] = 1.0 / profile.bandwidth(max(d, 2), False)
    v[LAT_INTRA], v[LAT_INTER] = profile.intra_latency, profile.inter_latency
    return v


def _vision(problem: Problem, i: int) -> tuple[float, float]:
    images = problem.batch.samples[i].images
    return (
        float(sum(im.frames * im.tokens for im in images)),
        float(sum(im.frames * im.tokens * im.tokens for im in images)),
    )


def _group_rows(profile: CostProfile, problem: Problem, g: MeasuredGroup) -> tuple[np.ndarray, list[Any], bool, int]:
    """(compute and constant regressors, per-sample ring parts, intra, d) of one measured group."""
    cluster = problem.cluster
    d = len(g.ranks)
    nodes = {cluster.rank_node[r] for r in g.ranks}
    intra = len(nodes) == 1
    speed = min(profile.speed_for(cluster.rank_gpu(r).name) for r in g.ranks)
    byte, lat = (BYTE_INTRA, LAT_INTRA) if intra else (BYTE_INTER, LAT_INTER)
    x = np.zeros(len(TERMS))
    x[B] = 1.0
    ex = exchange(profile, np.array([float(d)]), np.array([float(g.ulysses)]))
    share, a2a_share, steps = float(ex.share[0]), float(ex.a2a_share[0]), float(ex.steps[0])
    if d > 1:
        x[lat] += profile.group_messages(d)
    rings = []
    for i in g.samples:
        length = problem.batch.samples[i].length
        v1, v2 = _vision(problem, i)
        x[Q] += length * length / d / speed
        x[LIN] += length / d / speed
        x[A0] += 1.0 / speed
        x[V1] += v1 / d / speed
        x[V2] += v2 / d / speed
        if d == 1:
            continue
        x[STEP] += (d - 1) / speed
        sent = padded_length(length, d, profile.scheme) if profile.padded_bytes else length
        ring = np.zeros(len(TERMS))
        ring[byte] = profile.bytes_per_token * sent * share
        ring[lat] = profile.messages_per_step * steps + profile.messages_fixed
        attention = np.zeros(len(TERMS))
        attention[Q] = length * length / d / speed
        x[byte] += profile.ulysses_bytes_per_token * sent * a2a_share
        rings.append((ring, attention))
    return x, rings, intra, d


@dataclass(frozen=True)
class _Design:
    x: np.ndarray  # [rows, terms] without the ring parts
    ring: np.ndarray  # [samples, terms]
    attention: np.ndarray  # [samples, terms]
    ring_row: np.ndarray  # [samples] row of each ring part
    theta_base: np.ndarray  # [rows, terms] base values (per size and span)
    theta_own: np.ndarray  # [rows, terms] the values of the profile each row's plan was made with
    y: np.ndarray
    plan: np.ndarray
    micro_batch: np.ndarray
    overlap: bool

    def matrix(self, theta: np.ndarray) -> np.ndarray:
        """Regressors with the ring parts whose transfer shows under ``theta`` (per row: [rows, terms])."""
        out = self.x.copy()
        if not self.ring.shape[0]:
            return out
        if self.overlap:
            t = theta[self.ring_row]
            shows = (self.ring * t).sum(axis=1) > (self.attention * t).sum(axis=1)
            parts = np.where(shows[:, None], self.ring - self.attention, 0.0)
        else:
            parts = self.ring
        np.add.at(out, self.ring_row, parts)
        return out


def _design(plans: Sequence[MeasuredPlan], profile: CostProfile) -> _Design:
    xs: list[np.ndarray] = []
    bases: list[np.ndarray] = []
    owns: list[np.ndarray] = []
    ys: list[float] = []
    plan_of: list[int] = []
    mb_of: list[int] = []
    rings: list[np.ndarray] = []
    atts: list[np.ndarray] = []
    ring_rows: list[int] = []
    for p, mp in enumerate(plans):
        for m, groups in enumerate(mp.groups):
            for g in groups:
                x, parts, intra, d = _group_rows(profile, mp.problem, g)
                row = len(xs)
                xs.append(x)
                bases.append(_base_values(profile, d, intra))
                owns.append(_base_values(mp.problem.cost_profile, d, intra))
                ys.append(g.seconds)
                plan_of.append(p)
                mb_of.append(m)
                for ring, attention in parts:
                    rings.append(ring)
                    atts.append(attention)
                    ring_rows.append(row)
    n = len(TERMS)
    return _Design(
        np.array(xs).reshape(-1, n),
        np.array(rings).reshape(-1, n),
        np.array(atts).reshape(-1, n),
        np.array(ring_rows, dtype=np.int64),
        np.array(bases).reshape(-1, n),
        np.array(owns).reshape(-1, n),
        np.array(ys, dtype=np.float64),
        np.array(plan_of, dtype=np.int64),
        np.array(mb_of, dtype=np.int64),
        profile.overlap_with_attention,
    )


# -- the fit ----------------------------------------------------------------------------------


def _separable(a: np.ndarray) -> tuple[list[int], dict[int, str]]:
    """The columns of ``a`` (weighted) the data separates, in order, and why each other one is not."""
    kept: list[int] = []
    why: dict[int, str] = {}
    for j in range(a.shape[1]):
        col = a[:, j]
        norm = float(np.linalg.norm(col))
        if norm == 0.0:
            why[j] = UNSEEN.get(TERMS[j], "no measured group exercises it")
            continue
        if kept:
            basis = a[:, kept] / np.linalg.norm(a[:, kept], axis=0)
            coef = np.linalg.lstsq(basis, col / norm, rcond=None)[0]
            if float(np.linalg.norm(col / norm - basis @ coef)) < SEPARABLE:
                used = [TERMS[k] for k, c in zip(kept, coef, strict=True) if abs(c) > 1e-6]
                why[j] = "the measured groups cannot tell it apart from " + ", ".join(used)
                continue
        kept.append(j)
    return kept, why


def _robust_nnls(a: np.ndarray, y: np.ndarray, rounds: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """(coefficients >= 0, weights in [0, 1]) of a Huber-weighted NNLS of relative residuals (rows of ``a`` and
    ``y`` already divided by the measured times); weight 0 marks a straggler."""
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    an = a / norms
    weights = np.ones(y.shape[0])
    coef = np.zeros(a.shape[1])
    for _ in range(rounds):
        sw = np.sqrt(weights)
        coef = nnls(an * sw[:, None], y * sw)
        r = an @ coef - y
        scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        if scale <= 1e-12:
            break
        z = np.abs(r) / scale
        new = np.where(z <= HUBER, 1.0, HUBER / np.maximum(z, 1e-300))
        new[z > STRAGGLER_SCALES] = 0.0
        if np.allclose(new, weights, atol=1e-6):
            break
        weights = new
    return coef / norms, weights


@dataclass(frozen=True)
class Errors:
    """Relative errors |predicted - measured| / measured over held-out groups, micro-batches and steps."""

    groups: tuple[float, float, int]
    micro_batches: tuple[float, float, int]
    steps: tuple[float, float, int] | None

    def to_json(self) -> dict[str, Any]:
        def part(v: tuple[float, float, int] | None) -> dict[str, Any] | None:
            return None if v is None else {"mean": v[0], "worst": v[1], "n": v[2]}

        return {
            "groups": part(self.groups),
            "micro_batches": part(self.micro_batches),
            "steps": part(self.steps),
        }


@dataclass(frozen=True)
class ProfileFit:
    """A refitted profile and how it was obtained."""

    profile: CostProfile
    terms: dict[str, dict[str, Any]]
    """Per term of :data:`TERMS`: ``value``, ``base`` (None for a bandwidth given as a table), ``fitted``, and
    ``reason`` when it kept the base's value or was capped."""
    points: int
    plans: int
    held_out_plans: int
    stragglers: int
    r2: float
    max_rel_error: float
    step_constant_s: float
    held_out_before: Errors | None
    held_out_after: Errors | None
    base_step_constant_s: float = 0.0
    predictions: list[dict[str, Any]] = field(default_factory=list)
    """Per measured group: plan, micro-batch, measured, predicted before and after, held out or not."""

    def to_json(self, predictions: bool = False) -> dict[str, Any]:
        out = {
            "points": self.points,
            "plans": self.plans,
            "held_out_plans": self.held_out_plans,
            "stragglers": self.stragglers,
            "r2": self.r2,
            "max_rel_error": self.max_rel_error,
            "step_constant_s": self.step_constant_s,
            "base_step_constant_s": self.base_step_constant_s,
            "terms": self.terms,
            "held_out": {
                "before": self.held_out_before.to_json() if self.held_out_before else None,
                "after": self.held_out_after.to_json() if self.held_out_after else None,
            },
        }
        if predictions:
            out["predictions"] = self.predictions
        return out


def held_out_plans(n: int) -> list[int]:
    """Indices of the plans held out of a fit over ``n`` plans (see :data:`HOLD_OUT_EVERY`)."""
    if n >= HOLD_OUT_EVERY:
        return list(range(HOLD_OUT_EVERY - 1, n, HOLD_OUT_EVERY))
    return [n - 1] if n >= 2 else []


def _rel(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float, int]:
    e = np.abs(pred - meas) / meas
    return float(e.mean()), float(e.max()), int(e.shape[0])


def _errors(
    design: _Design, pred: np.ndarray, plans: Sequence[MeasuredPlan], rows: np.ndarray, step_constant: float
) -> Errors:
    keys = sorted({(int(design.plan[r]), int(design.micro_batch[r])) for r in rows})
    mb_pred, mb_meas = [], []
    step_pred: dict[int, float] = {}
    for p, m in keys:
        sel = rows[(design.plan[rows] == p) & (design.micro_batch[rows] == m)]
        mb_pred.append(float(pred[sel].max()))
        mb_meas.append(float(design.y[sel].max()))
        step_pred[p] = step_pred.get(p, step_constant) + mb_pred[-1]
    steps = [(step_pred[p], plans[p].step_seconds) for p in step_pred if plans[p].step_seconds]
    return Errors(
        _rel(pred[rows], design.y[rows]),
        _rel(np.array(mb_pred), np.array(mb_meas)),
        _rel(np.array([s[0] for s in steps]), np.array([float(s[1] or 0.0) for s in steps])) if steps else None,
    )


def _step_constant(plans: Sequence[MeasuredPlan], keep: Sequence[int], base: float) -> float:
    """Median over the kept plans' steps of what the step took beyond its micro-batches' slowest groups."""
    extra = []
    for p in keep:
        step = plans[p].step_seconds
        if step:
            extra.append(step - sum(max(g.seconds for g in mb) for mb in plans[p].groups if mb))
    return max(0.0, float(np.median(extra))) if extra else base


def structure(profile: CostProfile) -> tuple[Any, ...]:
    """What a fit keeps fixed: the profile's form, whose coefficients it fits. Plans made with profiles of one
    form (a profile and the profiles refitted from it) are fitted together."""
    return (
        profile.scheme,
        profile.bytes_per_token,
        profile.ulysses_bytes_per_token,
        profile.messages_per_step,
        profile.messages_fixed,
        profile.group_messages_per_step,
        profile.group_messages_fixed,
        profile.padded_bytes,
        profile.overlap_with_attention,
        tuple(sorted(profile.speed_by_gpu.items())),
    )


def fit_profile(
    plans: Sequence[MeasuredPlan],
    *,
    min_r2: float = DEFAULT_MIN_R2,
    max_error: float = DEFAULT_MAX_ERROR,
    source: str = "refitted from measured group times",
) -> ProfileFit:
    """Refit the profile the plans were made with to their measured group times (see the module docstring)."""
    if not plans:
        raise ProblemError("no plans to fit", field="plan_ids", hint="name plans that have feedback.")
    base = plans[-1].problem.cost_profile
    for mp in plans[:-1]:
        if structure(mp.problem.cost_profile) != structure(base):
            raise ProblemError(
                f"plan {mp.key} was made with a profile of another form than plan {plans[-1].key} "
                "(scheme, bytes or messages per token, padding, overlap or GPU speeds differ)",
                field="plan_ids",
                hint="fit plans made with one profile, or with the profiles refitted from it, together.",
            )
    design = _design(plans, base)
    n_rows = design.y.shape[0]
    if n_rows == 0:
        raise ProblemError(
            "none of these plans has group times",
            field="plan_ids",
            hint="send group_times_s with each step's feedback (the trainer's loop does by default).",
        )
    held = set(held_out_plans(len(plans)))
    train = np.array([r for r in range(n_rows) if int(design.plan[r]) not in held], dtype=np.int64)
    test = np.array([r for r in range(n_rows) if int(design.plan[r]) in held], dtype=np.int64)

    theta_rows = design.theta_base.copy()
    weights = np.ones(train.shape[0])
    why: dict[int, str] = {}
    kept: list[int] = []
    coef = np.zeros(len(TERMS))
    for _ in range(8):
        a = design.matrix(theta_rows)
        w = 1.0 / design.y[train]
        kept, why = _separable(a[train] * w[:, None])
        fixed = [j for j in range(len(TERMS)) if j not in kept]
        offset = (a[train][:, fixed] * design.theta_base[train][:, fixed]).sum(axis=1)
        need = MIN_POINTS_PER_TERM * len(kept)
        if train.shape[0] < need:
            raise ProblemError(
                f"{train.shape[0]} measured group times (held-out plans apart) are too few to fit {len(kept)} terms",
                field="plan_ids",
                hint=f"send feedback with group times for more steps: {need} groups or more outside held-out plans.",
            )
        coef, weights = _robust_nnls(a[train][:, kept] * w[:, None], (design.y[train] - offset) * w)
        new_rows = design.theta_base.copy()
        new_rows[:, kept] = coef
        if not design.overlap or np.array_equal(design.matrix(new_rows), a):
            theta_rows = new_rows
            break
        theta_rows = new_rows
    values = dict(zip(kept, coef.tolist(), strict=True))
    if values.get(Q, 0.0) + values.get(LIN, 0.0) <= 0.0 and (Q in values or LIN in values):
        raise ProblemError(
            "the measured group times do not grow with the samples' lengths",
            field="plan_ids",
            hint="fit over steps whose batches mix short and long samples, or check the trainer's group timings.",
        )
    a = design.matrix(theta_rows)
    pred = (a * theta_rows).sum(axis=1)
    inlier = train[weights > 0]
    y_in = design.y[inlier]
    ss_tot = float(((y_in - y_in.mean()) ** 2).sum())
    r2 = 1.0 - float(((y_in - pred[inlier]) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    worst = float((np.abs(pred[inlier] - y_in) / y_in).max())
    if not r2 >= min_r2:
        raise ProblemError(
            f"the fit explains too little of the measured group times: R^2 {r2:.3f} < {min_r2:g}",
            field="min_r2",
            hint="post feedback for more steps (stragglers are dropped, noise is not), or lower min_r2 knowingly.",
        )
    if not worst <= max_error:
        raise ProblemError(
            f"the fit misses a measured group by {worst * 100:.0f}% > {max_error * 100:g}%",
            field="max_error",
            hint="check that the group times are per group in plan order, or raise max_error knowingly.",
        )
    profile, terms = _profile(base, values, why, source)
    step_constant = _step_constant(plans, sorted(set(range(len(plans))) - held), base.step_constant)
    profile = replace(profile, step_constant=step_constant)
    base_pred = (design.matrix(design.theta_own) * design.theta_own).sum(axis=1)
    before = _errors(design, base_pred, plans, test, base.step_constant) if test.size else None
    after = _errors(design, pred, plans, test, step_constant) if test.size else None
    held_rows = set(test.tolist())
    predictions = [
        {
            "plan": plans[int(design.plan[r])].key,
            "micro_batch": int(design.micro_batch[r]),
            "measured_s": float(design.y[r]),
            "before_s": float(base_pred[r]),
            "after_s": float(pred[r]),
            "held_out": r in held_rows,
        }
        for r in range(n_rows)
    ]
    return ProfileFit(
        profile,
        terms,
        int(train.shape[0]),
        len(plans),
        len(held),
        int((weights == 0).sum()),
        r2,
        worst,
        step_constant,
        before,
        after,
        base.step_constant,
        predictions,
    )


def _profile(
    base: CostProfile, values: Mapping[int, float], why: Mapping[int, str], source: str
) -> tuple[CostProfile, dict[str, dict[str, Any]]]:
    """The base profile with the fitted values, and the per-term report."""
    base_values = _base_values(base, 2, True)
    base_values[BYTE_INTER] = 1.0 / base.bandwidth(2, False)
    terms: dict[str, dict[str, Any]] = {}
    changes: dict[str, Any] = {}
    for j, name in enumerate(TERMS):
        entry: dict[str, Any] = {"fitted": j in values}
        if j in (BYTE_INTRA, BYTE_INTER):
            table = base.intra_bandwidth if j == BYTE_INTRA else base.inter_bandwidth
            entry["base"] = 1.0 / table.values[0] if len(table.values) == 1 else None
        else:
            entry["base"] = float(base_values[j])
        if j not in values:
            entry["value"] = entry["base"]
            entry["reason"] = why.get(j, "not fitted")
            terms[name] = entry
            continue
        v = float(values[j])
        if j in (BYTE_INTRA, BYTE_INTER):
            span = "intra" if j == BYTE_INTRA else "inter"
            bw = math.inf if v <= 0 else 1.0 / v
            if bw < BANDWIDTH_RANGE[0]:
                raise ProblemError(
                    f"the fit gives {bw:.3g} bytes/s {SPANS[span]}, slower than any link "
                    f"({BANDWIDTH_RANGE[0]:.0e} bytes/s)",
                    field="plan_ids",
                    hint="check that the group times are seconds per group in plan order.",
                )
            if bw > BANDWIDTH_RANGE[1]:
                entry["reason"] = (
                    f"the transfers did not show in the measured times; capped at {BANDWIDTH_RANGE[1]:.0e} bytes/s"
                )
                bw = BANDWIDTH_RANGE[1]
                v = 1.0 / bw
            changes[f"{span}_bandwidth"] = Bandwidth.constant(bw)
        elif j == LAT_INTRA:
            changes["intra_latency"] = v
        elif j == LAT_INTER:
            changes["inter_latency"] = v
        else:
            changes[name] = v
        entry["value"] = v
        terms[name] = entry
    return replace(base, **changes, source=source), terms
