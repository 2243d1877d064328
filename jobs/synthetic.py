"""A synthetic dataset for trying and measuring epoch jobs: samples of the seeded workloads of
:mod:`optimizer.problem.workloads`, mixed in a seeded order, with unique ids.

``python -m jobs.synthetic --workloads video,long-text --samples 1024000 --seed 0 --out data.parquet``
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from jobs.dataset import write_jsonl, write_parquet
from optimizer.problem.workloads import WORKLOADS


def synthetic_samples(workloads: list[str], n: int, seed: int = 0, chunk: int = 4096) -> list[dict[str, Any]]:
    """``n`` samples, an equal share of each workload (generated in chunks of ``chunk`` with
    their own seeds), shuffled."""
    out: list[dict[str, Any]] = []
    share = [n // len(workloads) + (1 if k < n % len(workloads) else 0) for k in range(len(workloads))]
    for k, (name, count) in enumerate(zip(workloads, share, strict=True)):
        for c, start in enumerate(range(0, count, chunk)):
            out.extend(WORKLOADS[name](min(chunk, count - start), seed=seed * 1_000_003 + k * 10_007 + c)["samples"])
    order = np.random.default_rng(seed).permutation(len(out))
    samples = [out[i] for i in order]
    for row, s in enumerate(samples):
        s["id"] = f"{s['id'][0]}{row}"
    return samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.synthetic", description=__doc__)
    ap.add_argument("--workloads", default="video,long-text", help=f"comma-separated, of {sorted(WORKLOADS)}")
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="a .jsonl or .parquet file")
    args = ap.parse_args(argv)
    names = args.workloads.split(",")
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; choose from {sorted(WORKLOADS)}")
    samples = synthetic_samples(names, args.samples, args.seed)
    (write_parquet if args.out.endswith(".parquet") else write_jsonl)(args.out, samples)
    print(f"wrote {len(samples)} samples to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
