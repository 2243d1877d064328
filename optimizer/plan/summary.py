"""A readable summary of a plan (``dhp plan --summary``)."""

from __future__ import annotations

from collections import Counter

from optimizer.plan.records import Plan
from optimizer.problem.problem import Problem


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) == 1:
        return str(ranks[0])
    if ranks[-1] - ranks[0] + 1 == len(ranks):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def summary_text(plan: Plan, problem: Problem, max_groups: int = 12, model_note: str | None = None) -> str:
    """The summary of ``plan`` for ``problem``; ``model_note`` follows the model's name (that it is the default)."""
    lines = []
    n = len(problem.batch)
    tokens = sum(problem.batch.lengths)
    lines.append(
        f"batch: {n} samples, {tokens:,} tokens (longest {max(problem.batch.lengths):,}) | "
        f"{problem.cluster.describe()} | {plan.scheme} CP"
    )
    if plan.scheme_reason:
        lines.append(f"scheme: {plan.scheme} ({plan.scheme_reason})")
    model = plan.model or problem.model.name
    lines.append(f"model: {model} ({model_note})" if model_note else f"model: {model}")
    lines.append(
        f"predicted step {plan.predicted_step_time_s:.4f} s | lower bound {plan.lower_bound_s:.4f} s{_which(plan)} | "
        f"ratio {plan.ratio_to_bound:.4f} (gap {plan.gap * 100:.2f}%)"
    )
    if plan.static_baseline is not None:
        sb = plan.static_baseline
        lines.append(
            f"best static power-of-two layout: CP {sb.degree} x {sb.micro_batches} micro-batches, "
            f"{sb.predicted_step_time_s:.4f} s -> speedup {plan.speedup_over_static:.3f}x"
        )
    skipped = plan.solver.details.get("skipped") or {}
    if plan.static_baseline is None:
        why = plan.static_baseline_reason or skipped.get("static_baseline", "no reason recorded")
        lines.append(f"static layout: none ({why})")
    if plan.solver.details.get("bound_tightness"):
        lines.append(f"bound: {plan.solver.details['bound_tightness']}")
    if "tighter_bounds" in skipped:
        lines.append(f"lower bound: {skipped['tighter_bounds']}")
    s = plan.solver
    extra = f", fallback: {s.fallback_reason}" if s.fallback_reason else ""
    lines.append(f"planner: {s.backend} ({s.status}) in {s.wall_ms:.1f} ms{extra}")
    lines.append(f"communicators needed: {len(plan.communicators)}")
    for m, mb in enumerate(plan.micro_batches):
        sizes = Counter(g.degree for g in mb.groups)
        shape = " ".join(f"{d}x{c}" for d, c in sorted(sizes.items(), reverse=True))
        lines.append(f"micro-batch {m}: {mb.predicted_time_s:.4f} s, {len(mb.groups)} groups (size x count: {shape})")
        for g in sorted(mb.groups, key=lambda g: -g.predicted_time_s)[:max_groups]:
            span = "" if g.intra_node else " spans nodes"
            u = plan.ulysses_size(g.degree)
            if plan.scheme == "hybrid" and g.degree > 1:
                span = f" = Ulysses {u} x ring {g.degree // u}{',' if span else ''}{span}"
            lines.append(
                f"  ranks {_ranks(g.ranks):>9} (size {g.degree}{span}): {len(g.samples)} samples, "
                f"{sum(g.lengths):,} tokens, {g.predicted_time_s:.4f} s"
            )
        if len(mb.groups) > max_groups:
            lines.append(f"  ... {len(mb.groups) - max_groups} more groups")
    return "\n".join(lines)


def _which(plan: Plan) -> str:
    """The bound that was binding, as the planner recorded it (empty when it did not)."""
    name = plan.solver.details.get("bound")
    return f" ({name} bound)" if name else ""
