"""Automatic refits (``DHP_REFIT_EVERY``, off by default): the profile of a run refitted from its feedback
while it trains.

After feedback with group times is stored for a plan, every ``refit_every``-th such step of the plan's
cluster, model and profile looks at their median step error (measured / predicted - 1 over those
steps). Above ``refit_error`` the profile is refitted over the newest ``max(refit_every, 50)`` steps and
stored as the next version of its key, on a thread of its own (the feedback's answer does not wait). A
request naming ``"learned:KEY"`` plans with the newest version, so a job that names its key follows the
refits. Every decision is logged (``dhp.profiles``): refitted, refused with the reason, or within the
threshold.
"""

from __future__ import annotations

import logging
import statistics
import threading

from api.service.problem_details import ServiceError
from api.service.routes.profiles import DEFAULT_LATEST, ProfileFitIn, store_fit
from api.store import Store
from api.store.learned_profiles import measured_steps, step_count
from api.store.repository import PlanRecord
from optimizer.errors import PlannerError

log = logging.getLogger("dhp.profiles")


class AutoRefit:
    """Decides after each stored feedback whether to refit (see the module docstring)."""

    def __init__(self, store: Store, every: int, threshold: float) -> None:
        self.store = store
        self.every = every
        self.threshold = threshold
        self._lock = threading.Lock()
        self._running: set[tuple[str | None, str | None, str]] = set()

    def after_feedback(self, record: PlanRecord, had_group_times: bool) -> threading.Thread | None:
        """Called once feedback for ``record`` is stored; the refit's thread when one starts."""
        if not self.every or not had_group_times:
            return None
        label = record.profile or "analytical"
        count = step_count(self.store, record.cluster, record.model, label)
        if count % self.every:
            return None
        recent = measured_steps(
            self.store, cluster=record.cluster, model=record.model, profile=label, latest=self.every
        )
        ratios = [abs(s.measured_step_time_s / s.predicted_step_time_s - 1) for s in recent if s.predicted_step_time_s]
        error = statistics.median(ratios) if ratios else 0.0
        where = f"{record.model} on {record.cluster} with {label[:60]!r}"
        if error <= self.threshold:
            log.info(
                "auto-refit: %s: median step error %.1f%% over %d steps is within %.1f%%; not refitted",
                where,
                100 * error,
                len(recent),
                100 * self.threshold,
            )
            return None
        key = (record.cluster, record.model, label)
        with self._lock:
            if key in self._running:
                log.info("auto-refit: %s: a refit is already running", where)
                return None
            self._running.add(key)
        thread = threading.Thread(target=self._refit, args=(key, where, error), name="dhp-auto-refit", daemon=True)
        thread.start()
        return thread

    def _refit(self, key: tuple[str | None, str | None, str], where: str, error: float) -> None:
        cluster, model, label = key
        try:
            body = ProfileFitIn.model_validate(
                {"cluster": cluster, "model": model, "profile": label, "latest": max(self.every, DEFAULT_LATEST)}
            )
            learned = store_fit(self.store, body)
            log.warning(
                'auto-refit: %s: median step error %.1f%% > %.1f%%; stored %s (plan with "profile": "learned:%s")',
                where,
                100 * error,
                100 * self.threshold,
                learned.name,
                learned.key,
            )
        except (PlannerError, ServiceError) as exc:
            log.warning(
                "auto-refit: %s: median step error %.1f%%, but the refit was refused: %s", where, 100 * error, exc
            )
        except Exception as exc:  # an automatic refit never takes the service down; the log keeps the reason
            log.exception("auto-refit: %s failed: %s", where, exc)
        finally:
            with self._lock:
                self._running.discard(key)
