"""What every plan costs on this machine before any optional work, and the least budget a batch needs.

Some work is part of every answer, whatever the budget: the cost tables and their time matrices,
the cheapest lower bound (:func:`optimizer.bounds.lower_bounds.quick_bound_parts`), the heuristic's
first plan, building the plan and verifying it. The rest (the tighter bounds, the static layout's
comparison, the heuristic's further strategies, the group-size LP, an exact backend) runs only in
the time left, and steps aside with its reason in the plan when there is none.

The fixed work grows with the batch: per sample (the tables, the first plan, building, verifying),
per slot (a rank in one micro-batch: each free rank of a micro-batch is a group of its own while
planning, so memory-bound batches of many micro-batches cost more per sample), per cell of the time
matrices (samples x allowed group sizes, two placements per GPU speed) and by a constant per call.
The rates are measured on the running machine: :func:`calibrate` plans three calibration batches
phase by phase, a few times each, and keeps each phase's fastest run (the machine's own speed: a
busy moment while measuring must not make the planner refuse batches later). It runs once per
process, within the warm-up (:mod:`planning.warm`), before any budget's clock starts, or on the
first estimate asked for outside a planning process; later processes of the same machine and code
read them from disk (:mod:`planning.rates_cache`).

:func:`estimate_ms` is the fixed work expected for a batch of n samples on r ranks, and
:func:`minimum_budget_ms` the least budget that can hold it (LOW_SHARE of the estimate): the planner
refuses a budget below that at once (:func:`planning.planner.plan`), and the service adds it to the
time it reserves for its own work. :func:`phase_ms` estimates the phases the planner decides on
(:mod:`planning.budget_policy` turns the estimates into the phases' instants).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from optimizer import jit
from optimizer.gc_pause import collector_paused
from optimizer.problem.degrees import DENSE_SIZES, allowed_degrees
from optimizer.problem.problem import Problem
from planning import rates_cache

CALIBRATION_RANKS = 256
CALIBRATION_SAMPLES = (512, 4096)
"""The calibration batches, on 32 nodes of 8 H100s (qwen2-vl-7b): CALIBRATION_SAMPLES[0] short samples
for the constant, then CALIBRATION_SAMPLES[1] short ones (200 to 3,200 tokens: few micro-batches)
and as many long ones (2,000 to 14,000 tokens and one of 100,000 in every 61, like long-tail video:
memory-bound, many micro-batches, as large batches are); the two separate the per-sample from the
per-slot rate."""
CALIBRATION_REPEATS = 3
"""Runs of each calibration batch; the fastest counts (at least 2: a first run may load kernels)."""
LOW_SHARE = 0.7
"""The least share of the estimate a batch's fixed work takes: :func:`minimum_budget_ms` is this share
of :func:`estimate_ms`. The rates are fitted on three batches; over video, long text, image SFT and
mixed batches of 2,048 to 65,536 samples on 64 to 1,024 ranks the fixed work measured from 0.8 to 1.5
times the estimate on the shared 2-core development machine (more above it at 65,536 samples, where
the tables outgrow the caches), and estimates in separate processes differed by up to 20%."""
HEADROOM = 1.5
"""The budget a refusal suggests: this many times the estimate (timings on a shared machine vary: the
fixed work measured up to 1.5 times the estimate, see LOW_SHARE)."""


@dataclass(frozen=True)
class PhaseTimes:
    """Milliseconds of each phase of one plan of a problem, measured by :func:`time_phases`."""

    tables: float  # the cost tables, their time matrices aside
    matrices: float  # the time matrices every plan reads (CostTables.prepare)
    cells: int  # their cells (samples x sizes x matrices)
    quick_bound: float  # the cheapest valid bound
    tight_bound: float  # every bound of optimizer.bounds.lower_bounds
    heuristic: float  # the heuristic's first plan (no time for more), aligned and evaluated
    static: float  # the best static layout
    build: float
    verify: float


@dataclass(frozen=True)
class Rates:
    """The fixed work's rates on this machine, in milliseconds (see the module docstring)."""

    base_ms: float  # per call
    sample_ms: float  # per sample: tables, cheapest bound, first plan, building and verifying
    slot_ms: float  # per rank and micro-batch
    cell_ms: float  # per time-matrix cell
    finish_ms: float  # per sample: building and verifying alone (the work after the heuristic)
    static_ms: float  # per sample: the static layout's comparison
    tight_bound_ms: float  # per sample: the tighter bounds


