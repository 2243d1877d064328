"""Does the cost model predict what the trainer does? Predicted against measured step time on this machine.

    python -m trainer.cost_check                  # 4 processes, 8 held-out batches, both profile forms
    python -m trainer.cost_check --procs 2 --json       # 2 processes (a 2-core machine)

The job's profile points are measured as ``dhp profile --procs N`` measures them (compute with the ring looped back on N
processes at once, real rings, the gradient all-reduce), and eight batches the fit never sees (:data:`CASES`,
:data:`CASES_2`; laid out by hand to cover many short samples on wide groups, single long samples, mixes and groups of
one) run as planned steps on the same N gloo processes, in rounds: each round times every point and every batch once, so
that both meet the same load from other work on the machine, and each keeps its median round (each round's time being
its slowest rank's; the median, not the fastest, because under other work a short run more often slips between
interruptions than a long one). The points are fitted into two profiles (:func:`trainer.profiler.profile_document`):
``before``, the per-sample form (ring latency and ring-step work charged per sample, the bytes of the unpadded sample,
no all-reduce), and ``after``, the trainer's form (the group's messages once per micro-batch, padded bytes, the
all-reduce as the per-step constant). Each batch's predicted step time (the cost model over its given groups) is
compared with its measured whole step (the all-reduce included) and with its micro-batches alone (the slowest rank of
each). Prints the relative error of each batch and their mean and worst, per profile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

Groups = list[list[tuple[tuple[int, ...], tuple[int, ...]]]]

# (name, lengths, groups: per micro-batch [(ranks, sample indices)]) on 4 ranks; lengths unlike the profile's grid.
CASES: list[tuple[str, list[int], Groups]] = [
    ("16 short on 4", [20] * 16, [[((0, 1, 2, 3), tuple(range(16)))]]),
    ("2 x 6 short on 2+2", [28] * 12, [[((0, 1), tuple(range(6))), ((2, 3), tuple(range(6, 12)))]]),
    ("8 short on 3, 8 on 1", [40] * 16, [[((0, 1, 2), tuple(range(8))), ((3,), tuple(range(8, 16)))]]),
    ("one long on 4", [600], [[((0, 1, 2, 3), (0,))]]),
    ("long + 4 short on 4", [420, 18, 22, 26, 30], [[((0, 1, 2, 3), (0, 1, 2, 3, 4))]]),
    (
        "groups of one",
        [90, 110, 130, 70, 100, 120, 80, 140, 95, 105, 115, 85],
        [[((r,), tuple(range(3 * r, 3 * r + 3))) for r in range(4)]],
    ),
    ("2 long on 2, 10 short on 2", [300, 150] + [24] * 10, [[((0, 1), (0, 1)), ((2, 3), tuple(range(2, 12)))]]),
    (
        "two micro-batches",
        [330, 45, 160] + [22] * 10,
        [[((0, 1, 2, 3), (0,))], [((0, 1), tuple(range(3, 13))), ((2, 3), (1, 2))]],
    ),
]

# The same kinds of batches on 2 ranks (a machine with 2 cores).
CASES_2: list[tuple[str, list[int], Groups]] = [
    ("16 short on 2", [20] * 16, [[((0, 1), tuple(range(16)))]]),
    ("2 x 8 short on 1+1", [28] * 16, [[((0,), tuple(range(8))), ((1,), tuple(range(8, 16)))]]),
    ("8 short on 2", [40] * 8, [[((0, 1), tuple(range(8)))]]),
    ("one long on 2", [600], [[((0, 1), (0,))]]),
    ("long + 4 short on 2", [420, 18, 22, 26, 30], [[((0, 1), (0, 1, 2, 3, 4))]]),
    ("groups of one", [90, 110, 130, 70, 100, 120], [[((r,), tuple(range(3 * r, 3 * r + 3))) for r in range(2)]]),
    ("2 long on 2, 10 short on 2", [300, 150] + [24] * 10, [[((0, 1), (0, 1))], [((0, 1), tuple(range(2, 12)))]]),
    (
        "two micro-batches",
        [330, 45, 160] + [22] * 10,
        [[((0, 1), (0,))], [((0,), tuple(range(3, 13))), ((1,), (1, 2))]],
    ),
]


def cases(procs: int) -> list[tuple[str, list[int], Groups]]:
    if procs == 4:
        return CASES
    if procs == 2:
        return CASES_2
    raise ValueError(f"held-out batches are laid out for 2 or 4 processes, not {procs}")


def _rounds_worker(
    rank: int,
    world_size: int,
    cfg: Any,
    settings: Any,
    plan_docs: list[dict[str, Any]],
    batches: list[dict[str, list[int]]],
    rounds: int,
) -> dict[str, Any]:
    """Every round: the profile's compute points (ring looped back), its real rings, the gradient
    all-reduce, then one step of each held-out batch; this rank's time of each, round by round
    (round 0, a warm-up, left out)."""
    import torch
    import torch.distributed as dist

    from trainer.apply import apply_plan
    from trainer.group_pool import GroupPool
    from trainer.profiler import _combos, time_group, time_step_overhead
    from trainer.step import train_step
    from trainer.tiny_model import TinyTransformer

    device = torch.device("cpu")
    torch.manual_seed(0)
    model = TinyTransformer(cfg)
    combos = _combos(settings)
    rings = {d: dist.new_group(list(range(d))) for d in sorted(set(settings.degrees)) if 2 <= d <= world_size}
    ring_combos = [c for c in combos if c[1] in rings]
    works = [apply_plan(doc, rank) for doc in plan_docs]
    pool = GroupPool()
    for w in works:
        pool.ensure(w.communicators)
        pool.ensure(w.reduce_groups)
    tensors = [{k: torch.tensor(v, dtype=torch.int64) for k, v in b.items()} for b in batches]
    out: dict[str, Any] = {
        "compute": [[] for _ in combos],
        "rings": [[] for _ in ring_combos],
        "reduce": [],
        "steps": [[] for _ in works],
        "micro_batches": [[] for _ in works],
    }
    for rnd in range(rounds + 1):
        keep = rnd > 0
        for k, (L, d, n) in enumerate(combos):
            dist.barrier()
            t = time_group(model, (L,) * n, d, device, 1, 0)
            if keep:
                out["compute"][k].append(t)
        for k, (L, d, n) in enumerate(ring_combos):
            dist.barrier()
            t = time_group(model, (L,) * n, d, device, 1, 0, group=rings[d], position=rank) if rank < d else 0.0
            if keep:
                out["rings"][k].append(t)
        t_reduce = time_step_overhead(model, device, 1)
        if keep:
            out["reduce"].extend(t_reduce)
        for c, work in enumerate(works):
            model.zero_grad(set_to_none=True)
            dist.barrier()
            result = train_step(model, work, pool, tensors[c])
            if keep:
                out["steps"][c].append(result.seconds)
                out["micro_batches"][c].append(result.micro_batch_seconds)
    return out


def predicted_plan(profile: dict[str, Any], cfg: Any, lengths: list[int], groups: Groups, world: int) -> dict[str, Any]:
    """The plan document of hand-made groups with the cost model's times under ``profile``."""
    from optimizer.costs.tables import CostTables
    from optimizer.plan.evaluate import build_plan
    from optimizer.plan.records import Assignment, SolverStats
    from optimizer.problem.documents import problem_from_json

    batch = {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(lengths)]}
    problem = problem_from_json(
        {
            "batch": batch,
            "cluster": {"nodes": 1, "gpus_per_node": world},
            "model": cfg.model_document(),
            "profile": profile,
        }
    )
    given: Any = groups
    return build_plan(CostTables.build(problem), Assignment.of(given), SolverStats("hand", "given", 0.0), 0.0).to_json()


