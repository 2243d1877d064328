"""Prometheus metrics of the service.

With one process the metrics live in the app's own registry. With several worker processes
(``dhp serve --workers N``) ``PROMETHEUS_MULTIPROC_DIR`` is set before the workers start, every
process writes its values to files there, and /metrics sums them across processes.
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RATIO_BUCKETS = (0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0)
GAP_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    """The service's instruments, registered in one registry per app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_latency = Histogram(
            "dhp_http_request_duration_seconds",
            "HTTP request latency from arrival to the last byte",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.solve_latency = Histogram(
            "dhp_solve_duration_seconds",
            "planner wall time per solve",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.gap = Histogram(
            "dhp_plan_gap",
            "relative gap of returned plans to their lower bound",
            ["backend"],
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.fallbacks = Counter(
            "dhp_solver_fallbacks_total", "solves that fell back to the heuristic plan", ["backend"], registry=r
        )
        self.cache_hits = Counter("dhp_plan_cache_hits_total", "plan requests answered from the plan cache", registry=r)
        self.rejected = Counter(
            "dhp_rejected_total", "plan requests refused with 503 because the service was at capacity", registry=r
        )
        self.late_starts = Counter(
            "dhp_late_starts_total",
            "admitted solves a worker took after their deadline (solved with what was left)",
            registry=r,
        )
        self.failures = Counter(
            "dhp_plan_failures_total", "plan requests that ended in a domain error", ["kind"], registry=r
        )
        self.prediction_ratio = Histogram(
            "dhp_measured_over_predicted",
            "measured / predicted step time of the feedback received (1 = exact prediction)",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "dhp_solve_queue_depth", "admitted solves waiting for a worker", registry=r, multiprocess_mode="livesum"
        )
        self.in_flight = Gauge("dhp_solves_in_flight", "solves running now", registry=r, multiprocess_mode="livesum")

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition format of every metric (summed over processes in multiprocess mode)."""
        path = multiprocess_dir()
        if path:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=path)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