def time_phases(problem: Problem) -> PhaseTimes:
    """Plan ``problem`` phase by phase as the planner does when no time is left for optional work
    (the optional phases timed too, apart), and return what each phase took."""
    with collector_paused():  # as the planner plans
        return _time_phases(problem)


def _time_phases(problem: Problem) -> PhaseTimes:
    from optimizer.bounds.lower_bounds import bound_parts, quick_bound_parts
    from optimizer.costs.tables import CostTables
    from optimizer.heuristic.static_layout import best_static
    from optimizer.heuristic.strategies import heuristic_plan
    from optimizer.plan.aligned import align_blocks
    from optimizer.plan.evaluate import assignment_step_time, build_plan
    from optimizer.plan.records import SolverStats
    from optimizer.verify.verifier import verify

    clock = time.perf_counter
    marks = [clock()]
    tables = CostTables.build(problem)
    marks.append(clock())
    cells = tables.prepare()
    marks.append(clock())
    bound = max(quick_bound_parts(tables).values())
    marks.append(clock())
    max(bound_parts(tables).values())
    marks.append(clock())
    assignment = align_blocks(tables, heuristic_plan(tables, deadline=clock(), bound=bound))
    step = assignment_step_time(tables, assignment)
    marks.append(clock())
    best_static(tables)
    marks.append(clock())
    result = build_plan(
        tables,
        assignment,
        SolverStats(backend="heuristic", status="heuristic", wall_ms=0.0, objective_s=step, bound_s=bound),
        bound,
    )
    marks.append(clock())
    verify(result, problem).raise_if_failed()
    marks.append(clock())
    ms = [(b - a) * 1000.0 for a, b in zip(marks, marks[1:], strict=False)]
    return PhaseTimes(
        tables=ms[0],
        matrices=ms[1],
        cells=cells,
        quick_bound=ms[2],
        tight_bound=ms[3],
        heuristic=ms[4],
        static=ms[5],
        build=ms[6],
        verify=ms[7],
    )


@dataclass(frozen=True)
class Calibration:
    """One calibration batch's fastest phase times, with its size."""

    samples: int
    slots: int  # ranks x the fewest micro-batches memory allows
    phases: PhaseTimes

    @property
    def fixed_ms(self) -> float:
        """The fixed work, its time matrices aside."""
        p = self.phases
        return p.tables + p.quick_bound + p.heuristic + p.build + p.verify


