"""Plan an epoch on a Ray cluster of several nodes simulated on this machine (Ray's own
``ray.cluster_utils.Cluster``: a head and worker nodes, each a raylet on loopback), to check and
time the multi-node path without a real cluster.

    python -m bench.ray_cluster --nodes 2 --cpus-per-node 1 --out DIR -- <dhp plan-epoch flags>

The flags after ``--`` are those of ``dhp plan-epoch`` (without --engine, --address and --out);
the job runs with ``--engine ray --address <the simulated cluster>``, and the index's
``run.steps_by_worker`` shows how many steps each node planned.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    split = args_in.index("--") if "--" in args_in else len(args_in)
    ap = argparse.ArgumentParser(
        prog="python -m bench.ray_cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the simulated cluster (the head included)")
    ap.add_argument("--cpus-per-node", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(args_in[:split])
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus_per_node, "include_dashboard": False})
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=args.cpus_per_node)
        cluster.wait_for_nodes()
        print(
            f"simulated Ray cluster at {cluster.address}: {args.nodes} nodes x {args.cpus_per_node} CPU",
            file=sys.stderr,
        )
        flags = [*args_in[split + 1 :], "--engine", "ray", "--address", cluster.address, "--out", args.out]
        code = subprocess.run([sys.executable, "-m", "api.cli.main", "plan-epoch", *flags], env=os.environ).returncode
    finally:
        ray.shutdown()
        cluster.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
