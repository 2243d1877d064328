"""The whole trainer path on CPU: batch -> plan -> apply_plan -> training steps on gloo -> feedback.

    python examples/train_tiny.py                          # plan in this process, 1 node x 2 ranks
    python examples/train_tiny.py --nodes 2 --gpus-per-node 2 --profile my_profile.json
    python examples/train_tiny.py --service http://127.0.0.1:8000   # plan through the service, send feedback

Without --profile the job first measures its own profile (as `dhp profile` does) for the lengths of
its batch, so the plan's prediction can be compared with the measured step time. Each rank uses one
CPU thread; on a machine with fewer cores than ranks the ranks share cores and the step is slower
than predicted.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from typing import Any


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_batch(n: int, seed: int, shortest: int, longest: int) -> dict[str, list[int]]:
    """Sample token ids of variable lengths (log-uniform between the bounds)."""
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        length = int(round(shortest * (longest / shortest) ** rng.random()))
        out[f"s{i}"] = [rng.randrange(96) for _ in range(length)]
    return out


def get_plan(request: dict[str, Any], service: str | None) -> tuple[dict[str, Any], Any]:
    """The plan document (and the client when a service is used)."""
    if service:
        try:
            from api.client.planner_client import PlannerClient
        except ModuleNotFoundError:
            log("no service client here (pip install 'dhp-planner[client]'); planning in this process")
        else:
            client = PlannerClient(service, local_fallback=True)
            doc = client.plan(request)
            log(f"plan {doc.get('id')} from {service} (status {doc.get('status')})")
            return doc, client
    from optimizer.problem.documents import problem_from_json
    from planning.planner import plan

    return plan(problem_from_json(request)).to_json(), None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--gpus-per-node", type=int, default=2, help="ranks per node (processes)")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--shortest", type=int, default=64)
    ap.add_argument("--longest", type=int, default=1536)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--profile", help="a profile file (dhp profile); default: measure one now")
    ap.add_argument("--profile-out", help="write the measured profile here")
    ap.add_argument("--service", help="planning service URL (uses api.client.planner_client when installed)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    args = ap.parse_args(argv)

    import torch

    from trainer.launch import spawn
    from trainer.step_equivalence import step_worker
    from trainer.tiny_model import TinyConfig

    torch.set_num_threads(1)
    cfg = TinyConfig(hidden=128, heads=8, layers=2, ffn_hidden=512)
    world = args.nodes * args.gpus_per_node
    samples = make_batch(args.samples, args.seed, args.shortest, args.longest)
    lengths = sorted(len(v) for v in samples.values())
    log(f"batch: {len(samples)} samples, lengths {lengths}")

    if args.profile:
        from optimizer.problem.documents import read_json_file

        profile = read_json_file(args.profile, "--profile")
    else:
        from trainer.profiler import ProfileSettings, measure_profile

        grid = sorted({max(32, lengths[0]), lengths[len(lengths) // 2], lengths[-1], (lengths[0] + lengths[-1]) // 2})
        settings = ProfileSettings(
            lengths=tuple(grid),
            degrees=tuple(range(1, min(world, 4) + 1)),
            mixes=(1, 2),
            repeats=5,
            device="cpu",
            procs=min(world, args.gpus_per_node),
            threads=1,
        )
        profile, report = measure_profile(cfg, settings, progress=log)
        log(f"profile fit: R^2 {report['r2']:.4f}, largest relative error {report['max_rel_error']:.3f}")
        if args.profile_out:
            with open(args.profile_out, "w") as fh:
                json.dump(profile, fh, indent=2)

    request = {
        "batch": {"samples": [{"id": k, "text_tokens": len(v)} for k, v in samples.items()]},
        "cluster": {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node},
        "model": cfg.model_document(),
        "profile": profile,
        "options": {"time_budget_ms": 500},
    }
    plan_doc, client = get_plan(request, args.service)
    groups = [[g["ranks"] for g in mb["groups"]] for mb in plan_doc["micro_batches"]]
    log(f"plan: {len(groups)} micro-batches {groups}, predicted step {plan_doc['predicted_step_time_s'] * 1000:.1f} ms")

    results = spawn(step_worker, world, plan_doc, cfg, samples, 0, "float32", args.steps, 1)
    per_step = [max(r["seconds"][s] for r in results) for s in range(args.steps)]
    # The fastest step, as the profile keeps the fastest run of each point: other work on the
    # machine only ever adds time. The median is printed too.
    measured = min(per_step)
    group_times = [
        [max(results[rank]["micro_batch_seconds"][0][m] for rank in g["ranks"]) for g in mb["groups"]]
        for m, mb in enumerate(plan_doc["micro_batches"])
    ]
    # The plan predicts the micro-batches; the gradient all-reduce after them is the same for every
    # plan and is not in the cost model, so it is reported apart.
    n_mb = len(plan_doc["micro_batches"])
    mb_part = [
        sum(max(r["micro_batch_seconds"][s][m] for r in results) for m in range(n_mb)) for s in range(args.steps)
    ]
    predicted = plan_doc["predicted_step_time_s"]
    error = (measured - predicted) / predicted
    mb_error = (min(mb_part) - predicted) / predicted
    log(f"loss {results[0]['loss']:.4f}; step times {[round(s * 1000, 1) for s in per_step]} ms")
    log(
        f"predicted {predicted * 1000:.1f} ms, measured {measured * 1000:.1f} ms (fastest of {args.steps}; "
        f"median {statistics.median(per_step) * 1000:.1f} ms), error {error * 100:+.1f}%"
    )
    log(
        f"micro-batches alone (without the gradient all-reduce): measured {min(mb_part) * 1000:.1f} ms, "
        f"error {mb_error * 100:+.1f}%"
    )
    for m, mb in enumerate(plan_doc["micro_batches"]):
        pairs = ", ".join(
            f"{g['ranks']}: {g['predicted_time_s'] * 1000:.1f}/{t * 1000:.1f}"
            for g, t in zip(mb["groups"], group_times[m], strict=True)
        )
        log(f"  micro-batch {m} (predicted/measured ms): {pairs}")
    if client is not None and "id" in plan_doc:
        answer = client.feedback(
            str(plan_doc["id"]), measured, group_times_s=group_times, notes="examples/train_tiny.py"
        )
        log(f"feedback sent: {answer}" if answer is not None else "feedback not stored (local plan or service down)")
    if args.json:
        print(
            json.dumps(
                {
                    "predicted_step_time_s": predicted,
                    "measured_step_time_s": measured,
                    "median_step_time_s": statistics.median(per_step),
                    "relative_error": error,
                    "micro_batches_s": min(mb_part),
                    "micro_batches_relative_error": mb_error,
                    "step_times_s": per_step,
                    "group_times_s": group_times,
                    "loss": results[0]["loss"],
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
