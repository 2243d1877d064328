"""A synthetic check of the refit that cannot be tuned to: group times from a profile the fit is not told.

A hidden *truth* profile (the planning profile's structure with every coefficient the fit can find moved by
a seeded random factor, and its bandwidths made constant) times the groups of plans the planner made
under another profile (the analytical default), with multiplicative noise and a few stragglers. The fit
(:func:`planning.profile_refit.refit`) sees only the plans and those times. Reported, on steps the fit never saw:

- ``held out``: the fit's own held-out plans (every fifth step);
- ``replanned``: new batches planned with the fitted profile, measured under the truth (the plans the next
  steps of a run would get);
- ``other plans``: new batches planned under a third profile, measured under the truth;
- ``replanned noiseless``: the replanned batches measured without noise: the fit's own error, apart from
  the noise (a micro-batch measures its slowest group, so noise on each group biases it upwards: with 3%
  noise and tens of balanced groups the slowest is some 5% above their mean).

Each is the mean and worst relative error of predicted against measured group, micro-batch and step
times. ``python -m bench.refit_check`` prints them (``--json`` writes them too).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.costs.profile import Bandwidth, CostProfile
from optimizer.costs.refit import MeasuredPlan
from optimizer.problem.documents import problem_from_json
from optimizer.problem.problem import Problem
from optimizer.problem.workloads import WORKLOADS
from optimizer.verify.verifier import group_time
from planning.profile_refit import Step, measured_plans, refit

STEP_CONSTANT_S = 0.05
"""Seconds the truth adds to every step beyond its micro-batches (the gradient all-reduce)."""


def shifted(base: CostProfile, seed: int, spread: float = 2.5) -> CostProfile:
    """A profile of ``base``'s structure whose fitted coefficients are each moved by a factor drawn
    log-uniformly from [1/spread, spread] (a term the base lacks gets a small positive value)."""
    rng = np.random.default_rng(seed)

    def move(value: float, floor: float) -> float:
        return float((value or floor) * np.exp(rng.uniform(-np.log(spread), np.log(spread))))

    return replace(
        base,
        quadratic=move(base.quadratic, 1e-12),
        linear=move(base.linear, 1e-6),
        sample_constant=move(base.sample_constant, 1e-4),
        group_constant=move(base.group_constant, 1e-3),
        sample_step=move(base.sample_step, 1e-5),
        vision_linear=move(base.vision_linear, 1e-6) if base.vision_linear else 0.0,
        vision_quadratic=move(base.vision_quadratic, 1e-9) if base.vision_quadratic else 0.0,
        intra_bandwidth=Bandwidth.constant(move(base.intra_bandwidth.at(8), 1e11)),
        inter_bandwidth=Bandwidth.constant(move(base.inter_bandwidth.at(8), 1e10)),
        intra_latency=move(base.intra_latency, 5e-6),
        inter_latency=move(base.inter_latency, 2e-5),
        step_constant=STEP_CONSTANT_S,
        source=f"hidden truth (seed {seed})",
    )


def measure(
    problem: Problem,
    plan_doc: dict[str, Any],
    truth: CostProfile,
    rng: np.random.Generator,
    noise: float = 0.03,
    stragglers: float = 0.0,
) -> tuple[list[list[float]], float]:
    """(group times, step time) of a plan run where ``truth`` holds: each group's time under the truth
    (recomputed by the verifier) times ``1 + noise x N(0, 1)``; a ``stragglers`` share of groups takes 1.5-3x."""
    real = replace(problem, profile=truth)
    index = problem.batch.index
    times = []
    for mb in plan_doc["micro_batches"]:
        row = []
        for g in mb["groups"]:
            t = group_time(real, tuple(g["ranks"]), tuple(index[s] for s in g["samples"]))[0]
            t *= max(0.5, 1.0 + noise * rng.standard_normal())
            if rng.random() < stragglers:
                t *= rng.uniform(1.5, 3.0)
            row.append(t)
        times.append(row)
    return times, sum(max(r) for r in times if r) + truth.step_constant


def _request(workload: str, n: int, seed: int, cluster: dict[str, Any], model: str, profile: CostProfile | None):
    doc: dict[str, Any] = {
        "batch": WORKLOADS[workload](n, seed=seed),
        "cluster": cluster,
        "model_preset": model,
        "options": {"backend": "heuristic", "time_budget_ms": 1000},
    }
    if profile is not None:
        doc["profile"] = profile.to_json()
    return doc


def planned_steps(
    seeds: Sequence[int],
    truth: CostProfile,
    profile: CostProfile | None,
    *,
    cluster: dict[str, Any],
    model: str,
    n: int,
    rng: np.random.Generator,
    noise: float,
    stragglers: float,
    workloads: Sequence[str],
) -> list[Step]:
    """Batches planned under ``profile`` (None: the analytical default), measured under ``truth``."""
    from planning.planner import plan

    out = []
    for k, seed in enumerate(seeds):
        doc = _request(workloads[k % len(workloads)], n, seed, cluster, model, profile)
        problem = problem_from_json(doc)
        plan_doc = plan(problem).to_json(shards=False)
        times, step = measure(problem, plan_doc, truth, rng, noise, stragglers)
        out.append(Step(f"seed{seed}", doc, plan_doc, times, step))
    return out


def errors(plans: Sequence[MeasuredPlan], profile: CostProfile) -> dict[str, dict[str, float]]:
    """Mean and worst relative error of ``profile``'s group, micro-batch and step times against the measured."""
    g_err, mb_err, step_err = [], [], []
    for mp in plans:
        model = replace(mp.problem, profile=profile)
        total = profile.step_constant
        for mb in mp.groups:
            pred = [group_time(model, g.ranks, g.samples)[0] for g in mb]
            meas = [g.seconds for g in mb]
            g_err += [abs(p / m - 1) for p, m in zip(pred, meas, strict=True)]
            mb_err.append(abs(max(pred) / max(meas) - 1))
            total += max(pred)
        if mp.step_seconds:
            step_err.append(abs(total / mp.step_seconds - 1))

    def figures(e: list[float]) -> dict[str, float]:
        return {"mean": float(np.mean(e)), "worst": float(np.max(e)), "n": len(e)}

    return {"groups": figures(g_err), "micro_batches": figures(mb_err), "steps": figures(step_err)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = {"nodes": args.nodes, "gpus_per_node": 8}
    rng = np.random.default_rng(args.seed)
    workloads = args.workloads.split(",")
    base = problem_from_json(_request(workloads[0], 8, 0, cluster, args.model, None)).cost_profile
    truth = shifted(base, args.seed)
    common = dict(cluster=cluster, model=args.model, n=args.samples, rng=rng, noise=args.noise, workloads=workloads)
    train = planned_steps(range(args.steps), truth, None, stragglers=args.stragglers, **common)  # type: ignore[arg-type]
    fit = refit(train)
    fresh = range(10_000, 10_000 + args.fresh)
    replanned = measured_plans(planned_steps(fresh, truth, fit.profile, stragglers=0.0, **common))  # type: ignore[arg-type]
    third = shifted(base, args.seed + 1, spread=1.8)
    other = measured_plans(planned_steps(fresh, truth, third, stragglers=0.0, **common))  # type: ignore[arg-type]
    exact = measured_plans(planned_steps(fresh, truth, fit.profile, stragglers=0.0, **{**common, "noise": 0.0}))  # type: ignore[arg-type]
    held_keys = {p["plan"] for p in fit.predictions if p["held_out"]}
    held = [m for m in measured_plans(train) if m.key in held_keys]
    out = {
        "setup": {
            "cluster": cluster,
            "model": args.model,
            "samples": args.samples,
            "fit_steps": args.steps,
            "fresh_steps": args.fresh,
            "noise": args.noise,
            "stragglers": args.stragglers,
            "workloads": workloads,
        },
        "fit": fit.to_json(),
        "held_out": {"before": errors(held, base), "after": errors(held, fit.profile)},
        "replanned": {"before": errors(replanned, base), "after": errors(replanned, fit.profile)},
        "other_plans": {"before": errors(other, base), "after": errors(other, fit.profile)},
        "replanned_noiseless": {"before": errors(exact, base), "after": errors(exact, fit.profile)},
        "truth": truth.to_json(),
    }
    return out


def _print(out: dict[str, Any]) -> None:
    s = out["setup"]
    print(
        f"refit check: {s['model']} on {s['cluster']['nodes']}x8, {s['samples']} samples per batch, "
        f"{s['fit_steps']} fitted steps ({out['fit']['held_out_plans']} held out), noise {s['noise']:.0%}, "
        f"stragglers {s['stragglers']:.0%}; {out['fit']['stragglers']} stragglers dropped"
    )
    print(
        f"{'steps':<20} {'profile':<9} {'group mean':>10} {'group worst':>11} {'mb mean':>8} {'mb worst':>9} "
        f"{'step mean':>9} {'step worst':>10}"
    )
    for what in ("held_out", "replanned", "other_plans", "replanned_noiseless"):
        for when in ("before", "after"):
            e = out[what][when]
            print(
                f"{what:<20} {when:<9} {e['groups']['mean']:>10.2%} {e['groups']['worst']:>11.2%} "
                f"{e['micro_batches']['mean']:>8.2%} {e['micro_batches']['worst']:>9.2%} "
                f"{e['steps']['mean']:>9.2%} {e['steps']['worst']:>10.2%}"
            )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.refit_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-vl-7b")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--samples", type=int, default=128, help="samples per batch")
    ap.add_argument("--steps", type=int, default=40, help="steps the fit sees (every fifth held out)")
    ap.add_argument("--fresh", type=int, default=10, help="new batches for the replanned and other-plans checks")
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--stragglers", type=float, default=0.01, help="share of groups taking 1.5-3x")
    ap.add_argument("--workloads", default="video,long-text,mixed,image-sft,dynamic-res")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    out = run(args)
    _print(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
