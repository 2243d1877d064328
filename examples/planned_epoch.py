"""A training loop driven by a planned epoch: plan every step ahead, then train from the plan file
with no planner on the step's path.

    python examples/planned_epoch.py                      # 1 node x 2 ranks on CPU (gloo), 6 steps of 8 samples
    python examples/planned_epoch.py --nodes 2 --gpus-per-node 2 --steps 4 --sampler length-grouped

1. A token dataset of variable-length samples is written with its descriptors (``id``,
   ``text_tokens``) as JSONL, as a real job would describe its own data.
2. The epoch is planned with the jobs package (the same as ``dhp plan-epoch --dataset ...``) into a
   plan file (``plan.parquet`` + ``index.json``).
3. Every rank opens the plan file: a ``DataLoader`` with :func:`trainer.epoch_plan.planned_batch_sampler`
   hands it, step by step, the samples of its groups, and the sampler's work for that step says
   which group and which token ranges of each sample it holds (``trainer.step.train_step`` runs it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

PROFILE = {
    "time": {"quadratic": 2e-9, "linear": 2e-5, "sample_constant": 1e-4, "group_constant": 1e-3},
    "comm": {"scheme": "ring", "bytes_per_token": 256, "bandwidth_bytes_per_s": {"intra": 1e9, "inter": 1e9}},
    "capacity_tokens_per_rank": 600,
    "source": "example: a memory-tight profile of a CPU rank, so that samples over 600 tokens need a group of 2",
}
"""The cost profile the epoch is planned with (measure your own with ``dhp profile``)."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_dataset(n: int, seed: int, shortest: int, longest: int) -> dict[str, list[int]]:
    """Token ids of ``n`` samples, lengths log-uniform between the bounds."""
    rng = random.Random(seed)
    return {
        f"s{i}": [rng.randrange(96) for _ in range(int(round(shortest * (longest / shortest) ** rng.random())))]
        for i in range(n)
    }


def rank_loop(rank: int, world: int, plan_dir: str, tokens: dict[str, list[int]], cfg: Any) -> dict[str, Any]:
    """One rank's training loop over the planned epoch."""
    import torch

    from trainer.epoch_plan import planned_batch_sampler
    from trainer.group_pool import GroupPool
    from trainer.step import train_step
    from trainer.tiny_model import TinyTransformer

    torch.manual_seed(0)  # the same initial weights on every rank
    model = TinyTransformer(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    pool = GroupPool()
    ids = list(tokens)
    dataset = [torch.tensor(tokens[sid], dtype=torch.int64) for sid in ids]
    sampler = planned_batch_sampler(plan_dir, rank, ids)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=lambda rows: rows)
    losses, seconds = [], []
    for rows, step in zip(loader, sampler.works(), strict=True):
        samples = dict(zip(step.sample_ids, rows, strict=True))  # only the samples of this rank's groups
        optimizer.zero_grad()
        result = train_step(model, step.work, pool, samples, optimizer)
        losses.append(result.loss)
        seconds.append(result.seconds)
    return {"losses": losses, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--gpus-per-node", type=int, default=2, help="ranks per node (processes)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8, help="global batch size (samples per step)")
    ap.add_argument("--sampler", default="shuffle", choices=["sequential", "shuffle", "length-grouped"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="directory for the dataset and the plan file (default: a temporary one)")
    args = ap.parse_args(argv)

    import torch

    from jobs.engines import LocalEngine
    from jobs.epoch_summary import summary_text
    from jobs.runner import run_job
    from jobs.spec import job_from_json
    from jobs.steps import build_epoch
    from trainer.launch import spawn
    from trainer.tiny_model import TinyConfig

    torch.set_num_threads(1)
    cfg = TinyConfig(hidden=64, heads=4, layers=2, ffn_hidden=256)
    world = args.nodes * args.gpus_per_node
    work_dir = Path(args.out or tempfile.mkdtemp(prefix="dhp-epoch-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    tokens = make_dataset(args.steps * args.batch, args.seed, 32, 768)
    data = work_dir / "samples.jsonl"
    with data.open("w") as fh:
        for sid, ids in tokens.items():
            fh.write(json.dumps({"id": sid, "text_tokens": len(ids)}) + "\n")

    job = {
        "dataset": {"path": str(data)},
        "global_batch_size": args.batch,
        "sampler": {"kind": args.sampler, "seed": args.seed},
        "cluster": {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node},
        "model": cfg.model_document(),
        "profile": PROFILE,
    }
    result = run_job(build_epoch(job_from_json(job)), work_dir / "plan", LocalEngine(1))
    assert result.index is not None
    log(summary_text(result.index["summary"]))
    log(f"plan file: {work_dir / 'plan' / 'plan.parquet'}")

    ranks = spawn(rank_loop, world, str(work_dir / "plan"), tokens, cfg)
    predicted = [r["predicted_step_time_s"] for r in result.records]
    for step, loss in enumerate(ranks[0]["losses"]):
        same = all(abs(r["losses"][step] - loss) < 1e-9 for r in ranks)
        log(
            f"step {step}: loss {loss:.4f} (equal on all {world} ranks: {same}), "
            f"{max(r['seconds'][step] for r in ranks) * 1000:.0f} ms, predicted under the example profile "
            f"{predicted[step] * 1000:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
