"""Train a Hugging Face causal LM with planned context parallelism, one process per rank (torchrun).

    torchrun --nproc-per-node 4 -m trainer.train_hf --steps 10                        # plan in process
    torchrun --nproc-per-node 4 -m trainer.train_hf --steps 10 --service http://127.0.0.1:8000
    torchrun --nproc-per-node 4 -m trainer.train_hf --steps 10 --reference --out run.json

Every step: rank 0 asks the planner for the plan of the next batch ahead (``plan_ahead``, so it is
made while this step trains; with ``--no-plan-ahead`` only when the step is about to run, so that on a
machine whose cores the planner shares the planning does not slow the step it times) and fetches this
step's plan; the plan is broadcast from rank 0 and
every rank checks its digest (:mod:`trainer.plan_sync`); each rank maps it to its work
(:func:`trainer.apply.apply_plan`, with ``--tp``/``--pp`` in Megatron's order), loads only the
samples of its groups through a DataLoader (:mod:`trainer.routing`), creates the plan's new
groups through the pool, trains the step (:func:`trainer.step.train_step`, ring or Ulysses
attention in the model of :mod:`trainer.hf_adapter`) and rank 0 posts the measured step time and
per-group times as feedback, with the number of groups the step created. With ``--reference`` rank 0
also trains a second copy of the model on the whole batch in one process with the library's own
attention and reports both losses.

Communicators. At start every rank creates the aligned power-of-two blocks of the planned domain
through the pool (``--no-precreate`` skips it); every request then lists the groups the job holds
(``existing_groups``, the blocks and every group of earlier plans) and what creating one more costs
(``options.new_group_cost_s``: the pool's measured mean seconds per group, times the tensor x
pipeline copies of a planner group; ``--group-cost-s`` overrides it), under ``--group-reuse``
(``prefer`` by default). So the planner weighs a new group against the step time it saves, and the
job's pool stops growing (``python -m trainer.group_churn`` gives the figures).

Arms. ``--arm`` chooses where the step's plan comes from and how it runs (:mod:`trainer.arms`):
``dhp`` (the default: the planner under its own rules, packed execution), ``static`` (the best
static power-of-two layout, packed), ``megatron`` (Megatron-Core's ``BalancedCPScheduler``, run per
sample as Megatron runs it: each sample its own forward and backward, a barrier between barrier
groups) and ``dhp-megatron`` (:class:`trainer.megatron.PlannedCPScheduler`, per sample). The
per-sample arms plan with the per-sample profile derived from ``--profile``
(:mod:`trainer.per_sample_costs`; the barrier's seconds from ``--barrier-s`` or timed at start over
the job). Every arm sees the same batches and the same initial model (``--seed``) and records per
step the plan's predicted step time under the profile of its execution, the measured step time
(the slowest rank) and the loss; only ``dhp`` plans through ``--service``.

The model is a small Llama built locally with random weights (``--hidden``, ``--layers``,
``--heads``, ``--kv-heads``); nothing is downloaded. Batches are seeded synthetic samples of
log-uniform lengths. Backend gloo (CPU) unless CUDA is available and ``--backend nccl`` is given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from datetime import timedelta
from typing import Any

from trainer.arms import ARMS

DEFAULT_PROFILE = {
    "time": {"quadratic": 2e-9, "linear": 2e-5, "sample_constant": 2e-3, "group_constant": 5e-3},
    "comm": {"scheme": "ring", "bytes_per_token": 3000, "bandwidth_bytes_per_s": {"intra": 5e8, "inter": 5e8}},
    "source": "train_hf default: a rough CPU profile of the tiny model (measure one with dhp profile)",
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def batch_lengths(step: int, n: int, seed: int, shortest: int, longest: int) -> dict[str, int]:
    """Sample ids and lengths of one step's batch (log-uniform lengths, seeded by step)."""
    rng = random.Random(seed * 100_003 + step)
    return {f"b{step}s{i}": int(round(shortest * (longest / shortest) ** rng.random())) for i in range(n)}


