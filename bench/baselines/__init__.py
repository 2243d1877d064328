"""Baseline planners under the project's cost model: static as deployed and the bucket MILP, implemented from their
published descriptions, and Megatron-Core's own hybrid context-parallel scheduler (:mod:`bench.baselines.megatron_real`,
its code imported when megatron-core is installed).

Static at its best is :func:`optimizer.heuristic.static_layout.best_static` (reused, not duplicated here).
"""

from bench.baselines.bucket_milp import bucket_milp
from bench.baselines.megatron_real import megatron_plan
from bench.baselines.static_deployed import deployed_degree, static_deployed

__all__ = ["bucket_milp", "deployed_degree", "megatron_plan", "static_deployed"]