DRAFT_PROFILE = {
    "time": {"quadratic": 1e-9, "linear": 1e-6, "sample_constant": 1e-4, "group_constant": 1e-3},
    "comm": {"scheme": "ring", "bytes_per_token": 1000, "bandwidth_bytes_per_s": {"intra": 1e9, "inter": 1e9}},
    "capacity_tokens_per_rank": 1 << 16,
}


def run(procs: int = 4, rounds: int = 7, seed: int = 0, progress: Any = None) -> dict[str, Any]:
    import random

    import torch

    cases(procs)  # refuse an unsupported process count before measuring
    from trainer.profiler import (
        Point,
        ProfileSettings,
        _combos,
        comm_terms,
        fit,
        fit_ring_transfers,
        group_messages,
        profile_document,
    )
    from trainer.tiny_model import TinyConfig

    say = progress or (lambda m: None)
    torch.set_num_threads(1)
    cfg = TinyConfig(hidden=64, heads=4, layers=2, ffn_hidden=256)
    settings = ProfileSettings(
        lengths=(16, 64, 160, 384, 768),
        degrees=tuple(range(1, procs + 1)),
        mixes=(1, 2, 4),
        short_mix=16,
        repeats=rounds,
        device="cpu",
        procs=procs,
        threads=1,
    )
    rng = random.Random(seed)
    held_out = cases(procs)
    batches = [
        {f"s{i}": [rng.randrange(cfg.vocab) for _ in range(n)] for i, n in enumerate(lengths)}
        for _, lengths, _ in held_out
    ]
    # The groups are given: any profile lays them out (only the predicted times depend on it).
    layout = [predicted_plan(DRAFT_PROFILE, cfg, lengths, groups, procs) for _, lengths, groups in held_out]
    from trainer.launch import spawn

    say(
        f"{rounds} rounds on {procs} processes, each timing the profile's points, its rings, "
        f"the all-reduce and the {len(held_out)} held-out batches ..."
    )
    runs = spawn(_rounds_worker, procs, cfg, settings, layout, batches, rounds, threads=1)
    # Each point's typical round on every rank (the median: under other work a short run more often
    # slips between interruptions than a long one, so the fastest would favour the short points),
    # then the slowest rank.
    combos = _combos(settings)
    ring_combos = [c for c in combos if 2 <= c[1] <= procs]
    points = [
        Point((L,) * n, d, max(statistics.median(r["compute"][k]) for r in runs)) for k, (L, d, n) in enumerate(combos)
    ]
    rings = [
        Point((L,) * n, d, max(statistics.median(r["rings"][k]) for r in runs if min(r["rings"][k]) > 0))
        for k, (L, d, n) in enumerate(ring_combos)
    ]
    reduction = statistics.median(max(r["reduce"][i] for r in runs) for i in range(rounds))
    bpt, msgs = comm_terms(cfg, torch.float32)
    f = fit(points)
    fits: dict[str, dict[str, Any]] = {}
    for name, group in (("before", None), ("after", group_messages(cfg))):
        bw, lat, ring_report = fit_ring_transfers(f, rings, bpt, msgs, group)
        profile = profile_document(
            f, bpt, min(bw, 1e13), lat, 1 << 16, messages=msgs, group=group, step_constant=reduction
        )
        fits[name] = {
            "profile": profile,
            "r2": f.r2,
            "max_rel_error": f.max_rel_error,
            "ring_r2": ring_report["ring_r2"],
            "ring_max_rel_error": ring_report["ring_max_rel_error"],
            "sample_step_s": f.sample_step,
            "bandwidth_bytes_per_s": bw,
            "latency_s": lat,
            "step_constant_s": reduction if group else 0.0,
        }
        say(
            f"fit {name}: R^2 {f.r2:.4f}, worst point {f.max_rel_error * 100:.1f}%; "
            f"rings R^2 {ring_report['ring_r2']:.4f}, worst {ring_report['ring_max_rel_error'] * 100:.1f}%; "
            f"{bw / 1e9:.3g} GB/s, {lat * 1e6:.1f} us per message; all-reduce {reduction * 1000:.2f} ms"
        )
    plans = {
        name: [predicted_plan(fits[name]["profile"], cfg, lengths, groups, procs) for _, lengths, groups in held_out]
        for name in fits
    }
    rows = []
    for c, (case, _, _) in enumerate(held_out):
        n_mb = len(layout[c]["micro_batches"])
        # Each round's step ends with its slowest rank; the median round is kept, as for the profile's points.
        step = statistics.median(max(r["steps"][c][i] for r in runs) for i in range(rounds))
        mb_part = statistics.median(
            sum(max(r["micro_batches"][c][i][m] for r in runs) for m in range(n_mb)) for i in range(rounds)
        )
        row: dict[str, Any] = {"case": case, "measured_micro_batches_s": mb_part, "measured_step_s": step}
        for name in fits:
            pred = plans[name][c]["predicted_step_time_s"]
            row[f"predicted_{name}_s"] = pred
            mbs = pred - fits[name]["step_constant_s"]  # the micro-batches alone
            row[f"error_{name}"] = (mbs - mb_part) / mb_part
            row[f"step_error_{name}"] = (pred - step) / step
        rows.append(row)
    summary = {
        name: {
            "mean_abs_error": statistics.mean(abs(r[f"error_{name}"]) for r in rows),
            "worst_abs_error": max(abs(r[f"error_{name}"]) for r in rows),
            "step_mean_abs_error": statistics.mean(abs(r[f"step_error_{name}"]) for r in rows),
            "step_worst_abs_error": max(abs(r[f"step_error_{name}"]) for r in rows),
        }
        for name in fits
    }
    return {
        "procs": procs,
        "fits": {k: {x: y for x, y in v.items() if x != "profile"} for k, v in fits.items()},
        "profiles": {k: v["profile"] for k, v in fits.items()},
        "rows": rows,
        "summary": summary,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument(
        "--rounds", type=int, default=7, help="timed rounds (each times every point and batch once; the median is kept)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    out = run(args.procs, args.rounds, progress=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{'batch':28} {'step ms':>8} {'mbs ms':>7} | {'before ms':>9} {'step err':>8} {'mbs err':>7} | "
        f"{'after ms':>8} {'step err':>8} {'mbs err':>7}"
    )
    for r in out["rows"]:
        print(
            f"{r['case']:28} {r['measured_step_s'] * 1000:8.1f} {r['measured_micro_batches_s'] * 1000:7.1f} | "
            f"{r['predicted_before_s'] * 1000:9.1f} {r['step_error_before'] * 100:+7.1f}% "
            f"{r['error_before'] * 100:+6.1f}% | {r['predicted_after_s'] * 1000:8.1f} "
            f"{r['step_error_after'] * 100:+7.1f}% {r['error_after'] * 100:+6.1f}%"
        )
    for name, s in out["summary"].items():
        print(
            f"{name}: whole step mean |error| {s['step_mean_abs_error'] * 100:.1f}%, "
            f"worst {s['step_worst_abs_error'] * 100:.1f}%; "
            f"micro-batches alone mean {s['mean_abs_error'] * 100:.1f}%, worst {s['worst_abs_error'] * 100:.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