def calibration_problems() -> tuple[Problem, Problem, Problem]:
    """The calibration batches (see CALIBRATION_SAMPLES): small, large and long, large and short."""
    from optimizer.problem.documents import problem_from_json

    def problem(n: int, long: bool) -> Problem:
        if long:
            tokens = [2000 + (i * 7919) % 12_000 + (100_000 if i % 61 == 0 else 0) for i in range(n)]
        else:
            tokens = [200 + (i * 7919) % 3000 for i in range(n)]
        return problem_from_json(
            {
                "cluster": {"nodes": CALIBRATION_RANKS // 8, "gpus_per_node": 8},
                "model_preset": "qwen2-vl-7b",
                "batch": {"samples": [{"id": f"c{i}", "text_tokens": t} for i, t in enumerate(tokens)]},
                "options": {"backend": "heuristic"},
            }
        )

    small, large = CALIBRATION_SAMPLES
    return problem(small, False), problem(large, True), problem(large, False)


def rates_from(small: Calibration, slotted: Calibration, light: Calibration) -> Rates:
    """The rates fitted to three calibrations: ``slotted`` and ``light`` of one size and different
    slots give the per-slot rate; the line from ``small`` to ``light`` (slots taken out) the
    per-sample rate and the constant; the other phases are per sample of ``slotted``."""
    slot_ms = max(0.0, (slotted.fixed_ms - light.fixed_ms) / max(1, slotted.slots - light.slots))
    light_ms, small_ms = light.fixed_ms - slot_ms * light.slots, small.fixed_ms - slot_ms * small.slots
    sample_ms = max(0.0, (light_ms - small_ms) / max(1, light.samples - small.samples))
    p, n = slotted.phases, slotted.samples
    return Rates(
        base_ms=max(0.0, small_ms - sample_ms * small.samples),
        sample_ms=sample_ms,
        slot_ms=slot_ms,
        cell_ms=p.matrices / max(1, p.cells),
        finish_ms=(p.build + p.verify) / n,
        static_ms=p.static / n,
        tight_bound_ms=p.tight_bound / n,
    )


def _fastest(runs: list[PhaseTimes]) -> PhaseTimes:
    fields = PhaseTimes.__dataclass_fields__
    return PhaseTimes(**{name: min(getattr(r, name) for r in runs) for name in fields})  # type: ignore[arg-type]


def calibrate(repeats: int = CALIBRATION_REPEATS) -> Rates:
    """Measure the rates on this machine (see the module docstring) and keep them for this process. They are
    the compiled kernels' rates (:mod:`optimizer.jit`), which every batch but a small one runs."""
    global _rates
    jit.load()
    measured = []
    for problem in calibration_problems():
        slots = problem.cluster.domain_size * fewest_micro_batches(problem)
        measured.append(
            Calibration(len(problem.batch), slots, _fastest([time_phases(problem) for _ in range(repeats)]))
        )
    found = rates_from(*measured)
    with _lock:
        _rates = found
    return found


_lock = threading.Lock()
_measuring = threading.Lock()
_rates: Rates | None = None
_override: Rates | None = None


UNMEASURED = Rates(
    base_ms=0.0, sample_ms=0.0, slot_ms=0.0, cell_ms=0.0, finish_ms=0.0, static_ms=0.0, tight_bound_ms=0.0
)
"""The rates when measuring failed (the error is :data:`last_error`): no budget is refused and nothing
is kept back but constants."""
last_error: str | None = None


def rates() -> Rates:
    """This process's rates: the override of :func:`fixed_rates` when one is active, else those
    measured here (on the first call: the warm-up's end, or its first plan when that asks first;
    the first run of each calibration batch loads its kernels, and only the fastest run counts)."""
    global _rates, last_error
    if _override is not None:
        return _override
    if _rates is None:
        with _measuring:
            if _rates is None:
                _rates = rates_cache.load(Rates)
            if _rates is None:
                try:
                    rates_cache.store(calibrate())
                except Exception as exc:  # noqa: BLE001 - planning goes on without a measurement
                    last_error = f"{type(exc).__name__}: {exc}"
                    _rates = UNMEASURED
    assert _rates is not None
    return _rates


@contextmanager
def fixed_rates(value: Rates) -> Iterator[Rates]:
    """Use ``value`` instead of the measured rates within the block (figures that do not depend on
    the machine: for tests, and for embedders that measure elsewhere)."""
    global _override
    before = _override
    _override = value
    try:
        yield value
    finally:
        _override = before


def minimum_budget_ms(
    n_samples: int,
    n_ranks: int,
    backend: str = "heuristic",
    *,
    sizes: int | None = None,
    speeds: int = 1,
    micro_batches: int = 1,
) -> float:
    """Milliseconds this machine needs at least to answer for a batch of ``n_samples`` samples on
    ``n_ranks`` ranks: LOW_SHARE of :func:`estimate_ms`, the fixed work at the rates measured here.
    A budget below it cannot be kept whatever is skipped; the planner refuses it at once.

    ``sizes`` (allowed group sizes), ``speeds`` (GPU speeds of the cluster) and ``micro_batches``
    (the fewest memory allows) refine the figure when known (:func:`problem_budget_ms` fills them
    from a problem); their defaults undercount. Every ``backend`` needs the same: an exact backend
    runs only in the time left after the heuristic's plan and steps aside when there is none.
    """
    return LOW_SHARE * estimate_ms(n_samples, n_ranks, backend, sizes=sizes, speeds=speeds, micro_batches=micro_batches)


def estimate_ms(
    n_samples: int,
    n_ranks: int,
    backend: str = "heuristic",
    *,
    sizes: int | None = None,
    speeds: int = 1,
    micro_batches: int = 1,
) -> float:
    """The fixed work of the module docstring for a batch of this size, at the measured rates
    (arguments as for :func:`minimum_budget_ms`; the default ``sizes`` are the dense sizes up to
    DENSE_SIZES, which every size policy but ``pow2`` and ``aligned`` allows)."""
    del backend  # the same fixed work for every backend (see minimum_budget_ms)
    r = rates()
    d = min(n_ranks, DENSE_SIZES) if sizes is None else sizes
    cells = n_samples * d * 2 * (2 if speeds > 1 else 1)
    return r.base_ms + r.sample_ms * n_samples + r.slot_ms * n_ranks * max(1, micro_batches) + r.cell_ms * cells


def fewest_micro_batches(problem: Problem) -> int:
    """The fewest micro-batches the batch's tokens need at every rank's capacity (1 under the
    per-sample memory rule, where a micro-batch's tokens do not bind)."""
    if problem.options.memory == "sample":
        return 1
    profile = problem.cost_profile
    capacity = [profile.capacity_for(node.gpu.name) for node in problem.cluster.nodes]
    held = sum(capacity[node] for node in problem.cluster.rank_node)
    return max(1, min(problem.options.micro_batch_limit, math.ceil(sum(problem.batch.lengths) / max(held, 1.0))))


def problem_budget_ms(problem: Problem) -> float:
    """:func:`minimum_budget_ms` of ``problem``: its allowed sizes, GPU speeds and fewest micro-batches."""
    n, r, backend, size = _problem_size(problem)
    return minimum_budget_ms(n, r, backend, **size)


def problem_estimate_ms(problem: Problem) -> float:
    """:func:`estimate_ms` of ``problem`` (see :func:`problem_budget_ms`)."""
    n, r, backend, size = _problem_size(problem)
    return estimate_ms(n, r, backend, **size)


def _problem_size(problem: Problem) -> tuple[int, int, str, dict[str, int]]:
    speeds = {problem.cost_profile.speed_for(node.gpu.name) for node in problem.cluster.nodes}
    size = {
        "sizes": len(allowed_degrees(problem)),
        "speeds": len(speeds),
        "micro_batches": fewest_micro_batches(problem),
    }
    return len(problem.batch), problem.cluster.domain_size, problem.options.backend, size


def phase_ms(phase: str, n_samples: int) -> float:
    """Milliseconds a phase is expected to take on a batch of ``n_samples`` samples here: ``plan``
    (the fixed work after the tables: the cheapest bound, the first plan, building, verifying),
    ``finish`` (building and verifying alone), ``static`` (the static layout's comparison) or
    ``tight_bound`` (the tighter bounds)."""
    r = rates()
    if phase == "plan":
        return r.base_ms + r.sample_ms * n_samples
    per_sample = {"static": r.static_ms, "tight_bound": r.tight_bound_ms, "finish": r.finish_ms}[phase]
    return per_sample * n_samples


def suggested_budget_ms(expected_ms: float) -> int:
    """The budget to ask for when the fixed work is expected to take ``expected_ms``: HEADROOM times
    it, rounded up to 10 ms."""
    return int(math.ceil(expected_ms * HEADROOM / 10.0) * 10)


def describe() -> dict[str, Any]:
    """The rates in use, for reports (``bench.scaling`` prints them)."""
    r = rates()
    return {name: getattr(r, name) for name in Rates.__dataclass_fields__}
