"""Baseline planners, implemented from their published descriptions under the project's cost model.

Static at its best is :func:`optimizer.heuristic.static_layout.best_static` (reused, not duplicated here).
"""

from bench.baselines.bucket_milp import bucket_milp
from bench.baselines.megatron_dcp import megatron_dcp
from bench.baselines.static_deployed import deployed_degree, static_deployed

__all__ = ["bucket_milp", "deployed_degree", "megatron_dcp", "static_deployed"]
