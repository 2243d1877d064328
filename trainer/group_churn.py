"""Communicator churn: how many new groups a job creates per step, by group-reuse mode (a simulated pool).

    python -m trainer.group_churn                          # 30 video batches on 64 ranks, every mode
    python -m trainer.group_churn --group-cost-s 0.001,0.05,0.5 --json

A job keeps every communicator it has created (:class:`trainer.group_pool.GroupPool`); each step it
sends the planner the groups it holds (``existing_groups``) and what creating one costs
(``options.new_group_cost_s``), plans the batch, and creates the plan's new groups. Here the pool
is simulated (a set of rank tuples), so the figures come from the planner alone: for each mode,
the new groups of every step, the predicted step times, and their sum with the groups' creation
cost (each group is paid once, when it is created).

Modes:

- ``blind``: the planner is told nothing (no existing groups, no cost), the trainer's behaviour
  before it sent its pool;
- ``ignore``: existing groups and cost sent, ``group_reuse`` ``ignore`` (new groups only counted);
- ``prefer``: the default: existing groups and cost sent, ``group_reuse`` ``prefer``;
- ``prefer-blocks``: ``prefer``, the pool starting with every aligned power-of-two block (what
  :meth:`trainer.group_pool.GroupPool.precreate_blocks` creates, paid at the start);
- ``only``: the same starting pool, and plans may use nothing else.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

MODES = ("blind", "ignore", "prefer", "prefer-blocks", "only")


def simulate(
    mode: str, batches: list[dict[str, Any]], base: dict[str, Any], group_cost_s: float, budget_ms: int
) -> dict[str, Any]:
    """Plan ``batches`` in order as a job with a pool would under ``mode``; per step: new groups and predicted time."""
    from optimizer.problem.documents import problem_from_json
    from planning.planner import plan
    from trainer.group_pool import aligned_pow2_blocks

    n_ranks = problem_from_json({**base, "batch": batches[0]}).cluster.domain_size
    pool: dict[tuple[int, ...], None] = {}
    start_groups = 0
    if mode in ("only", "prefer-blocks"):
        pool.update(dict.fromkeys(aligned_pow2_blocks(n_ranks)))
        start_groups = len(pool)
    new_per_step, step_s, wall_ms = [], [], []
    for batch in batches:
        options = {**base.get("options", {}), "time_budget_ms": budget_ms, "deterministic": True}
        doc: dict[str, Any] = {**base, "batch": batch, "options": options}
        if mode != "blind":
            doc["existing_groups"] = [list(g) for g in pool]
            options.update(group_reuse=mode.removesuffix("-blocks"), new_group_cost_s=group_cost_s)
        t0 = time.perf_counter()
        result = plan(problem_from_json(doc))
        wall_ms.append((time.perf_counter() - t0) * 1000.0)
        new = [g for g in (tuple(sorted(c)) for c in result.communicators) if g not in pool]
        pool.update(dict.fromkeys(new))
        new_per_step.append(len(new))
        step_s.append(result.predicted_step_time_s)
    created = start_groups + sum(new_per_step)
    return {
        "mode": mode,
        "new_groups_per_step": new_per_step,
        "mean_new_groups_per_step": statistics.mean(new_per_step),
        "groups_created": created,
        "created_at_start": start_groups,
        "step_times_s": step_s,
        "total_step_s": sum(step_s),
        "group_setup_s": created * group_cost_s,
        "total_s": sum(step_s) + created * group_cost_s,
        "plan_wall_ms_median": statistics.median(wall_ms),
    }


def run(
    steps: int = 30,
    samples: int = 256,
    workload: str = "video",
    costs: tuple[float, ...] = (0.05,),
    budget_ms: int = 300,
    modes: tuple[str, ...] = MODES,
    cluster_preset: str = "h100-8x8",
    model_preset: str = "qwen2-vl-7b",
    progress: Any = None,
) -> dict[str, Any]:
    from optimizer.problem.workloads import WORKLOADS

    say = progress or (lambda m: None)
    batches = [WORKLOADS[workload](samples, seed=s) for s in range(steps)]
    base = {"cluster_preset": cluster_preset, "model_preset": model_preset}
    out: dict[str, Any] = {
        "steps": steps,
        "samples": samples,
        "workload": workload,
        "cluster_preset": cluster_preset,
        "runs": [],
    }
    for cost in costs:
        for mode in modes:
            if mode == "blind" and cost != costs[0]:
                continue  # the planner never sees the cost: one run serves every cost
            r = simulate(mode, batches, base, cost, budget_ms)
            r["group_cost_s"] = cost
            out["runs"].append(r)
            say(
                f"cost {cost:g} s, {mode}: {r['mean_new_groups_per_step']:.2f} new groups per step, "
                f"steps {r['total_step_s']:.3f} s"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--samples", type=int, default=256, help="samples per batch")
    ap.add_argument("--workload", default="video")
    ap.add_argument("--cluster-preset", default="h100-8x8")
    ap.add_argument("--model-preset", default="qwen2-vl-7b")
    ap.add_argument(
        "--group-cost-s", default="0.05", help="seconds to create one communicator, comma-separated for several runs"
    )
    ap.add_argument("--budget-ms", type=int, default=300)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        costs = tuple(float(x) for x in args.group_cost_s.split(","))
    except ValueError:
        ap.error(f"--group-cost-s must be numbers separated by commas, got {args.group_cost_s!r}")
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes must be some of {','.join(MODES)}")
    if args.steps < 1 or args.samples < 1 or any(c < 0 for c in costs):
        ap.error("--steps and --samples must be >= 1 and --group-cost-s >= 0")
    out = run(
        args.steps,
        args.samples,
        args.workload,
        costs,
        args.budget_ms,
        modes,
        args.cluster_preset,
        args.model_preset,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    if args.json:
        print(json.dumps(out))
        return 0
    blind = next((r for r in out["runs"] if r["mode"] == "blind"), None)
    print(
        f"{out['steps']} {out['workload']} batches of {out['samples']} samples on {out['cluster_preset']} "
        f"(deterministic plans, {args.budget_ms} ms budget)"
    )
    print(
        f"{'cost s':>7} {'mode':13} {'new/step':>8} {'created':>7} {'steps s':>9} {'setup s':>8} {'total s':>9} "
        f"{'vs blind steps':>14}"
    )
    for r in out["runs"]:
        rel = f"{(r['total_step_s'] / blind['total_step_s'] - 1) * 100:+.2f}%" if blind else "-"
        print(
            f"{r['group_cost_s']:7g} {r['mode']:13} {r['mean_new_groups_per_step']:8.2f} {r['groups_created']:7d} "
            f"{r['total_step_s']:9.3f} {r['group_setup_s']:8.3f} {r['total_s']:9.3f} {rel:>14}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