def requested_profile(args: argparse.Namespace) -> dict[str, Any] | str | None:
    """What a plan request sends as its profile: ``--profile learned:NAME`` as it is (the service reads it),
    nothing for ``--profile analytical`` (the planner's analytical model), else :func:`packed_profile`."""
    if args.profile == "analytical":
        return None
    if args.profile and args.profile.startswith("learned:"):
        return str(args.profile)
    return packed_profile(args)


def packed_profile(args: argparse.Namespace) -> dict[str, Any]:
    """The profile of packed execution: ``--profile`` (or the built-in one), ``--scheme``, ``--capacity-tokens``."""
    profile: dict[str, Any] = (
        json.loads(open(args.profile).read()) if args.profile else json.loads(json.dumps(DEFAULT_PROFILE))
    )
    profile["comm"] = {**profile["comm"], "scheme": args.scheme}
    if args.capacity_tokens:
        profile["capacity_tokens_per_rank"] = args.capacity_tokens
    profile.setdefault("capacity_tokens_per_rank", args.capacity_tokens or 1 << 16)
    return profile


def make_request(
    lengths: dict[str, int],
    args: argparse.Namespace,
    model_doc: dict[str, Any],
    world: int,
    existing: list[tuple[int, ...]] | None = None,
    group_cost_s: float | None = None,
) -> dict[str, Any]:
    """The planning request of one batch; ``existing`` (planner ranks) and ``group_cost_s`` make it
    communicator-aware (see the module docstring)."""
    profile = requested_profile(args)
    domain = world // (args.tp * args.pp)
    options: dict[str, Any] = {"time_budget_ms": args.budget_ms, "group_reuse": args.group_reuse}
    cost = args.group_cost_s if args.group_cost_s is not None else group_cost_s
    if cost is not None:
        options["new_group_cost_s"] = cost
    request: dict[str, Any] = {
        "batch": {"samples": [{"id": k, "text_tokens": v} for k, v in lengths.items()]},
        "cluster": {
            "nodes": 1,
            "gpus_per_node": domain * args.tp * args.pp,
            "tensor_parallel": args.tp,
            "pipeline_parallel": args.pp,
        },
        "model": model_doc,
        "options": options,
    }
    if profile is not None:
        request["profile"] = profile
    else:
        options["cp_scheme"] = args.scheme
    if existing:
        request["existing_groups"] = [list(g) for g in existing]
    return request


class Planner:
    """Rank 0's source of plans: the service through the client (one step ahead), or in process the
    planner (arm ``dhp``) or the arm's own source (:class:`trainer.arms.ArmPlanner`)."""

    def __init__(self, service: str | None, arm: str = "dhp", sample_profile: dict[str, Any] | None = None) -> None:
        from trainer.arms import ArmPlanner

        self.client = None
        self.ahead: dict[int, str] = {}
        self.arm = ArmPlanner(arm, sample_profile)
        if service:
            from api.client.planner_client import PlannerClient

            self.client = PlannerClient(service, local_fallback=False)

    def submit(self, step: int, request: dict[str, Any]) -> None:
        if self.client is not None:
            self.ahead[step] = self.client.plan_ahead(request)
        else:
            self.ahead[step] = json.dumps(request)

    def get(self, step: int) -> dict[str, Any]:
        key = self.ahead.pop(step)
        if self.client is not None:
            doc = self.client.result(key, wait_ms=60_000)
            if doc.get("status") in ("pending", "failed", "error"):
                raise RuntimeError(f"plan {key} of step {step} is {doc.get('status')}: {doc.get('error') or doc}")
            return {**doc, "arm": "dhp", "execution": "packed"}
        return self.arm.plan(json.loads(key))

    def feedback(
        self, doc: dict[str, Any], measured: float, group_times: list[list[float]], step: int, new_groups: int
    ) -> bool:
        if self.client is None or "id" not in doc:
            return False
        answer = self.client.feedback(
            str(doc["id"]),
            measured,
            group_times_s=group_times,
            step=step,
            metrics={"new_groups": float(new_groups)},
            notes="trainer.train_hf",
        )
        return answer is not None


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--samples", type=int, default=8, help="samples per batch (default 8)")
    ap.add_argument("--shortest", type=int, default=8)
    ap.add_argument("--longest", type=int, default=192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scheme", choices=["ring", "ulysses"], default="ring")
    ap.add_argument("--dtype", choices=["float32", "float64", "bfloat16"], default="float32")
    ap.add_argument("--hidden", type=int, default=48)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument(
        "--heads", type=int, default=6, help="query heads (default 6: Ulysses works on groups of 1, 2, 3, 6)"
    )
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor-parallel size of the job's rank numbering (the model itself is replicated)",
    )
    ap.add_argument(
        "--pp", type=int, default=1, help="pipeline stages of the job's rank numbering (the model itself is replicated)"
    )
    ap.add_argument(
        "--profile",
        help="cost profile file for the planner (default: a rough built-in CPU profile); 'analytical' for the "
        "planner's analytical model; 'learned:NAME' for a profile the service refitted (with --service)",
    )
    ap.add_argument(
        "--capacity-tokens",
        type=int,
        default=96,
        help="tokens per rank per micro-batch the plan may use (default 96: long samples need groups)",
    )
    ap.add_argument("--budget-ms", type=int, default=300)
    ap.add_argument("--service", help="planning service URL; default: plan in this process")
    ap.add_argument(
        "--no-plan-ahead",
        dest="plan_ahead",
        action="store_false",
        help="ask for each step's plan when the step is about to run, not while the previous one trains "
        "(for timing on a machine whose cores the planner shares with the trainer)",
    )
    ap.add_argument(
        "--reference",
        action="store_true",
        help="rank 0 also trains a single-process copy on the whole batch and compares",
    )
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    ap.add_argument(
        "--ring-timeout", type=float, default=120.0, help="seconds a rank waits for a ring message before failing"
    )
    ap.add_argument(
        "--group-reuse",
        choices=["prefer", "only", "ignore"],
        default="prefer",
        help="how the planner treats the job's groups (default prefer)",
    )
    ap.add_argument(
        "--group-cost-s", type=float, help="seconds one new communicator costs (default: the pool's measured mean)"
    )
    ap.add_argument(
        "--no-precreate",
        dest="precreate",
        action="store_false",
        help="do not create the aligned power-of-two blocks at start",
    )
    ap.add_argument(
        "--arm",
        choices=list(ARMS),
        default="dhp",
        help="plan source and execution (default dhp; static, megatron, dhp-megatron: see the docstring)",
    )
    ap.add_argument(
        "--barrier-s",
        type=float,
        help="seconds of a barrier over the job for the per-sample profile (default: timed at start)",
    )
    ap.add_argument("--out", help="rank 0 writes the run's figures here as JSON")
    args = ap.parse_args(argv)
    for name in (
        "steps",
        "samples",
        "shortest",
        "longest",
        "hidden",
        "layers",
        "heads",
        "kv_heads",
        "tp",
        "pp",
        "budget_ms",
    ):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.longest < args.shortest:
        ap.error("--longest must be >= --shortest")
    if args.group_cost_s is not None and not (args.group_cost_s >= 0 and math.isfinite(args.group_cost_s)):
        ap.error("--group-cost-s must be a finite number >= 0")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        ap.error("--hidden must be a multiple of --heads, and --heads a multiple of --kv-heads")
    if args.service and args.arm != "dhp":
        ap.error(f"--service plans the dhp arm only; drop --service for --arm {args.arm}")
    special = args.profile == "analytical" or (args.profile or "").startswith("learned:")
    if special and args.arm != "dhp":
        ap.error(f"--profile {args.profile} plans the dhp arm only; give a profile file for --arm {args.arm}")
    if (args.profile or "").startswith("learned:") and not args.service:
        ap.error(f"--profile {args.profile} is read by the planning service: give --service URL too")
    if args.barrier_s is not None and not (args.barrier_s >= 0 and math.isfinite(args.barrier_s)):
        ap.error("--barrier-s must be a finite number >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from trainer import ring_attention
    from trainer.apply import apply_plan
    from trainer.group_pool import GroupPool, aligned_pow2_blocks
    from trainer.hf_adapter import HFCausalLM, model_document, reference_loss, tiny_llama
    from trainer.plan_sync import broadcast_plan
    from trainer.ranks import RankLayout
    from trainer.routing import PlanBatchSampler, SyntheticTokens, collate_samples
    from trainer.step import train_step

    if "RANK" not in os.environ:
        log("run me under torchrun, e.g. torchrun --nproc-per-node 4 -m trainer.train_hf")
        return 2
    torch.set_num_threads(1)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=max(60.0, args.ring_timeout)))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % (args.tp * args.pp):
        if rank == 0:
            log(f"--tp {args.tp} x --pp {args.pp} must divide the {world} processes")
        dist.destroy_process_group()
        return 2
    ring_attention.DEFAULT_TIMEOUT_S = args.ring_timeout
    dtype = getattr(torch, args.dtype)
    build = dict(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        intermediate_size=2 * args.hidden,
    )
    model = HFCausalLM(tiny_llama(args.seed, dtype, **build))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    ref_model = ref_opt = None
    if args.reference and rank == 0:
        ref_model = tiny_llama(args.seed, dtype, **build)
        ref_opt = torch.optim.SGD(ref_model.parameters(), lr=args.lr)
    lengths = {s: batch_lengths(s, args.samples, args.seed, args.shortest, args.longest) for s in range(args.steps)}
    dataset = SyntheticTokens(
        {k: v for batch in lengths.values() for k, v in batch.items()}, vocab=model.vocab, seed=args.seed
    )
    execution = ARMS[args.arm]
    sample_profile = None
    barrier_s = args.barrier_s
    if execution == "per-sample":
        from trainer.per_sample_costs import per_sample_profile, time_barrier

        if barrier_s is None:
            timed: list[Any] = [None] * world
            dist.all_gather_object(timed, time_barrier())
            barrier_s = max(timed)
        sample_profile = per_sample_profile(packed_profile(args), barrier_s)
    planner = Planner(args.service, args.arm, sample_profile) if rank == 0 else None
    doc_model = model_document(model.model)
    pool = GroupPool()
    layout = RankLayout(world // (args.tp * args.pp), args.tp, args.pp)
    known: dict[tuple[int, ...], None] = {}  # planner-rank groups the job holds
    if args.precreate and layout.domain_size >= 2:
        blocks = aligned_pow2_blocks(layout.domain_size)
        pool.ensure(layout.every_copy(blocks))
        known.update(dict.fromkeys(blocks))
    at_start = pool.stats.created
    copies = args.tp * args.pp

    def group_cost() -> float | None:
        mean = pool.mean_create_seconds()
        return None if mean is None else mean * copies

    works: list[Any] = []
    loader = iter(DataLoader(dataset, batch_sampler=PlanBatchSampler(works_iter(works)), collate_fn=collate_samples))  # type: ignore[arg-type]
    rows = []
    if planner is not None:
        planner.submit(0, make_request(lengths[0], args, doc_model, world, list(known), group_cost()))
    for step in range(args.steps):
        t_plan = time.perf_counter()
        doc = None
        if planner is not None:
            if step and not args.plan_ahead:
                planner.submit(step, make_request(lengths[step], args, doc_model, world, list(known), group_cost()))
            doc = planner.get(step)
            # The next request knows this step's groups too (they exist by the time it is applied).
            known.update(dict.fromkeys(tuple(sorted(c)) for c in doc.get("communicators", [])))
            if args.plan_ahead and step + 1 < args.steps:
                planner.submit(
                    step + 1, make_request(lengths[step + 1], args, doc_model, world, list(known), group_cost())
                )
        doc, digest = broadcast_plan(doc)
        plan_wait = time.perf_counter() - t_plan
        work = apply_plan(doc, rank, tensor_parallel=args.tp, pipeline_parallel=args.pp)
        works.append(work)
        samples = next(loader)
        created_before = pool.stats.created
        pool.ensure(work.communicators)
        pool.ensure(work.reduce_groups)
        new_groups = pool.stats.created - created_before
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        result = train_step(model, work, pool, samples, opt, execution=execution)
        mine = {
            "seconds": result.seconds,
            "mb": result.micro_batch_seconds,
            "digest": digest,
            "samples": len(samples),
            "barrier": result.barrier_seconds,
        }
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank != 0:
            continue
        measured = max(g["seconds"] for g in gathered)
        group_times = [
            [
                max(gathered[r]["mb"][m] for r in _globals(g["ranks"], args.tp, args.pp, doc["domain_size"]))
                for g in mb["groups"]
            ]
            for m, mb in enumerate(doc["micro_batches"])
        ]
        stored = planner.feedback(doc, measured, group_times, step, new_groups) if planner is not None else False
        row = {
            "step": step,
            "plan_id": doc.get("id"),
            "loss": result.loss,
            "digest": digest,
            "digests_equal": len({g["digest"] for g in gathered}) == 1,
            "predicted_s": doc.get("predicted_step_time_s"),
            "measured_s": measured,
            "plan_wait_s": plan_wait,
            "new_groups": new_groups,
            "samples_loaded": [g["samples"] for g in gathered],
            "batch_samples": len(lengths[step]),
            "feedback_stored": stored,
            "groups": [[g["ranks"] for g in mb["groups"]] for mb in doc["micro_batches"]],
        }
        # What the comparison of arms reads: the arm, the samples of each group, measured and predicted group times.
        row.update(
            arm=args.arm,
            execution=execution,
            barrier_s=max(g["barrier"] for g in gathered),
            sample_groups=[[g["samples"] for g in mb["groups"]] for mb in doc["micro_batches"]],
            group_times_s=group_times,
            group_predicted_s=[[g.get("predicted_time_s") for g in mb["groups"]] for mb in doc["micro_batches"]],
            verification=doc.get("verification"),
        )
        if ref_model is not None and ref_opt is not None:
            ref_opt.zero_grad(set_to_none=True)
            whole = {sid: dataset.tokens(sid) for sid in lengths[step]}
            row["reference_loss"] = reference_loss(ref_model, whole)
            ref_opt.step()
            row["loss_rel_diff"] = abs(row["reference_loss"] - result.loss) / max(abs(row["reference_loss"]), 1e-30)
        rows.append(row)
        log(
            f"[{args.arm}] step {step}: loss {result.loss:.6f}"
            + (f" (one process {row['reference_loss']:.6f})" if "reference_loss" in row else "")
            + f", groups {row['groups']}, predicted {row['predicted_s'] * 1000:.1f} ms, "
            f"measured {measured * 1000:.1f} ms, new groups {new_groups}, "
            f"samples loaded per rank {row['samples_loaded']} of {row['batch_samples']}, digest {digest[:12]}"
        )
    summary: dict[str, Any] = {}
    if rank == 0:
        summary = {
            "world": world,
            "steps": rows,
            "dtype": args.dtype,
            "scheme": args.scheme,
            "groups_created_at_start": at_start,
            "group_cost_s": group_cost(),
            "new_groups": sum(r["new_groups"] for r in rows),
        }
        summary.update(
            arm=args.arm,
            execution=execution,
            profile=requested_profile(args),
            sample_profile=sample_profile,
            barrier_s=barrier_s,
        )
        if ref_model is not None:
            with torch.no_grad():
                diffs = [
                    float((p - q).abs().max())
                    for p, q in zip(model.model.parameters(), ref_model.parameters(), strict=True)
                ]
            summary["max_parameter_diff"] = max(diffs)
            summary["max_loss_rel_diff"] = max(r["loss_rel_diff"] for r in rows)
            log(
                f"after {args.steps} steps: largest loss difference {summary['max_loss_rel_diff']:.2e} (relative), "
                f"largest parameter difference {summary['max_parameter_diff']:.2e}"
            )
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(summary, fh, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all(math.isfinite(r["loss"]) for r in rows) else 1


def works_iter(works: list[Any]) -> Any:
    """Yield each step's work as the loop appends it (the sampler is read one step at a time)."""
    i = 0
    while True:
        if i >= len(works):
            raise RuntimeError("the data loader was asked for a step whose plan has not arrived")
        yield works[i]
        i += 1


def _globals(ranks: list[int], tp: int, pp: int, domain: int) -> list[int]:
    from trainer.ranks import RankLayout

    layout = RankLayout(domain, tp, pp)
    return [layout.global_rank(r, t, s) for r in ranks for s in range(pp) for t in range(tp)]


if __name__ == "__main__":
    sys.exit(main())
